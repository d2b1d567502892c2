"""The front's choice of server: conversation affinity, longest cached prefix, least loaded, health."""

from __future__ import annotations

from llamaserve.scale.balancer import OVERLOAD_SLACK, Balancer, NoMember
from llamaserve.scale.prefix_index import BLOCK, PrefixIndex, block_hashes, prompt_text

A, B = "http://a:8080", "http://b:8080"


def _chat(*turns: str) -> list[bytes]:
    messages = [{"role": "system", "content": "You help with gardening. " * 20}]
    messages += [{"role": "user", "content": t} for t in turns]
    return block_hashes(prompt_text({"messages": messages, "temperature": 0}))


def test_a_conversation_s_next_turn_extends_its_prefix() -> None:
    one, two = _chat("How do I plant roses?"), _chat("How do I plant roses?", "And tulips?" * 40)
    assert len(one) >= 2 and two[: len(one)] == one
    other = block_hashes(prompt_text({"messages": [{"role": "system", "content": "You fix bikes. " * 40}]}))
    assert other[0] != one[0]
    assert block_hashes("x" * (BLOCK - 1)) == []  # a partial block is not hashed


def test_the_index_knows_the_longest_prefix_it_was_sent() -> None:
    index = PrefixIndex(capacity=1000)
    first = _chat("How do I plant roses?")
    index.add(first)
    longer = _chat("How do I plant roses?", "More please." * 50)
    assert index.match(longer) == len(first)
    # Same system text, another question: only the blocks of the shared beginning count.
    assert index.match(_chat("Something else entirely." * 30)) == 2
    assert index.match(block_hashes(prompt_text({"prompt": "Unrelated. " * 60}))) == 0
    small = PrefixIndex(capacity=2)
    small.add(first)
    assert len(small) == 2 and small.match(first) == len(first)  # the last blocks stay: they stand for all


def test_prefix_wins_then_load_decides() -> None:
    balancer = Balancer([A, B])
    first = balancer.choose(_chat("Roses?"))
    assert first.reason == "load"
    again = balancer.choose(_chat("Roses?", "And tulips?"))
    assert again.reason == "prefix" and again.member is first.member
    fresh = block_hashes(prompt_text({"prompt": "Completely unrelated text. " * 30}))
    balancer.started(first.member)
    assert balancer.choose(fresh).member is not first.member  # the idle one


def test_an_overloaded_server_loses_its_prefix_and_session() -> None:
    balancer = Balancer([A, B])
    home = balancer.choose(_chat("Roses?"), session="s1").member
    for _ in range(OVERLOAD_SLACK + 1):
        balancer.started(home)
    choice = balancer.choose(_chat("Roses?", "More?"), session="s1")
    assert choice.member is not home and choice.reason == "load"


def test_sessions_and_stored_responses_stick() -> None:
    balancer = Balancer([A, B])
    home = balancer.choose([], session="s1").member
    for _ in range(3):
        assert balancer.choose([], session="s1").member is home
    balancer.record_response("resp_1", B)
    assert balancer.choose([], previous_response="resp_1").member.url == B
    assert balancer.owner_of_response("resp_1") is balancer.members[B]


def test_an_unhealthy_server_is_left_out_and_forgets_its_cache() -> None:
    balancer = Balancer([A, B])
    hashes = _chat("Roses?")
    home = balancer.choose(hashes).member
    balancer.set_health(home.url, False)
    other = balancer.choose(hashes).member
    assert other is not home
    balancer.set_health(home.url, True)
    assert home.index.match(hashes) == 0
    balancer.set_health(A, False)
    balancer.set_health(B, False)
    try:
        balancer.choose(hashes)
    except NoMember:
        pass
    else:
        raise AssertionError("a choice with no healthy server")
