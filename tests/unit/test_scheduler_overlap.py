"""The text half of a step's tokens made while the next step runs (engine/scheduler.py's
`LaterText`, on whenever the scheduler runs its own thread): every request gets the same
events as when each step's text is made at once, in the same order, a message between two
steps (an abort) still finds the text before it, and the runner is handed the work to run
inside its step."""

from __future__ import annotations

from llamaserve.engine.runner import PlanRow, StepResult
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, Finished, TextDelta

from .fake_runner import EOG, FakeRunner
from .test_scheduler import Collector, run_until_idle, submit

EMOJI = "😀".encode()
PIECES = {20: b"Hel", 21: b"lo ", 22: b"wor", 23: b"ld!", 30: EMOJI[:1], 31: EMOJI[1:3], 32: EMOJI[3:], 40: b"\n  x"}


def _shape(events: list[Event]) -> list[tuple[object, ...]]:
    """What a client reads of the events (timings hold clock times, so only their presence)."""
    out: list[tuple[object, ...]] = []
    for e in events:
        if isinstance(e, TextDelta):
            out.append(("text", e.text, list(e.tokens), e.timings is not None))
        elif isinstance(e, Finished):
            out.append(("end", e.stop_type, e.stopping_word, e.n_predicted))
        else:
            out.append(("other", type(e).__name__))
    return out


def _serve_mix(overlap: bool) -> list[list[tuple[object, ...]]]:
    s = Scheduler(FakeRunner(n_seq_max=6, pieces=PIECES, n_ctx_seq=64), 6)
    s.overlap_text = overlap
    runner = s.runner
    assert isinstance(runner, FakeRunner)
    runner.scripts = {
        (1,): [20, 21, 22, 23] * 3 + [EOG],  # ends on its end token
        (2,): [30, 31, 32, 20, 30, 31],  # split characters, then a limit in the middle of one
        (3,): [20, 21, 22, 23, EOG],  # a stop string across tokens: its text is looked at
        (4,): [20, EOG, 21, 22] * 4,  # the end token ignored
        (5,): [40, 20, 40, 21] * 8,  # n_indent: its text is looked at
        (6,): [21] * 100,  # runs into the full context
    }
    requests: list[tuple[list[int], dict[str, object]]] = [
        ([1], {}),
        ([2], {"n_predict": 6}),
        ([3], {"stop": ("o wo",)}),
        ([4], {"n_predict": 9, "sampling": _ignore_eos()}),
        ([5], {"n_indent": 2, "n_predict": 20}),
        ([6] + list(range(100, 130)), {"timings_per_token": True}),
    ]
    collectors: list[Collector] = []
    for prompt, kw in requests:
        collectors.append(submit(s, prompt, **kw)[1])
    run_until_idle(s)
    return [_shape(c.events) for c in collectors]


def _ignore_eos() -> object:
    from llamaserve.engine.sampling import SamplingParams

    return SamplingParams(ignore_eos=True)


def test_every_request_gets_the_events_it_gets_without_the_overlap() -> None:
    with_overlap = _serve_mix(True)
    without = _serve_mix(False)
    assert with_overlap == without
    for events in with_overlap:
        assert events[-1][0] == "end"  # every request ended, its text all before its end


def test_an_abort_between_steps_comes_after_the_text_made_so_far() -> None:
    s, c = _one_long_request()
    for _ in range(6):
        s._step()
    s.abort(1)
    s._step()
    assert not s.slots[0].busy
    finished = c.finished
    assert finished is not None and finished.stop_type == "abort"
    deltas = [e for e in c.events if isinstance(e, TextDelta)]
    assert c.events[-1] is finished and len(c.events) == len(deltas) + 1
    assert sum(len(d.tokens) for d in deltas) == finished.n_predicted  # no token's text was lost


def test_the_runner_runs_the_previous_steps_text_inside_its_step() -> None:
    s, c = _one_long_request()
    runner = s.runner
    assert isinstance(runner, FakeRunner)
    handed: list[bool] = []
    plain_step = runner.step

    def step(plan: list[PlanRow], meanwhile: object = None) -> StepResult:
        handed.append(meanwhile is not None)
        seen = len(c.events)
        result = plain_step(plan, meanwhile)  # type: ignore[arg-type]
        if meanwhile is not None:
            assert len(c.events) > seen  # the last step's text went out during this one
        return result

    runner.step = step  # type: ignore[method-assign]
    for _ in range(5):
        s._step()
    # The prompt's step and the first token's are made at once; every later step carries one.
    assert handed == [False, False, True, True, True]


def _one_long_request() -> tuple[Scheduler, Collector]:
    s = Scheduler(FakeRunner(n_seq_max=1, pieces=PIECES), 1)
    s.overlap_text = True
    _, c = submit(s, [1], n_predict=50)
    s._drain_inbox(block=False)
    return s, c
