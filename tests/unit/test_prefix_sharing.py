"""Prompt prefixes shared across the sequences of a unified KV (engine/kv/sharing.py), with the
fake runner's cell model: seq_copy tags cells, seq_remove untags them, seq_shift moves a cell
for every sequence holding it. Every answer here is a function of every token its sequence
holds, so a shared cell that is wrong, missing or moved changes the answer (or trips the
fake's check that a sequence's positions run 0..n-1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaserve.engine.backend import media_token
from llamaserve.engine.kv.blocks import BLOCK, block_hashes
from llamaserve.engine.kv.files import SlotFiles
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.kv.room import KVRoom, claimed_cells
from llamaserve.engine.kv.sharing import shareable
from llamaserve.engine.kv.slot import SlotState
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.spec_params import NgramMapParams, SpecParams
from llamaserve.engine.speculative import Speculator
from llamaserve.engine.types import GenerationRequest

from .fake_runner import FakeRunner
from .test_scheduler import Collector, run_until_idle

SYSTEM = list(range(1000, 1000 + 2 * BLOCK + 100))  # a shared system prompt of 612 tokens


class EchoRunner(FakeRunner):
    """Each sampled token depends on every token of the sequence so far."""

    def _next(self, seq: list[int]) -> int:
        return 10 + (sum(seq) + 7 * len(seq)) % 37


class PatternRunner(FakeRunner):
    """Continues the pattern 11 12 13 14 (which n-gram drafts guess right) except where the
    sum of the whole sequence says otherwise (where they guess wrong and are rolled back)."""

    def _next(self, seq: list[int]) -> int:
        return 11 + len(seq) % 4 if sum(seq) % 7 else 40 + len(seq) % 5


def question(i: int, n: int = 20) -> list[int]:
    return [3000 + 50 * i + k for k in range(n)]


def make(
    n_slots: int = 8,
    *,
    sharing: bool = True,
    n_batch: int = 128,
    n_ctx_seq: int = 16384,
    n_ctx_slot: int = 0,
    runner_kw: dict[str, object] | None = None,
    **policy: object,
) -> tuple[Scheduler, EchoRunner]:
    runner = EchoRunner(n_seq_max=n_slots, n_batch=n_batch, n_ctx_seq=n_ctx_seq, **(runner_kw or {}))  # type: ignore[arg-type]
    cache = CachePolicy(kv_unified=True, prefix_sharing=sharing, **policy)  # type: ignore[arg-type]
    return Scheduler(runner, n_slots, cache=cache, n_ctx_slot=n_ctx_slot), runner


def submit(s: Scheduler, prompt: list[int], **kw: object) -> Collector:
    c = Collector()
    s.submit(s.next_task_id(), GenerationRequest(prompt_tokens=prompt, **kw), c)  # type: ignore[arg-type]
    return c


def tokens(c: Collector) -> list[int]:
    assert c.finished is not None, c.events
    return [t for e in c.events for t in getattr(e, "tokens", [])]


def decoded_tokens(runner: FakeRunner) -> int:
    """Every token the runner decoded: prompt chunks and generated tokens."""
    return sum(len(r.tokens) for plan in runner.plans for r in plan)


def check_kv(s: Scheduler, runner: FakeRunner) -> None:
    """Every slot's cells hold exactly its cached tokens, the count of distinct cells is true,
    and the prefix index, kept up block by block as sequences grow and are cut, has every
    slot's whole blocks as hashing its cells afresh would."""
    for slot in s.slots:
        assert runner.tokens(slot.id) == slot.cache_tokens, f"slot {slot.id}"
        if s.kv.sharing.enabled:
            assert s.kv.sharing.held_chain(slot) == block_hashes(slot.cache_tokens, slot.cache_lora), f"slot {slot.id}"
    assert s.kv.sharing.distinct_cells(s.slots) == runner.n_cells_used


def burst(s: Scheduler, n: int, **kw: object) -> list[Collector]:
    return [submit(s, SYSTEM + question(i), **kw) for i in range(n)]


