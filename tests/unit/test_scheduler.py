"""Scheduler behaviour with a fake runner: admission, batching, abort, cache, stops."""

from __future__ import annotations

from llamaserve.engine.kv.slot import SlotState, common_prefix_length
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, Failed, Finished, GenerationRequest, TextDelta

from .fake_runner import EOG, FakeRunner


class Collector:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, events: list[Event]) -> None:
        self.events.extend(events)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta))

    @property
    def finished(self) -> Finished | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Finished) else None

    @property
    def failed(self) -> Failed | None:
        last = self.events[-1] if self.events else None
        return last if isinstance(last, Failed) else None


def make(n_slots: int = 4, **kw: int) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(n_seq_max=n_slots, **kw)
    return Scheduler(runner, n_slots), runner


def submit(s: Scheduler, prompt: list[int], **kw: object) -> tuple[int, Collector]:
    c = Collector()
    tid = s.next_task_id()
    s.submit(tid, GenerationRequest(prompt_tokens=prompt, **kw), c)  # type: ignore[arg-type]
    return tid, c


def run_until_idle(s: Scheduler, max_steps: int = 1000) -> int:
    steps = 0
    s._drain_inbox(block=False)
    while s._has_work() and steps < max_steps:
        s._step()
        steps += 1
    return steps


def test_requests_beyond_the_slots_wait_then_run() -> None:
    s, runner = make(n_slots=2)
    runner.scripts = {(1,): [5, EOG], (2,): [6, EOG], (3,): [8, EOG]}
    cs = [submit(s, [p])[1] for p in (1, 2, 3)]
    s._drain_inbox(block=False)
    s._step()
    assert s.stats.requests_deferred == 1
    assert sum(1 for sl in s.slots if sl.busy) == 2
    run_until_idle(s)
    assert [c.text for c in cs] == ["<5>", "<6>", "<8>"]
    assert all(c.finished is not None and c.finished.stop_type == "eos" for c in cs)


def test_one_decode_carries_every_generating_slot_and_prefill_chunks_within_budget() -> None:
    s, runner = make(n_slots=3, n_batch=16)
    runner.scripts = {(1,): [5] * 10 + [EOG], (2,): [6] * 10 + [EOG]}
    submit(s, [1])
    submit(s, [2])
    s._drain_inbox(block=False)
    s._step()  # both short prompts prefilled in one decode
    assert len(runner.plans[-1]) == 2
    long_prompt = [9] + list(range(100, 139))  # 40 tokens
    submit(s, long_prompt, n_predict=2)
    run_until_idle(s)
    for plan in runner.plans:
        assert sum(len(r.tokens) for r in plan) <= 16
    # while the long prompt was being prefilled, the two generating slots kept decoding
    mixed = [
        p for p in runner.plans if any(len(r.tokens) > 1 for r in p) and sum(1 for r in p if len(r.tokens) == 1) == 2
    ]
    assert mixed, "prefill chunks should share decodes with generating slots"
    assert sum(len(r.tokens) for p in runner.plans for r in p if r.seq_id == 2 and r.start_pos < 40) == 40


def test_abort_frees_the_slot_during_prefill_and_generation() -> None:
    s, _runner = make(n_slots=1, n_batch=4)
    tid, c = submit(s, list(range(10, 30)))
    s._drain_inbox(block=False)
    s._step()
    assert s.slots[0].state is SlotState.PREFILL
    s.abort(tid)
    s._step()
    assert not s.slots[0].busy
    assert c.finished is not None and c.finished.stop_type == "abort"
    tid2, _c2 = submit(s, [3])
    s._drain_inbox(block=False)
    s._step()
    s._step()
    assert s.slots[0].state is SlotState.GENERATING
    s.abort(tid2)
    s._step()
    assert not s.slots[0].busy


def test_prompt_cache_reuses_the_longest_common_prefix() -> None:
    s, runner = make(n_slots=2)
    runner.scripts = {}
    a = list(range(100, 120))
    _, c1 = submit(s, a, n_predict=2)
    run_until_idle(s)
    assert c1.finished is not None and c1.finished.n_cached == 0
    b = a[:15] + [500, 501, 502]
    _, c2 = submit(s, b, n_predict=2)
    run_until_idle(s)
    assert c2.finished is not None
    assert c2.finished.n_cached == 15
    assert c2.finished.timings.prompt_n == 3
    # the same slot was chosen, and its tail past the common prefix was removed
    assert c2.finished.id_slot == c1.finished.id_slot
    assert (c1.finished.id_slot, 15, -1) in runner.removed


