"""Admission with a fake runner: request priority, short prompts overtaking long prefills,
the bounded queue (--max-queue, --max-queue-tokens), queue time, and --max-itl-ms."""

from __future__ import annotations

import pytest

from llamaserve.engine.admission import QueueFull, QueueLimits
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.step_budget import MIN_PREFILL_TOKENS, PrefillBudget
from llamaserve.engine.step_plan import BACKGROUND_CHUNK
from llamaserve.engine.types import GenerationRequest

from .fake_runner import EOG, FakeRunner
from .test_scheduler import Collector, run_until_idle, submit


def first_token_step(runner: FakeRunner, seq_id: int, prompt: list[int]) -> int:
    """The index of the step that decoded the last token of ``prompt`` on ``seq_id``."""
    for i, plan in enumerate(runner.plans):
        for row in plan:
            if row.seq_id == seq_id and row.start_pos + len(row.tokens) == len(prompt) and row.samplers:
                return i
    raise AssertionError("the prompt was never finished")


def test_waiting_requests_start_by_priority_then_arrival() -> None:
    runner = FakeRunner(n_seq_max=1)
    s = Scheduler(runner, 1)
    runner.scripts = {(1,): [5, EOG]}
    submit(s, [1])
    s._drain_inbox(block=False)
    s._step()  # the only slot is busy now
    order: list[int] = []
    for prompt, priority in (([2], 0), ([3], 5), ([4], -1), ([6], 0)):
        c = Collector()
        s.submit(
            s.next_task_id(),
            GenerationRequest(prompt_tokens=prompt, n_predict=1, priority=priority),
            lambda events, p=prompt[0], c=c: (c(events), order.append(p) if c.finished else None),
        )
    run_until_idle(s)
    assert order == [4, 2, 6, 3]


def test_a_short_prompt_overtakes_a_long_prefill() -> None:
    runner = FakeRunner(n_seq_max=2, n_batch=16, n_ctx_seq=512)
    s = Scheduler(runner, 2)
    long_prompt = list(range(100, 300))  # 200 tokens: 13 steps of 16
    submit(s, long_prompt, n_predict=1)
    s._drain_inbox(block=False)
    s._step()
    s._step()
    short = [7, 8, 9]
    _, short_out = submit(s, short, n_predict=1)
    run_until_idle(s)
    short_done = first_token_step(runner, 1, short)
    long_done = first_token_step(runner, 0, long_prompt)
    # The short prompt got its first token in the step after it arrived, long before the other.
    assert short_done == 2
    assert short_done < long_done
    assert short_out.finished is not None


def test_a_background_prompt_does_not_share_a_step_with_an_urgent_one() -> None:
    runner = FakeRunner(n_seq_max=3, n_batch=64, n_ctx_seq=512)
    s = Scheduler(runner, 3)
    background = [
        submit(s, list(range(10 * k + 100, 10 * k + 140)), n_predict=1, priority=1_000_000)[1] for k in range(2)
    ]
    urgent_prompt = list(range(300, 340))
    _, urgent = submit(s, urgent_prompt, n_predict=1)
    run_until_idle(s)
    # The urgent prompt was decoded alone, in the first step; the background ones (equal to
    # each other) shared the next.
    first_tokens = [sorted(row.tokens[0] for row in plan) for plan in runner.plans[:2]]
    assert first_tokens == [[300], [100, 110]]
    assert urgent.finished is not None and all(b.finished is not None for b in background)


def test_a_background_prompt_goes_in_small_chunks_while_an_urgent_request_generates() -> None:
    runner = FakeRunner(n_seq_max=2, n_batch=512, n_ctx_seq=512)
    s = Scheduler(runner, 2)
    runner.scripts = {(1, 2, 3): [5] * 40 + [EOG]}
    _, urgent = submit(s, [1, 2, 3])
    s._drain_inbox(block=False)
    s._step()  # the urgent request is generating now
    background_prompt = list(range(100, 200))
    _, background = submit(s, background_prompt, n_predict=1, priority=1_000_000)
    run_until_idle(s)
    chunks = [len(row.tokens) for plan in runner.plans for row in plan if all(100 <= t < 200 for t in row.tokens)]
    # The urgent answer (40 tokens) outlasts the background prompt's 7 steps of 16 or fewer.
    assert max(chunks) == BACKGROUND_CHUNK and sum(chunks) == len(background_prompt)
    assert urgent.finished is not None and background.finished is not None


def test_background_decode_rows_sit_out_an_urgent_prefill_step() -> None:
    runner = FakeRunner(n_seq_max=2, n_batch=512, n_ctx_seq=512)
    s = Scheduler(runner, 2)
    runner.scripts = {(100, 101, 102): [7] * 40 + [EOG]}
    _, background = submit(s, [100, 101, 102], priority=1_000_000)
    s._drain_inbox(block=False)
    s._step()
    s._step()  # the background request is generating
    urgent_prompt = list(range(300, 340))
    _, urgent = submit(s, urgent_prompt, n_predict=1)
    run_until_idle(s)
    step = first_token_step(runner, 1, urgent_prompt)
    assert [row.tokens[0] for row in runner.plans[step]] == [300]  # the urgent prompt alone
    assert 7 in runner.plans[step + 1][0].tokens  # and the background answer goes on after it
    assert urgent.finished is not None and background.finished is not None


def test_a_long_prefill_is_not_starved_by_short_ones() -> None:
    runner = FakeRunner(n_seq_max=2, n_batch=16, n_ctx_seq=512)
    s = Scheduler(runner, 2)
    long_prompt = list(range(100, 164))
    _, long_out = submit(s, long_prompt, n_predict=1)
    s._drain_inbox(block=False)
    s._step()
    # Short prompts keep arriving; the long prompt's slot 0 keeps its turn by waiting longer.
    for i in range(30):
        submit(s, [10 + i, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], n_predict=1)
        s._drain_inbox(block=False)
        s._step()
        if long_out.finished is not None:
            break
    run_until_idle(s)
    assert long_out.finished is not None and long_out.finished.stop_type == "limit"