# ------------------------------------------------------------ the headline workload
def test_requests_arriving_together_compute_their_shared_prefix_once() -> None:
    s, runner = make()
    outs = burst(s, 8, n_predict=6)
    run_until_idle(s)
    computed = decoded_tokens(runner)
    assert computed <= len(SYSTEM) + 8 * (len(question(0)) + 6), computed
    assert s.stats.prompt_tokens_total <= len(SYSTEM) + 8 * len(question(0))
    assert s.stats.prompt_tokens_shared_total >= 7 * len(SYSTEM)
    # cache_n counts the shared tokens as a cache hit.
    assert sum(c.finished.n_cached for c in outs if c.finished) >= 7 * len(SYSTEM)
    check_kv(s, runner)
    # One system prompt's cells, then each answer's own.
    n_own = len(question(0)) + 6 - 1  # the last sampled token is never decoded
    assert runner.n_cells_used <= len(SYSTEM) + 8 * n_own + 8

    plain, plain_runner = make(sharing=False)
    expected = burst(plain, 8, n_predict=6)
    run_until_idle(plain)
    assert [tokens(c) for c in outs] == [tokens(c) for c in expected]
    assert decoded_tokens(plain_runner) >= 8 * len(SYSTEM)


def test_n_choices_of_requests_sharing_a_prefix_answer_as_without_sharing() -> None:
    def run(sharing: bool) -> list[list[int]]:
        s, runner = make(sharing=sharing)
        outs: list[Collector] = []
        for i in range(3):
            cs = [Collector() for _ in range(2)]
            req = GenerationRequest(prompt_tokens=SYSTEM + question(i), n_predict=5)
            s.submit_choices([(s.next_task_id(), req, c) for c in cs])
            outs += cs
        run_until_idle(s)
        check_kv(s, runner)
        return [tokens(c) for c in outs]

    assert run(True) == run(False)


def test_a_prompt_beginning_with_what_a_busy_sequence_holds_shares_its_cells() -> None:
    s, runner = make(n_batch=256)
    first = submit(s, SYSTEM + question(0), n_predict=40)
    s._drain_inbox(block=False)
    for _ in range(6):  # the first prompt is in the KV and its answer under way
        s._step()
    assert s.slots[0].state is SlotState.GENERATING
    second = submit(s, SYSTEM + question(1), n_predict=5)
    s._drain_inbox(block=False)
    s._step()
    assert (0, 1) in runner.copies
    assert s.slots[1].n_shared == len(SYSTEM)
    run_until_idle(s)
    assert second.finished is not None and second.finished.n_cached == len(SYSTEM)
    check_kv(s, runner)
    plain, _ = make(sharing=False)
    expected = [submit(plain, SYSTEM + question(i), n_predict=n) for i, n in ((0, 40), (1, 5))]
    run_until_idle(plain)
    assert [tokens(first), tokens(second)] == [tokens(c) for c in expected]


def test_a_prompt_beginning_with_what_an_idle_sequence_holds_shares_its_cells() -> None:
    s, runner = make()
    submit(s, SYSTEM + question(0), n_predict=3)
    run_until_idle(s)
    later = submit(s, SYSTEM + question(1), n_predict=3, id_slot=2)
    run_until_idle(s)
    assert later.finished is not None and later.finished.n_cached == len(SYSTEM)
    assert s.stats.prompt_tokens_shared_total == len(SYSTEM)
    check_kv(s, runner)


def test_the_leader_stopping_early_leaves_the_waiting_requests_to_compute_the_rest() -> None:
    s, runner = make(n_batch=64)
    outs = burst(s, 3, n_predict=4)
    s._drain_inbox(block=False)
    s._step()
    s._step()
    joining = [sl for sl in s.slots if sl.state is SlotState.JOINING]
    assert joining, "the later requests wait for the first one's prefill"
    leader = joining[0].joining.leader  # type: ignore[union-attr]
    assert leader.task is not None
    s.abort(leader.task.id)
    run_until_idle(s)
    check_kv(s, runner)
    plain, _ = make(sharing=False)
    expected = burst(plain, 3, n_predict=4)
    run_until_idle(plain)
    for got, want in zip(outs, expected):
        if got.finished is not None and got.finished.stop_type != "abort":
            assert tokens(got) == tokens(want)


# ------------------------------------------------------------ what edits a sequence's cells
@pytest.mark.parametrize("n_keep", [0, len(SYSTEM) + 25])
def test_a_context_shift_never_moves_cells_another_sequence_holds(n_keep: int) -> None:
    """n_keep 0 cuts into the shared prefix: the slot first gets cells of its own. n_keep past
    it cuts only the slot's own cells: nothing is copied."""

    def run(sharing: bool) -> tuple[list[list[int]], Scheduler, FakeRunner]:
        s, runner = make(n_ctx_slot=len(SYSTEM) + 60, context_shift=True, sharing=sharing)
        outs = [submit(s, SYSTEM + question(i), n_predict=n, n_keep=n_keep) for i, n in ((0, 80), (1, 6))]
        run_until_idle(s)
        check_kv(s, runner)
        return [tokens(c) for c in outs], s, runner

    shared, s, runner = run(True)
    assert s.stats.prompt_tokens_shared_total >= len(SYSTEM) and s.stats.context_shifts >= 1
    assert (runner.states_set > 0) == (n_keep == 0)  # copied into cells of its own, or not
    assert shared == run(False)[0]