def test_identical_prompt_recomputes_only_the_last_token() -> None:
    s, _ = make(n_slots=1)
    p = list(range(50, 60))
    submit(s, p, n_predict=1)
    run_until_idle(s)
    _, c = submit(s, p, n_predict=1)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_cached == 9


def test_cache_prompt_false_decodes_everything() -> None:
    s, _ = make(n_slots=1)
    p = list(range(50, 60))
    submit(s, p, n_predict=1)
    run_until_idle(s)
    _, c = submit(s, p, n_predict=1, cache_prompt=False)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_cached == 0


def test_least_recently_used_slot_when_no_prefix_matches() -> None:
    s, _ = make(n_slots=2)
    _, c1 = submit(s, [11, 12], n_predict=1)
    run_until_idle(s)
    _, c2 = submit(s, [21, 22], n_predict=1)
    run_until_idle(s)
    assert c1.finished is not None and c2.finished is not None
    assert c1.finished.id_slot != c2.finished.id_slot


def test_stop_string_split_across_tokens_is_never_emitted() -> None:
    pieces = {20: b"Hel", 21: b"lo ", 22: b"wor", 23: b"ld!"}
    s, runner = make(n_slots=1, pieces=pieces)
    runner.scripts = {(1,): [20, 21, 22, 23, EOG]}
    _, c = submit(s, [1], stop=("o wo",))
    run_until_idle(s)
    assert c.text == "Hell"
    assert c.finished is not None
    assert c.finished.stop_type == "word" and c.finished.stopping_word == "o wo"
    # no partial of the stop string ever left: "Hello" was held back while "o" might begin it
    deltas = [e.text for e in c.events if isinstance(e, TextDelta)]
    assert "o" not in "".join(deltas)


def test_held_back_prefix_is_released_when_the_stop_does_not_follow() -> None:
    pieces = {20: b"ab", 21: b"c", 22: b"d"}
    s, runner = make(n_slots=1, pieces=pieces)
    runner.scripts = {(1,): [20, 21, 22, EOG]}
    _, c = submit(s, [1], stop=("bcx",))
    run_until_idle(s)
    assert c.text == "abcd"
    assert c.finished is not None and c.finished.stop_type == "eos"


def test_utf8_split_across_tokens_is_emitted_whole() -> None:
    emoji = "😀".encode()
    pieces = {30: emoji[:1], 31: emoji[1:3], 32: emoji[3:], 33: b"!"}
    s, runner = make(n_slots=1, pieces=pieces)
    runner.scripts = {(1,): [30, 31, 32, 33, EOG]}
    _, c = submit(s, [1])
    run_until_idle(s)
    deltas = [e.text for e in c.events if isinstance(e, TextDelta)]
    assert "".join(deltas) == "😀!"
    assert all("\ufffd" not in d for d in deltas)


def test_limit_mid_character_drops_the_incomplete_bytes() -> None:
    emoji = "😀".encode()
    pieces = {40: b"ok", 30: emoji[:2]}
    s, runner = make(n_slots=1, pieces=pieces)
    runner.scripts = {(1,): [40, 30, 30]}
    _, c = submit(s, [1], n_predict=2)
    run_until_idle(s)
    assert c.text == "ok"
    assert c.finished is not None and c.finished.stop_type == "limit" and c.finished.n_predicted == 2


def test_prompt_longer_than_the_slot_context_fails_clearly() -> None:
    s, _ = make(n_slots=1, n_ctx_seq=32)
    _, c = submit(s, list(range(100, 140)))
    run_until_idle(s)
    assert c.failed is not None
    assert c.failed.kind == "exceed_context_size_error"
    assert c.failed.extra == {"n_prompt_tokens": 40, "n_ctx": 32}


def test_generation_stops_when_the_slot_context_is_full() -> None:
    s, _ = make(n_slots=1, n_ctx_seq=32)
    _, c = submit(s, list(range(100, 120)))
    run_until_idle(s)
    assert c.finished is not None and c.finished.stop_type == "limit"
    assert c.finished.n_prompt_tokens + c.finished.n_predicted <= 32