def test_past_max_queue_a_request_is_refused_at_once_with_a_retry_delay() -> None:
    runner = FakeRunner(n_seq_max=1)
    s = Scheduler(runner, 1, queue_limits=QueueLimits(max_requests=1))
    runner.scripts = {(1,): [5, 5, 5, EOG]}
    _, first = submit(s, [1])
    s._drain_inbox(block=False)
    s._step()
    _, second = submit(s, [2], n_predict=2)  # waits: the one place in the queue
    with pytest.raises(QueueFull) as refused:
        submit(s, [3], n_predict=2)
    assert "--max-queue 1" in refused.value.message
    assert refused.value.retry_after_s >= 1
    assert s.stats.requests_rejected == 1
    run_until_idle(s)
    # Every admitted request completes, and the queue has room again.
    assert first.finished is not None and second.finished is not None
    _, third = submit(s, [3], n_predict=1)
    run_until_idle(s)
    assert third.finished is not None


def test_free_slots_do_not_count_as_queue() -> None:
    runner = FakeRunner(n_seq_max=4)
    s = Scheduler(runner, 4, queue_limits=QueueLimits(max_requests=0))
    outs = [submit(s, [i + 1], n_predict=1)[1] for i in range(4)]  # four free slots: none waits
    with pytest.raises(QueueFull):
        submit(s, [9], n_predict=1)
    run_until_idle(s)
    assert all(o.finished is not None for o in outs)


def test_max_queue_tokens_counts_the_waiting_prompts() -> None:
    runner = FakeRunner(n_seq_max=1, n_ctx_seq=256)
    s = Scheduler(runner, 1, queue_limits=QueueLimits(max_tokens=50))
    submit(s, [1] * 10, n_predict=3)
    s._drain_inbox(block=False)
    s._step()
    submit(s, [2] * 30, n_predict=1)  # 30 waiting tokens: under the limit
    with pytest.raises(QueueFull) as refused:
        submit(s, [3] * 30, n_predict=1)
    assert "--max-queue-tokens 50" in refused.value.message
    submit(s, [4] * 5, n_predict=1)  # a small one still fits
    run_until_idle(s)
    assert s.admission.pending == 0


def test_aborting_a_waiting_request_frees_its_place_in_the_queue() -> None:
    runner = FakeRunner(n_seq_max=1)
    s = Scheduler(runner, 1, queue_limits=QueueLimits(max_requests=1))
    runner.scripts = {(1,): [5] * 20 + [EOG]}
    submit(s, [1])
    s._drain_inbox(block=False)
    s._step()
    waiting_id, waiting = submit(s, [2], n_predict=1)
    s.abort(waiting_id)
    s._drain_inbox(block=False)
    _, later = submit(s, [3], n_predict=1)  # the aborted request's place is free again
    run_until_idle(s)
    assert later.finished is not None and waiting.finished is None


def test_queue_time_is_reported_apart_from_prompt_time() -> None:
    runner = FakeRunner(n_seq_max=1)
    s = Scheduler(runner, 1)
    runner.scripts = {(1,): [5] * 5 + [EOG]}
    _, first = submit(s, [1])
    _, second = submit(s, [2], n_predict=1)
    run_until_idle(s)
    assert first.finished is not None and second.finished is not None
    assert second.finished.timings.queue_ms > 0.0
    assert second.finished.timings.queue_ms >= first.finished.timings.predicted_ms
    assert "queue_ms" in second.finished.timings.to_json()
    assert s.stats.queue_seconds_total >= second.finished.timings.queue_ms / 1000.0


def test_prefill_budget_keeps_the_step_under_the_latency_bound() -> None:
    budget = PrefillBudget(max_itl_ms=50)
    assert budget.prompt_tokens(512) == 512  # nothing measured yet
    budget.observe(0.010, n_generating=8, n_prompt_tokens=0)  # 10 ms for the generating rows
    budget.observe(0.010 + 0.512, n_generating=8, n_prompt_tokens=512)  # 1 ms per prompt token
    # 50 ms - 10 ms leaves room for 40 prompt tokens.
    assert budget.prompt_tokens(512) == 40
    budget.observe(0.2, n_generating=8, n_prompt_tokens=0)  # generating alone got slow
    assert budget.prompt_tokens(512) == MIN_PREFILL_TOKENS
    assert PrefillBudget(0).prompt_tokens(512) == 512  # off


def test_max_itl_caps_prompt_rows_beside_generating_slots() -> None:
    runner = FakeRunner(n_seq_max=2, n_batch=64, n_ctx_seq=512)
    s = Scheduler(runner, 2, max_itl_ms=50)
    runner.scripts = {(1,): [5] * 40 + [EOG]}
    submit(s, [1])
    s._drain_inbox(block=False)
    s._step()
    # As if measured: 10 ms per step plus 2 ms per prompt token, so 20 prompt tokens fit in 50 ms.
    s.prefill_budget = PrefillBudget(50)
    s.prefill_budget.observe(0.010, 1, 0)
    s.prefill_budget.observe(0.010 + 0.128, 1, 64)
    submit(s, list(range(100, 200)), n_predict=1)
    s._drain_inbox(block=False)
    s._step()
    prompt_rows = [r for r in runner.plans[-1] if r.seq_id == 1]
    assert len(prompt_rows) == 1 and MIN_PREFILL_TOKENS <= len(prompt_rows[0].tokens) <= 20
    run_until_idle(s)