def test_n_discard_with_shared_cells_answers_as_without_sharing() -> None:
    def run(sharing: bool) -> list[list[int]]:
        s, runner = make(n_ctx_slot=len(SYSTEM) + 50, context_shift=True, sharing=sharing)
        outs = [submit(s, SYSTEM + question(i), n_predict=n, n_keep=10, n_discard=7) for i, n in ((0, 60), (1, 60))]
        run_until_idle(s)
        check_kv(s, runner)
        return [tokens(c) for c in outs]

    assert run(True) == run(False)


def test_n_choices_sharing_a_prompt_shift_apart() -> None:
    """Choices of one prompt share its cells (seq_copy); a shift of one must not move the others'."""

    def run(sharing: bool) -> list[list[int]]:
        s, runner = make(n_ctx_slot=80, context_shift=True, sharing=sharing)
        cs = [Collector() for _ in range(2)]
        req = GenerationRequest(prompt_tokens=list(range(500, 550)), n_predict=70, n_keep=0)
        s.submit_choices([(s.next_task_id(), req, c) for c in cs])
        run_until_idle(s)
        check_kv(s, runner)
        return [tokens(c) for c in cs]

    assert run(True) == run(False)


def test_erasing_or_restoring_a_lender_leaves_the_sharers_cells(tmp_path: Path) -> None:
    s, runner = make()
    files = SlotFiles(s, str(tmp_path), {"file": "m"})
    submit(s, SYSTEM + question(0), n_predict=3)
    run_until_idle(s)
    files.save(0, "first.bin")
    sharer = submit(s, SYSTEM + question(1), n_predict=3, id_slot=1)
    run_until_idle(s)
    assert sharer.finished is not None and sharer.finished.n_cached == len(SYSTEM)
    assert s.stats.prompt_tokens_shared_total == len(SYSTEM)
    files.erase(0)
    check_kv(s, runner)
    files.restore(0, "first.bin")
    check_kv(s, runner)
    # The restored slot's cells are its own; a later request may share either copy.
    again = submit(s, SYSTEM + question(2), n_predict=3, id_slot=2)
    run_until_idle(s)
    assert again.finished is not None and again.finished.n_cached >= len(SYSTEM)
    check_kv(s, runner)


def test_parking_idle_sharers_in_the_host_cache_keeps_the_busy_lenders_cells() -> None:
    def run(sharing: bool) -> tuple[list[list[int]], Scheduler, FakeRunner]:
        s, runner = make(sharing=sharing, cache_ram_bytes=1 << 24, cache_idle_slots=True)
        outs = [submit(s, SYSTEM + question(0), n_predict=60)]
        s._drain_inbox(block=False)
        for _ in range(8):
            s._step()
        outs.append(submit(s, SYSTEM + question(1), n_predict=2))  # shares, answers, goes idle
        s._drain_inbox(block=False)
        for _ in range(4):
            s._step()
        outs.append(submit(s, [7] * 30, n_predict=2))  # starting it parks the idle sharer
        outs.append(submit(s, SYSTEM + question(1) + [9, 9], n_predict=4))  # comes back from RAM
        run_until_idle(s)
        check_kv(s, runner)
        return [tokens(c) for c in outs], s, runner

    shared, s, _ = run(True)
    assert s.stats.prompt_cache_saves >= 1 and s.stats.prompt_tokens_shared_total >= len(SYSTEM)
    assert shared == run(False)[0]