def test_a_failed_decode_fails_its_requests_and_the_scheduler_goes_on() -> None:
    s, runner = make(n_slots=1)
    runner.fail_next = True
    _, c = submit(s, [1, 2, 3])
    run_until_idle(s)
    assert c.failed is not None and c.failed.status == 500
    _, c2 = submit(s, [1, 2, 3], n_predict=2)
    run_until_idle(s)
    assert c2.finished is not None and c2.finished.n_predicted == 2


def test_pinned_slot_waits_for_that_slot() -> None:
    s, _ = make(n_slots=2)
    _, c1 = submit(s, [1], n_predict=3, id_slot=1)
    _, c2 = submit(s, [2], n_predict=3, id_slot=1)
    run_until_idle(s)
    assert c1.finished is not None and c2.finished is not None
    assert c1.finished.id_slot == 1 and c2.finished.id_slot == 1


def test_common_prefix_length() -> None:
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length(list(range(1000)), list(range(999)) + [0]) == 999
    assert common_prefix_length([5], [6]) == 0


def test_scheduler_thread_serves_and_stops() -> None:
    import threading

    s, runner = make(n_slots=2)
    runner.scripts = {(1,): [5, EOG]}
    done = threading.Event()
    got: list[Event] = []

    def sink(events: list[Event]) -> None:
        got.extend(events)
        if any(isinstance(e, Finished) for e in events):
            done.set()

    s.start()
    s.submit(s.next_task_id(), GenerationRequest(prompt_tokens=[1]), sink)
    assert done.wait(5)
    s.stop()
    assert isinstance(got[-1], Finished) and got[-1].stop_type == "eos"


def submit_choices(s: Scheduler, prompt: list[int], n: int, **kw: object) -> list[Collector]:
    cs = [Collector() for _ in range(n)]
    s.submit_choices(
        [
            (s.next_task_id(), GenerationRequest(prompt_tokens=prompt, **kw), c)  # type: ignore[arg-type]
            for c in cs
        ]
    )
    return cs


def test_n_choices_decode_the_prompt_once_and_share_its_kv() -> None:
    s, runner = make(n_slots=4, n_batch=64)
    prompt = list(range(100, 130))
    runner.scripts = {tuple(prompt): [20, 21, 22]}
    cs = submit_choices(s, prompt, 3, n_predict=3)
    run_until_idle(s)
    prompt_rows = [r for p in runner.plans for r in p if len(r.tokens) > 1]
    assert len(prompt_rows) == 1, "the prompt must be decoded once"
    assert len(runner.copies) == 2
    finished = [c.finished for c in cs]
    assert all(f is not None and f.n_predicted == 3 for f in finished)
    assert len({f.id_slot for f in finished if f}) == 3
    # each choice drew its own first token from the shared logits
    assert [c.events[0].tokens[0] for c in cs] == [20, 21, 22]  # type: ignore[union-attr]


def test_n_choices_wait_for_enough_free_slots() -> None:
    s, _runner = make(n_slots=2)
    _, lone = submit(s, [9], n_predict=4)
    s._drain_inbox(block=False)
    s._step()
    cs = submit_choices(s, [1, 2], 2, n_predict=2)
    s._drain_inbox(block=False)
    s._step()
    assert s.stats.requests_deferred == 2
    run_until_idle(s)
    assert lone.finished is not None and all(c.finished is not None for c in cs)


def test_aborting_a_waiting_choice_leaves_the_others_running() -> None:
    s, runner = make(n_slots=3, n_batch=4)
    cs = [Collector() for _ in range(3)]
    ids = [s.next_task_id() for _ in range(3)]
    s.submit_choices(
        [(tid, GenerationRequest(prompt_tokens=list(range(100, 120)), n_predict=2), c) for tid, c in zip(ids, cs)]
    )
    s._drain_inbox(block=False)
    s._step()  # leader still prefilling (20 tokens, budget 4)
    s.abort(ids[2])
    run_until_idle(s)
    assert cs[2].finished is not None and cs[2].finished.stop_type == "abort"
    assert cs[0].finished is not None and cs[0].finished.n_predicted == 2
    assert cs[1].finished is not None and cs[1].finished.n_predicted == 2
    assert len(runner.copies) == 1


def test_aborting_the_leader_fails_the_waiting_choices_cleanly() -> None:
    s, _runner = make(n_slots=2, n_batch=4)
    cs = [Collector() for _ in range(2)]
    ids = [s.next_task_id() for _ in range(2)]
    s.submit_choices(
        [(tid, GenerationRequest(prompt_tokens=list(range(100, 120)), n_predict=2), c) for tid, c in zip(ids, cs)]
    )
    s._drain_inbox(block=False)
    s._step()
    s.abort(ids[0])
    run_until_idle(s)
    assert cs[0].finished is not None and cs[0].finished.stop_type == "abort"
    assert cs[1].failed is not None
    assert not any(sl.busy for sl in s.slots)


