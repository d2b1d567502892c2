"""The engine's front (`EngineClient`): what serving/ and api/ read and do through it, on a fake runner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llamaserve.engine.client import EngineClient, SlotFileError
from llamaserve.engine.kv.files import SlotFiles
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.stats import SchedulerStats
from llamaserve.engine.types import Finished, GenerationRequest

from .fake_runner import EOG, FakeRunner
from .test_scheduler import run_until_idle, submit

NEWLINE = 10


def make(n_slots: int = 2, policy: CachePolicy | None = None) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(n_seq_max=n_slots, n_batch=64, pieces={NEWLINE: b"\n"})
    return Scheduler(runner, n_slots, cache=policy), runner


def test_a_busy_slots_view_copies_what_slots_shows() -> None:
    s, runner = make()
    front = EngineClient(s)
    runner.scripts = {(1, 2, 3): [5, NEWLINE, 5, 5, 5, EOG]}
    sampling = SamplingParams(temperature=0.5)
    submit(s, [1, 2, 3], n_predict=9, sampling=sampling)
    s._drain_inbox(block=False)
    for _ in range(3):  # the prompt, then two tokens: the answer so far holds the line break
        s._step()
    busy, idle = front.slots()
    live = s.slots[0]
    assert (busy.id, busy.busy, busy.n_ctx, busy.last_task_id) == (0, True, live.n_ctx, live.last_task_id)
    assert (busy.n_prompt, busy.n_past, busy.n_cached) == (3, live.n_past, 0)
    assert busy.n_generated == len(live.generated) >= 2 and busy.has_new_line
    assert busy.sampling == sampling and busy.n_predict == 9
    assert not idle.busy and idle.last_task_id == -1 and idle.sampling is None and idle.n_predict is None
    run_until_idle(s)
    done = front.slots()[0]
    # Once the task ends its settings are gone, and so is the line break: an idle slot's old
    # answer is not scanned.
    assert not done.busy and done.sampling is None and done.n_predict is None and not done.has_new_line
    assert done.last_task_id == busy.last_task_id and done.n_past == s.slots[0].n_past > busy.n_past
    assert front.n_slots == 2


def test_counters_speculation_and_the_queue_are_read_through_the_front() -> None:
    s, _ = make(n_slots=1)
    front = EngineClient(s)
    assert (front.speculative, front.spec_types) == (False, "none")
    assert front.prompt_cache_bytes() == 0  # no --cache-ram
    submit(s, [1, 2, 3, 4], n_predict=2)
    submit(s, [9, 9], n_predict=2)
    assert front.queued_tokens() == 6  # submitted, not yet admitted
    run_until_idle(s)
    assert front.queued_tokens() == 0
    assert front.stats is s.stats and front.stats.tokens_predicted_total == 4
    carried = SchedulerStats(tokens_predicted_total=42)
    front.stats = carried  # what waking from sleep does
    assert s.stats is carried


def test_the_host_cache_size_is_read_through_the_front() -> None:
    s, _ = make(n_slots=1, policy=CachePolicy(cache_ram_bytes=1 << 20))
    front = EngineClient(s)
    submit(s, list(range(100, 140)), n_predict=2)
    run_until_idle(s)
    assert front.prompt_cache_bytes() == 0
    submit(s, [200, 201, 202], n_predict=2)  # unrelated: the slot's KV is parked in host memory
    run_until_idle(s)
    assert front.prompt_cache_bytes() > 0


def test_a_bad_file_name_is_refused_before_the_scheduler_is_asked(tmp_path: Path) -> None:
    # No scheduler thread runs: a call would never return, so the refusal cannot have waited.
    s, _ = make()
    front = EngineClient(s, slot_files=SlotFiles(s, str(tmp_path), {"file": "m"}))
    for name in ("../x.bin", None, "llamaserve-persist.json"):
        with pytest.raises(SlotFileError):
            asyncio.run(front.save_slot(0, name))
        with pytest.raises(SlotFileError):
            asyncio.run(front.restore_slot(0, name))
    bare = EngineClient(s)
    assert not bare.has_slot_files
    with pytest.raises(SlotFileError):
        asyncio.run(bare.erase_slot(0))


def test_slot_files_round_trip_through_the_front_and_persist_when_it_stops(tmp_path: Path) -> None:
    s, runner = make(n_slots=1)
    front = EngineClient(s, slot_files=SlotFiles(s, str(tmp_path), {"file": "m"}), persist_slots=True)
    assert front.has_slot_files

    async def session() -> None:
        events = [e async for e in front.generate(GenerationRequest(prompt_tokens=list(range(10, 30)), n_predict=2))]
        assert isinstance(events[-1], Finished)
        held = front.slots()[0].n_past
        assert (await front.save_slot(0, "a.bin"))["n_saved"] == held
        assert (await front.erase_slot(0))["n_erased"] == held
        assert front.slots()[0].n_past == 0
        assert (await front.restore_slot(0, "a.bin"))["n_restored"] == held
        assert front.slots()[0].n_past == held

    s.start()
    try:
        asyncio.run(session())
    finally:
        front.stop()
    assert (tmp_path / "llamaserve-persist.json").exists()  # --cache-persist: written once stopped
    assert runner.tokens(0)  # the restored KV is still there