def test_speculative_rollback_beside_shared_cells_answers_as_plain_decoding() -> None:
    spec = SpecParams(types=("ngram-simple",), ngram_simple=NgramMapParams(size_n=2, size_m=6, min_hits=1))

    def run(sharing: bool, speculate: bool) -> list[list[int]]:
        runner = PatternRunner(n_seq_max=4, n_batch=128, n_ctx_seq=4096)
        cache = CachePolicy(kv_unified=True, prefix_sharing=sharing)
        s = Scheduler(runner, 4, cache=cache, speculator=Speculator(spec) if speculate else None)
        # A repeating system prompt gives the n-gram drafter something to propose.
        system = [11, 12, 13, 14] * (BLOCK // 2)
        outs = [submit(s, system + question(i, 8), n_predict=30) for i in range(3)]
        run_until_idle(s)
        check_kv(s, runner)
        if speculate:
            assert s.stats.spec_drafts_total > 0
        return [tokens(c) for c in outs]

    assert run(True, True) == run(False, False)


def test_kv_computed_under_other_adapter_scales_is_not_shared() -> None:
    s, runner = make()
    submit(s, SYSTEM + question(0), n_predict=3, lora=(1.0,))
    run_until_idle(s)
    other = submit(s, SYSTEM + question(1), n_predict=3, id_slot=1)
    same = submit(s, SYSTEM + question(2), n_predict=3, id_slot=2, lora=(1.0,))
    run_until_idle(s)
    assert other.finished is not None and other.finished.n_cached == 0
    assert same.finished is not None and same.finished.n_cached == len(SYSTEM)
    check_kv(s, runner)


def test_a_shared_prefix_never_ends_inside_an_image() -> None:
    image = [media_token(3, i) for i in range(40)]
    prompt_a = SYSTEM[:300] + image + [5] * 300 + [6]
    prompt_b = SYSTEM[:300] + image + [5] * 300 + [7]
    # Cut inside the image: moved back to where it starts.
    assert shareable(prompt_a, 320) == 300
    assert shareable(prompt_a, 340) == 340
    assert shareable(prompt_a, len(prompt_a)) == len(prompt_a) - 1
    s, runner = make()
    submit(s, prompt_a, n_predict=3)
    run_until_idle(s)
    b = submit(s, prompt_b, n_predict=3, id_slot=1)
    run_until_idle(s)
    assert b.finished is not None and b.finished.n_cached == len(prompt_b) - 1
    check_kv(s, runner)


# ------------------------------------------------------------ where sharing is off
@pytest.mark.parametrize(
    ("runner_kw", "policy", "note"),
    [
        ({"sharing_note": "the model uses sliding-window attention"}, {}, "sliding-window"),
        ({"sharing_note": "the model keeps a recurrent state"}, {}, "recurrent"),
        ({"unified": False}, {"kv_unified": False}, "split per slot"),
    ],
)
def test_where_cells_cannot_be_shared_every_request_computes_its_own(
    runner_kw: dict[str, object], policy: dict[str, object], note: str
) -> None:
    runner = EchoRunner(n_seq_max=4, n_batch=128, n_ctx_seq=4096, **runner_kw)  # type: ignore[arg-type]
    s = Scheduler(runner, 4, cache=CachePolicy(**{"kv_unified": True, **policy}))  # type: ignore[arg-type]
    assert note in s.kv.sharing_note and not s.kv.sharing.enabled
    outs = burst(s, 3, n_predict=3)
    run_until_idle(s)
    assert s.stats.prompt_tokens_shared_total == 0
    assert decoded_tokens(runner) >= 3 * len(SYSTEM)
    assert all(c.finished is not None for c in outs)


# ------------------------------------------------------------ counting and finding
def test_the_kv_room_counts_a_prefix_held_by_a_busy_lender_once() -> None:
    s, _ = make(n_batch=256)
    submit(s, SYSTEM + question(0), n_predict=50)
    s._drain_inbox(block=False)
    for _ in range(5):
        s._step()
    submit(s, SYSTEM + question(1), n_predict=50)
    s._drain_inbox(block=False)
    s._step()
    borrower = s.slots[1]
    assert borrower.n_shared == len(SYSTEM)
    both = claimed_cells(s.slots)
    alone = claimed_cells([s.slots[0]])
    assert both - alone == len(question(1)) + 50 - len(borrower.generated)
    room = KVRoom(s.slots, 4096)
    assert room.free == 4096 - both


def test_finding_the_longest_held_prefix_compares_only_sequences_sharing_it() -> None:
    s, _ = make(n_slots=32, n_batch=1024)
    # 31 unrelated conversations and one that shares the system prompt.
    for i in range(31):
        submit(s, [50_000 + 1000 * i + k for k in range(2 * BLOCK + 3)], n_predict=1)
    submit(s, SYSTEM + question(0), n_predict=1)
    run_until_idle(s)
    prompt = SYSTEM + question(5)
    hashes = block_hashes(prompt, ())
    lender, n = s.kv.sharing.find_held(prompt, hashes, (), s.slots[0])
    assert lender is not None and lender.cache_tokens[: len(SYSTEM)] == SYSTEM and n == len(SYSTEM)
