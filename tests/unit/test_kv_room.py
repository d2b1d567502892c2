"""A unified KV pool decides who starts (engine/kv/room.py): a request whose prompt and answer do
not fit beside the running ones waits for room instead of failing every request in the cache,
and the requests behind it do not take that room."""

from __future__ import annotations

from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.scheduler import Scheduler

from .fake_runner import FakeRunner
from .test_scheduler import run_until_idle, submit


def pool(n_cells: int, n_slots: int = 4, unified: bool = True) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(n_seq_max=n_slots, n_ctx_seq=n_cells, n_batch=64)
    return Scheduler(runner, n_slots, cache=CachePolicy(kv_unified=unified)), runner


def start_step(runner: FakeRunner, seq_id: int) -> int:
    """The step in which a sequence's first row was decoded."""
    return next(i for i, plan in enumerate(runner.plans) if any(r.seq_id == seq_id for r in plan))


def last_step(runner: FakeRunner, seq_id: int) -> int:
    return max(i for i, plan in enumerate(runner.plans) if any(r.seq_id == seq_id for r in plan))


def test_a_request_that_does_not_fit_beside_the_running_one_waits_and_then_runs() -> None:
    s, runner = pool(100)
    _, first = submit(s, list(range(10, 50)), n_predict=20)  # claims 60 cells
    s._drain_inbox(block=False)
    s._step()
    _, second = submit(s, list(range(60, 110)), n_predict=10)  # needs 60: 120 > 100
    s._drain_inbox(block=False)
    s._step()
    assert not any(slot.busy and slot.id == 1 for slot in s.slots)  # a slot is idle, yet it waits
    run_until_idle(s)
    assert first.finished is not None and first.finished.stop_type == "limit"
    assert second.finished is not None and second.finished.stop_type == "limit"
    assert first.finished.n_predicted == 20 and second.finished.n_predicted == 10
    # the second started only once the first had finished
    assert start_step(runner, 1) > last_step(runner, 0)


def test_a_waiting_long_request_keeps_its_claim_against_later_short_ones() -> None:
    s, runner = pool(100)
    _, running = submit(s, list(range(10, 50)), n_predict=20)  # 60 cells
    s._drain_inbox(block=False)
    s._step()
    _, long = submit(s, list(range(100, 150)), n_predict=10)  # 60 cells: must wait
    _, short = submit(s, [7, 8, 9], n_predict=2)  # 5 cells would fit, but behind the long one
    run_until_idle(s)
    assert all(c.finished is not None and c.finished.stop_type == "limit" for c in (running, long, short))
    long_slot, short_slot = (next(slot for slot in s.slots if slot.last_task_id == tid) for tid in (2, 3))
    # the short one fitted beside the running one, yet it waited for the long one's room
    assert start_step(runner, short_slot.id) > last_step(runner, 0)
    assert start_step(runner, long_slot.id) <= start_step(runner, short_slot.id)


def test_requests_that_fit_together_start_together() -> None:
    s, _ = pool(200)
    outs = [submit(s, list(range(10 * i + 1, 10 * i + 31)), n_predict=10)[1] for i in range(4)]  # 4 x 40 cells
    s._drain_inbox(block=False)
    s._step()
    assert sum(slot.busy for slot in s.slots) == 4
    run_until_idle(s)
    assert all(c.finished is not None and c.finished.n_predicted == 10 for c in outs)


def test_without_a_unified_pool_each_slot_has_its_own_context() -> None:
    s, _ = pool(100, unified=False)
    submit(s, list(range(10, 50)), n_predict=20)
    submit(s, list(range(60, 110)), n_predict=10)
    s._drain_inbox(block=False)
    s._step()
    assert sum(slot.busy for slot in s.slots) == 2


def test_idle_conversations_left_in_the_pool_are_cleared_oldest_first_to_make_room() -> None:
    s, runner = pool(100)  # no host-memory cache: idle slots keep their KV in the pool
    _, a = submit(s, list(range(10, 40)), n_predict=5)  # slot 0 ends holding 35 cells
    run_until_idle(s)
    _, b = submit(s, list(range(40, 70)), n_predict=5)  # another slot; 35 more
    run_until_idle(s)
    held = {slot.id: slot.n_past for slot in s.slots if slot.n_past}
    assert sorted(held.values()) == [34, 34]  # the last sampled token is never decoded
    _, c = submit(s, list(range(200, 250)), n_predict=10)  # 60 cells: the pool has 32 left
    run_until_idle(s)
    assert all(x.finished is not None and x.finished.stop_type == "limit" for x in (a, b, c))
    oldest = min(held, key=lambda i: s.slots[i].last_task_id)
    assert s.slots[oldest].n_past == 0  # the least recently used conversation gave its cells
    assert (oldest, 0, -1) in runner.removed
    assert sum(slot.n_past for slot in s.slots) <= 100
