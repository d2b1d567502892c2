"""Scheduler reports a client can ask for: prompt progress, per-token timings; the whole
pool failing with llama-server's message when a shared KV cache is full; n choices on a
pinned slot."""

from __future__ import annotations

from llamaserve.engine.scheduler import CONTEXT_EXCEEDED
from llamaserve.engine.types import TextDelta

from .fake_runner import EOG
from .test_scheduler import Collector, make, run_until_idle, submit, submit_choices


def _progress(c: Collector) -> list[tuple[int, int, int]]:
    return [
        (e.progress.total, e.progress.cache, e.progress.processed)
        for e in c.events
        if isinstance(e, TextDelta) and e.progress is not None
    ]


def test_prompt_progress_is_reported_per_micro_batch_and_only_when_asked() -> None:
    s, runner = make(n_slots=1, n_batch=8)
    prompt = list(range(1, 21))  # 20 tokens: chunks of 8, 8, 4
    runner.scripts = {tuple(prompt): [5, EOG]}
    _, asked = submit(s, prompt, return_progress=True)
    run_until_idle(s)
    # first the cached part (none), then after each chunk, ending with the whole prompt
    assert _progress(asked) == [(20, 0, 0), (20, 0, 8), (20, 0, 16), (20, 0, 20)]
    assert asked.text == "<5>"  # the reports carry no text
    _, again = submit(s, prompt, return_progress=True)
    run_until_idle(s)
    # the same prompt again: all but its last token come from the cache
    assert _progress(again) == [(20, 19, 19), (20, 19, 20)]
    _, quiet = submit(s, prompt)
    run_until_idle(s)
    assert _progress(quiet) == []


def test_timings_per_token_ride_on_each_delta() -> None:
    s, runner = make(n_slots=1)
    runner.scripts = {(1, 2): [5, 6, EOG]}
    _, c = submit(s, [1, 2], timings_per_token=True)
    run_until_idle(s)
    deltas = [e for e in c.events if isinstance(e, TextDelta)]
    assert [d.timings.predicted_n for d in deltas if d.timings is not None] == [1, 2]
    _, plain = submit(s, [1, 2])
    run_until_idle(s)
    assert all(e.timings is None for e in plain.events if isinstance(e, TextDelta))


def test_a_full_kv_cache_ends_every_request_with_llama_servers_message() -> None:
    s, runner = make(n_slots=2)
    runner.scripts = {(1,): [5] * 20, (2,): [6] * 20}
    _, a = submit(s, [1])
    _, b = submit(s, [2])
    s._drain_inbox(block=False)
    s._step()
    runner.full_next = True
    s._step()
    for c in (a, b):
        assert c.failed is not None
        assert (c.failed.message, c.failed.status) == (CONTEXT_EXCEEDED, 500)
    assert not any(sl.busy for sl in s.slots) and all(not sl.cache_tokens for sl in s.slots)
    _, after = submit(s, [1], n_predict=2)  # the server goes on
    run_until_idle(s)
    assert after.finished is not None


def test_n_choices_pinned_to_a_busy_slot_wait_for_it() -> None:
    s, runner = make(n_slots=2)
    runner.scripts = {(1,): [5, 5, 5, EOG], (2, 3): [6, EOG]}
    _, first = submit(s, [1], id_slot=0)
    s._drain_inbox(block=False)
    s._step()
    choices = submit_choices(s, [2, 3], 2, n_predict=2, id_slot=0)
    run_until_idle(s)
    assert first.finished is not None
    assert all(c.finished is not None for c in choices)
    assert choices[0].finished is not None and choices[0].finished.id_slot == 0