def test_a_long_prompt_is_fed_one_micro_batch_per_step_so_an_abort_lands_early() -> None:
    runner = FakeRunner(n_seq_max=2, n_batch=2048, n_ubatch=512, n_ctx_seq=4096)
    s = Scheduler(runner, 2)
    runner.scripts = {(1,): [5] * 50 + [EOG]}
    submit(s, [1], n_predict=50)
    s._drain_inbox(block=False)
    s._step()  # the short request is generating
    tid, c = submit(s, list(range(100, 2100)), n_predict=4)
    s._drain_inbox(block=False)
    s._step()
    assert max(sum(len(r.tokens) for r in plan) for plan in runner.plans) <= 512
    assert any(len(r.tokens) == 1 for r in runner.plans[-1]), "the generating slot advanced in the same step"
    s.abort(tid)
    s._drain_inbox(block=False)
    assert c.finished is not None and c.finished.stop_type == "abort"
    assert len(s.slots[1].cache_tokens) + len(s.slots[0].cache_tokens) < 600  # not the whole 2,000-token prompt


def test_prefill_chunks_never_mix_text_and_media_placeholders() -> None:
    """A prompt with an image (negative placeholders) is planned as text, media, text chunks:
    the runner decodes media as embeddings and text as tokens, one kind per chunk."""
    from llamaserve.engine.backend import media_token

    s, runner = make(n_slots=2, n_batch=16)
    image = [media_token(5, k) for k in range(20)]
    prompt = [1, 2, 3, *image, 4, 5]
    _, c = submit(s, prompt, n_predict=2)
    run_until_idle(s)
    assert c.finished is not None
    chunks = [r.tokens for p in runner.plans for r in p if r.start_pos < len(prompt) and len(r.tokens) > 1]
    assert all(all(t < 0 for t in ch) or all(t >= 0 for t in ch) for ch in chunks)
    assert chunks == [[1, 2, 3], image[:16], image[16:], [4, 5]]  # the image over two 16-row steps
    assert runner.tokens(c.finished.id_slot)[: len(prompt)] == prompt  # every position in place
    # the same image in the same place is a cache hit like text; another image is not
    _, again = submit(s, prompt, n_predict=1)
    run_until_idle(s)
    assert again.finished is not None and again.finished.n_cached == len(prompt) - 1
    other = [1, 2, 3, *[media_token(6, k) for k in range(20)], 4, 5]
    _, diff = submit(s, other, n_predict=1, id_slot=again.finished.id_slot)
    run_until_idle(s)
    assert diff.finished is not None and diff.finished.n_cached == 3


def test_a_row_the_runner_cannot_decode_fails_only_its_slot() -> None:
    """A media row whose embeddings left the store fails its request; the other slots go on."""
    from llamaserve.engine.backend import media_token

    s, runner = make(n_slots=2, n_batch=32)
    runner.scripts = {(1,): [5] * 30 + [EOG]}
    _, text = submit(s, [1], n_predict=20)
    s._drain_inbox(block=False)
    s._step()
    gone = media_token(9, 0)
    runner.missing_token = gone
    _, image = submit(s, [2, gone, media_token(9, 1), 3], n_predict=2)
    run_until_idle(s)
    assert image.failed is not None and "media gone" in image.failed.message
    assert text.finished is not None and text.finished.n_predicted == 20


def test_an_image_is_decoded_in_one_step_even_beside_generating_slots() -> None:
    """Its embeddings must attend to each other (gemma3), which holds only within one decode."""
    from llamaserve.engine.backend import media_token

    s, runner = make(n_slots=2, n_batch=16)
    runner.scripts = {(9,): [5] * 30 + [EOG]}
    submit(s, [9])
    s._drain_inbox(block=False)
    s._step()  # slot 0 generates from now on, taking one row of every step
    image = [media_token(3, k) for k in range(16)]  # a whole micro-batch
    prompt = [1, 2, *image, 4]
    _, c = submit(s, prompt, n_predict=1)
    run_until_idle(s)
    assert c.finished is not None
    media_rows = [r.tokens for p in runner.plans for r in p if r.tokens and r.tokens[0] < 0]
    assert media_rows == [image]
