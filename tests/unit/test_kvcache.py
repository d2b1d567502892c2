"""KV-cache management with a fake runner: host-memory prompt cache, chunk reuse,
context shift, slot files and deferred slot actions."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaserve.engine.kv.files import SlotFileError, SlotFiles, validate_filename
from llamaserve.engine.kv.host_cache import PromptCache
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.kv.reuse import ChunkMove, context_shift, pad_prefill, plan_chunk_reuse
from llamaserve.engine.scheduler import Scheduler

from .fake_runner import FakeRunner
from .test_scheduler import run_until_idle, submit


def make(n_slots: int = 1, policy: CachePolicy | None = None, **kw: int) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(n_seq_max=n_slots, **kw)
    return Scheduler(runner, n_slots, cache=policy), runner


# ------------------------------------------------------------ pure helpers
def test_chunk_reuse_finds_runs_that_moved_back() -> None:
    cached = [1, 2, 3, 50, 51, 10, 11, 12, 13, 60, 20, 21, 22, 23]
    prompt = [1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 99]
    moves, in_place = plan_chunk_reuse(cached, prompt, start=3, min_chunk=4)
    assert moves == [ChunkMove(src=5, dst=3, length=4), ChunkMove(src=10, dst=7, length=4)]
    assert in_place == 11


def test_chunk_reuse_skips_runs_shorter_than_the_minimum() -> None:
    cached = [1, 9, 9, 10, 11, 12]
    prompt = [1, 10, 11, 12, 7]
    assert plan_chunk_reuse(cached, prompt, 1, min_chunk=4) == ([], 1)
    assert plan_chunk_reuse(cached, prompt, 1, min_chunk=3) == ([ChunkMove(3, 1, 3)], 4)


def test_chunk_reuse_never_covers_the_last_prompt_token() -> None:
    moves, in_place = plan_chunk_reuse([1, 8, 2, 3], [1, 2, 3], 1, min_chunk=1)
    assert in_place == 2 and moves == [ChunkMove(2, 1, 1)]


def test_context_shift_keeps_the_head_and_drops_half_the_rest() -> None:
    assert context_shift(n_past=511, n_keep=0) == (0, 255)
    assert context_shift(n_past=511, n_keep=100) == (100, 205)
    keep, n = context_shift(n_past=10, n_keep=50)  # n_keep beyond the context is clamped
    assert keep <= 8 and n >= 1


def test_context_shift_drops_n_discard_tokens_when_given() -> None:
    assert context_shift(n_past=511, n_keep=100, n_discard=50) == (100, 50)
    # More than is there: all but one of the tokens after n_keep go.
    assert context_shift(n_past=511, n_keep=100, n_discard=10_000) == (100, 410)


def test_prompt_cache_evicts_least_recently_used_and_drops_superseded_entries() -> None:
    cache = PromptCache(limit_bytes=3 * (100 + 4 * 3))
    cache.put([1, 2, 3], b"a" * 100)
    cache.put([4, 5, 6], b"b" * 100)
    cache.put([7, 8, 9], b"c" * 100)
    assert cache.best([1, 2, 3, 4])[1] == 3  # touching [1,2,3] makes [4,5,6] the oldest
    cache.put([10, 11, 12], b"d" * 100)
    assert cache.best([4, 5, 6])[0] is None
    assert cache.best([1, 2, 3])[0] is not None
    cache.put([1, 2, 3, 4, 5], b"e" * 100)  # holds everything [1,2,3] did; 8 bytes more evict [7,8,9]
    assert sorted(e.tokens for e in cache.entries()) == [[1, 2, 3, 4, 5], [10, 11, 12]]
    assert cache.covers([1, 2, 3]) and not cache.covers([2, 3])
    assert not PromptCache(limit_bytes=10).put([1], b"x" * 100)


# ------------------------------------------------------------ host-memory cache in the scheduler
def test_a_slot_taken_over_is_parked_in_ram_and_restored_for_a_later_prompt() -> None:
    s, runner = make(policy=CachePolicy(cache_ram_bytes=1 << 20), n_batch=64)
    long_a = list(range(100, 140))
    submit(s, long_a + [1], n_predict=2)
    run_until_idle(s)
    submit(s, [200, 201, 202], n_predict=2)  # unrelated: the only slot is overwritten
    run_until_idle(s)
    assert s.stats.prompt_cache_saves == 1
    _, c = submit(s, long_a + [2], n_predict=2)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_cached == 40
    assert s.stats.prompt_cache_hits == 1
    assert runner.tokens(0)[:40] == long_a  # the restored cells sit where the prompt needs them


def test_a_cached_prompt_is_restored_only_when_the_new_prompt_keeps_a_quarter_of_it() -> None:
    """As in llama-server: a restore copies the whole parked state into the KV cache, so an
    entry that shares only its first few tokens with the prompt stays in host memory."""
    s, _ = make(policy=CachePolicy(cache_ram_bytes=1 << 20), n_batch=64)
    conv = list(range(100, 140))
    submit(s, [*conv, 1], n_predict=2)
    run_until_idle(s)
    submit(s, [200, 201, 202], n_predict=2)  # parks the conversation (about 42 tokens)
    run_until_idle(s)
    _, few = submit(s, [*conv[:5], 7, 8, 9], n_predict=2)  # would keep 5 of them
    run_until_idle(s)
    assert few.finished is not None and few.finished.n_cached == 0
    assert s.stats.prompt_cache_hits == 0
    _, more = submit(s, [*conv[:12], 7, 8, 9], n_predict=2)  # 12 of about 42: restored
    run_until_idle(s)
    assert more.finished is not None and more.finished.n_cached == 12
    assert s.stats.prompt_cache_hits == 1


def test_a_slot_is_copied_to_ram_only_when_a_prompt_overwrites_most_of_it() -> None:
    """llama-server's rule: a whole sequence is copied to save it, so a next turn that keeps most
    of the slot (another question on the same document) costs no copy; one keeping less than
    half of it saves the slot first."""
    s, _ = make(policy=CachePolicy(cache_ram_bytes=1 << 20), n_batch=64)
    doc = list(range(100, 140))
    submit(s, [*doc, 1], n_predict=2)
    run_until_idle(s)
    _, next_turn = submit(s, [*doc, 5, 6], n_predict=2)  # keeps 40 of the 42 tokens held
    run_until_idle(s)
    assert next_turn.finished is not None and next_turn.finished.n_cached == 40
    assert s.stats.prompt_cache_saves == 0
    submit(s, [*doc[:10], 7, 8], n_predict=2)  # keeps 10 of about 43: the slot is saved first
    run_until_idle(s)
    assert s.stats.prompt_cache_saves == 1
    _, back = submit(s, [*doc, 5, 6, 9], n_predict=2)
    run_until_idle(s)
    assert back.finished is not None and back.finished.n_cached >= 42  # the saved turn came back


def test_without_cache_ram_a_taken_over_slot_recomputes() -> None:
    s, _ = make(n_batch=64)
    long_a = list(range(100, 140))
    submit(s, long_a + [1], n_predict=2)
    run_until_idle(s)
    submit(s, [200, 201, 202], n_predict=2)
    run_until_idle(s)
    _, c = submit(s, long_a + [2], n_predict=2)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_cached == 0


def test_idle_slots_leave_a_unified_kv_when_a_task_starts_and_come_back_from_ram() -> None:
    policy = CachePolicy(cache_ram_bytes=1 << 20, cache_idle_slots=True, kv_unified=True)
    s, runner = make(n_slots=2, policy=policy, n_batch=64)
    conv_a, conv_b = list(range(100, 140)), list(range(300, 340))
    submit(s, [*conv_a, 1], n_predict=2)
    run_until_idle(s)
    submit(s, [*conv_b, 1], n_predict=2)  # starts on the other slot: the first is parked and cleared
    run_until_idle(s)
    assert s.stats.idle_slots_cleared == 1 and s.stats.prompt_cache_saves == 1
    assert sum(len(runner.tokens(i)) > 0 for i in range(2)) == 1  # only the active conversation holds cells
    _, again = submit(s, [*conv_a, 2], n_predict=2)
    run_until_idle(s)
    assert again.finished is not None and again.finished.n_cached == 40  # restored from host memory
    assert s.stats.prompt_cache_hits == 1


def test_a_conversation_that_continued_in_its_slot_leaves_a_unified_kv_once_idle() -> None:
    """The follow-up reuses its slot (keeping most of it, so nothing is copied out); the turn
    that follows is new KV, so it too must leave the pool when another conversation starts, or
    every later decode would attend over it."""
    policy = CachePolicy(cache_ram_bytes=1 << 20, cache_idle_slots=True, kv_unified=True)
    s, runner = make(n_slots=2, policy=policy, n_batch=64)
    conv_a, conv_b = list(range(100, 140)), list(range(300, 340))
    submit(s, [*conv_a, 1], n_predict=2)
    run_until_idle(s)
    submit(s, [*conv_a, 5, 6], n_predict=2)  # same start, then different: same slot, old turn parked
    run_until_idle(s)
    submit(s, [*conv_b, 1], n_predict=2)
    run_until_idle(s)
    assert sum(len(runner.tokens(i)) > 0 for i in range(2)) == 1  # only the active conversation holds cells
    _, again = submit(s, [*conv_a, 5, 6, 7, 3], n_predict=2)
    run_until_idle(s)
    assert again.finished is not None and again.finished.n_cached >= 43  # the second turn came back from RAM


def test_idle_slots_stay_when_the_kv_is_per_slot_or_the_flag_is_off() -> None:
    for policy in (
        CachePolicy(cache_ram_bytes=1 << 20, cache_idle_slots=True, kv_unified=False),
        CachePolicy(cache_ram_bytes=1 << 20, cache_idle_slots=False, kv_unified=True),
    ):
        s, runner = make(n_slots=2, policy=policy, n_batch=64)
        submit(s, [*range(100, 140), 1], n_predict=2)
        run_until_idle(s)
        submit(s, [*range(300, 340), 1], n_predict=2)
        run_until_idle(s)
        assert s.stats.idle_slots_cleared == 0
        assert all(len(runner.tokens(i)) > 0 for i in range(2))
        # Per-slot KV: a copy goes to host memory all the same, for a request that lands elsewhere.
        assert s.stats.prompt_cache_saves == (1 if policy.cache_idle_slots else 0)


# ------------------------------------------------------------ --cache-reuse
def test_cache_reuse_moves_chunks_and_reports_them_as_cached() -> None:
    s, runner = make(policy=CachePolicy(cache_reuse=4), n_batch=64)
    system = [1, 2, 3]
    old_turn = [50, 51, 52]
    doc = list(range(100, 120))
    submit(s, system + old_turn + doc + [7], n_predict=1)
    run_until_idle(s)
    # The old turn is dropped from the middle: the document moved 3 positions back.
    _, c = submit(s, system + doc + [8, 9], n_predict=1)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_cached == 3 + 20
    assert (0, 6, 26, -3) in runner.shifts
    assert runner.tokens(0)[:23] == system + doc


def test_cache_reuse_per_request_zero_turns_it_off() -> None:
    s, _ = make(policy=CachePolicy(cache_reuse=4), n_batch=64)
    doc = list(range(100, 120))
    submit(s, [1, 2, 3, 50] + doc + [7], n_predict=1)
    run_until_idle(s)
    _, c = submit(s, [1, 2, 3] + doc + [8], n_predict=1, n_cache_reuse=0)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_cached == 3


# ------------------------------------------------------------ prefill padding (CPU flash attention)
@pytest.mark.parametrize(
    ("keep", "n_prompt", "expected"),
    [
        (1500, 1557, 1493),  # 57 new rows: 7 cached ones join them to fill a 64-row tile
        (1500, 1552, 1488),  # 52 new rows: the first count padded
        (1500, 1551, 1500),  # 51: cheaper row by row
        (1500, 1564, 1500),  # 64 already fill a tile
        (1500, 1501, 1500),  # a single row (plain decode of the last token)
        (5, 62, 5),  # too few cached tokens to pad with
        (7, 64, 0),
    ],
)
def test_pad_prefill_fills_a_tile_only_where_the_row_path_costs_more(keep: int, n_prompt: int, expected: int) -> None:
    assert pad_prefill(keep, n_prompt, tile_rows=64) == expected


def test_pad_prefill_is_off_without_a_tile() -> None:
    assert pad_prefill(1500, 1557, tile_rows=0) == 1500


def test_a_follow_up_short_of_a_tile_decodes_cached_tokens_again() -> None:
    s, runner = make(policy=CachePolicy(prefill_tile_rows=16), n_batch=64)
    first = list(range(100, 140))
    submit(s, first, n_predict=1)
    run_until_idle(s)
    follow_up = first + list(range(200, 213))  # 13 new tokens after the 40 cached ones
    _, c = submit(s, follow_up, n_predict=1)
    run_until_idle(s)
    # 3 cached tokens are decoded again with the 13 new ones: the reported cache shrinks to match.
    assert c.finished is not None and c.finished.n_cached == 53 - 16
    assert runner.tokens(0)[:53] == follow_up


# ------------------------------------------------------------ --context-shift
def test_context_shift_lets_generation_run_past_the_slot_size() -> None:
    s, runner = make(policy=CachePolicy(context_shift=True), n_ctx_seq=32, n_batch=32)
    _, c = submit(s, [1, 2, 3, 4], n_predict=100, n_keep=2)
    run_until_idle(s)
    assert c.finished is not None
    assert c.finished.n_predicted == 100 and c.finished.stop_type == "limit"
    assert c.finished.truncated
    assert s.stats.context_shifts >= 3
    assert runner.tokens(0)[:2] == [1, 2]  # n_keep tokens survive every shift


def test_context_shift_uses_the_requests_n_discard() -> None:
    s, runner = make(policy=CachePolicy(context_shift=True), n_ctx_seq=32, n_batch=32)
    _, c = submit(s, [1, 2, 3, 4], n_predict=40, n_keep=2, n_discard=5)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_predicted == 40 and c.finished.truncated
    # Every shift slid the tail back by exactly n_discard cells, just after the kept head.
    assert runner.shifts and all(start == 2 + 5 and delta == -5 for _, start, _, delta in runner.shifts)


def test_without_context_shift_a_full_slot_stops() -> None:
    s, _ = make(n_ctx_seq=32, n_batch=32)
    _, c = submit(s, [1, 2, 3, 4], n_predict=100)
    run_until_idle(s)
    assert c.finished is not None and c.finished.n_predicted < 32 and not c.finished.truncated


# ------------------------------------------------------------ slot files
@pytest.mark.parametrize("name", ["", "../x.bin", "a/b.bin", ".hidden", "..", "a\\b", "x\x00y", "x" * 300, 5])
def test_slot_file_names_are_validated(name: object) -> None:
    with pytest.raises(SlotFileError):
        validate_filename(name)


def test_a_slot_action_cannot_name_the_files_cache_persist_owns(tmp_path: Path) -> None:
    s, _ = make(n_slots=2, n_batch=64)
    submit(s, list(range(10, 30)), n_predict=2)
    run_until_idle(s)
    files = SlotFiles(s, str(tmp_path), {"file": "m"})
    assert files.persist_all() == 1
    manifest = (tmp_path / "llamaserve-persist.json").read_bytes()
    for name in ("llamaserve-persist.json", "llamaserve-persist.json.tmp", "LLAMASERVE-PERSIST-slot0.bin"):
        with pytest.raises(SlotFileError, match="the server keeps its own files"):
            files.save(1, name)
        with pytest.raises(SlotFileError, match="the server keeps its own files"):
            files.restore(1, name)
    assert (tmp_path / "llamaserve-persist.json").read_bytes() == manifest
    fresh, _ = make(n_slots=2, n_batch=64)
    assert SlotFiles(fresh, str(tmp_path), {"file": "m"}).load_all() == 1  # the server still reads its own


def test_save_erase_restore_round_trip(tmp_path: Path) -> None:
    s, runner = make(n_batch=64)
    files = SlotFiles(s, str(tmp_path), {"file": "m"})
    submit(s, list(range(10, 30)), n_predict=2)
    run_until_idle(s)
    held = list(s.slots[0].cache_tokens)
    saved = files.save(0, "a.bin")
    assert saved["n_saved"] == len(held) and saved["n_written"] > 0
    assert files.erase(0) == {"id_slot": 0, "n_erased": len(held)}
    assert s.slots[0].cache_tokens == [] and runner.cells[0] == []
    restored = files.restore(0, "a.bin")
    assert restored["n_restored"] == len(held)
    assert s.slots[0].cache_tokens == held and runner.tokens(0) == held
    with pytest.raises(SlotFileError):
        files.restore(0, "missing.bin")


def test_persisted_caches_load_only_for_the_same_model(tmp_path: Path) -> None:
    s, _ = make(n_slots=2, n_batch=64)
    submit(s, list(range(10, 30)), n_predict=2)
    run_until_idle(s)
    held = [list(sl.cache_tokens) for sl in s.slots]
    assert SlotFiles(s, str(tmp_path), {"file": "m"}).persist_all() == 1
    fresh, _ = make(n_slots=2, n_batch=64)
    assert SlotFiles(fresh, str(tmp_path), {"file": "other"}).load_all() == 0
    assert SlotFiles(fresh, str(tmp_path), {"file": "m"}).load_all() == 1
    assert [sl.cache_tokens for sl in fresh.slots] == held


def test_a_slot_action_waits_for_the_slots_request() -> None:
    s, _ = make(n_batch=64)
    submit(s, [1, 2, 3], n_predict=5)
    s._drain_inbox(block=False)
    s._step()
    assert s.slots[0].busy
    seen: list[int] = []
    s.call(lambda: len(s.slots[0].cache_tokens), lambda v, e: seen.append(v), idle_slot=0)  # type: ignore[arg-type]
    s._drain_inbox(block=False)
    assert seen == []
    run_until_idle(s)
    s._step()
    assert seen and seen[0] >= 3 + 4


# ------------------------------------------------------------ LoRA sets
def test_requests_with_different_adapter_scales_never_share_a_decode() -> None:
    s, runner = make(n_slots=3, n_batch=64)
    _, base = submit(s, [1, 2], n_predict=4)
    _, half = submit(s, [3, 4], n_predict=4, lora=(0.5,))
    _, half2 = submit(s, [5, 6], n_predict=4, lora=(0.5,))
    run_until_idle(s)
    assert all(c.finished is not None and c.finished.n_predicted == 4 for c in (base, half, half2))
    for plan, lora in zip(runner.plans, runner.lora_per_step):
        seqs = {row.seq_id for row in plan}
        owners = {0: (), 1: (0.5,), 2: (0.5,)}
        assert {owners[q] for q in seqs} == {lora}, "a decode mixed adapter sets"
    assert any(len(plan) == 2 for plan in runner.plans)  # the two 0.5 requests did batch together


def test_kv_computed_under_another_adapter_set_is_not_reused() -> None:
    s, _ = make(n_batch=64)
    prompt = list(range(10, 30))
    submit(s, prompt + [1], n_predict=1)
    run_until_idle(s)
    _, other = submit(s, prompt + [2], n_predict=1, lora=(1.0,))
    run_until_idle(s)
    assert other.finished is not None and other.finished.n_cached == 0
    _, same = submit(s, prompt + [3], n_predict=1, lora=(1.0,))
    run_until_idle(s)
    assert same.finished is not None and same.finished.n_cached == 20


def test_a_restored_slot_keeps_only_the_text_before_its_first_media(tmp_path: Path) -> None:
    # Media placeholders name this process's media store; after a restart they could stand for
    # another image, so their KV is not restored (the text before them is).
    s, runner = make(n_batch=64)
    files = SlotFiles(s, str(tmp_path), {"file": "m"})
    held = [5, 6, 7, -1, -2, -3, 8, 9]
    runner.put(0, held)
    runner.save_seq_file(str(tmp_path / "m.bin"), 0, held)
    restored = files.restore(0, "m.bin")
    assert s.slots[0].cache_tokens == [5, 6, 7] and runner.tokens(0) == [5, 6, 7]
    assert restored["n_restored"] == 3
