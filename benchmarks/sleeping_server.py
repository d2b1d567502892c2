"""Our whole server (HTTP, SSE, scheduler) over a runner that sleeps instead of decoding.

    python benchmarks/sleeping_server.py STEP_MS THREADS_FILE [llama-server flags...]

The model is loaded as usual (its vocabulary, chat template and a real llama.cpp context
for the KV bookkeeping), but each step of the scheduler lasts STEP_MS from its launch with the
GIL released, as a GPU's decode would leave the Python side free, and returns one fixed
ordinary token per sampler. As on a GPU, where llama_decode returns once the work is queued
and the sampling waits for the logits, the scheduler's `meanwhile` (the previous step's text)
runs inside those STEP_MS. What the server then streams is bounded by its own costs only:
`serving_ceiling.py` compares it with the ideal rate of one token per stream per step.

A thread's sleep ends up to the kernel's timer slack late (50 µs by default, about 70 µs in
all here at 1.5 ms), which a GPU's step does not: the process asks for a slack of 1 ns before
its threads start, so a step lasts STEP_MS plus about 20 µs of wakeup, not 5% more.

Python 3.11 does not name native threads, so a thread of this process writes
{native_id: Python thread name} to THREADS_FILE every half second: the benchmark reads the
CPU time of each thread from /proc and names it with that map. Beside it (`steps_file`) go
the steps' own figures: how late each sleep returned (the wakeup and the wait for the GIL)
and how long the scheduler took from one step's end to the next one's start, which together
say where a level's share of the ideal went.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaserve import compose
from llamaserve.cli import main
from llamaserve.engine.runner import PlanRow, Sample, StepResult
from llamaserve.llama.runner import LlamaRunner

# What the steps took, for the benchmark: steps back to back, the time the sleeps ran over
# (the wakeup, and the wait for the GIL after it), and the time between one step's end and the
# next one's start (the scheduler's own work on the path from step to step).
STEPS = {"steps": 0, "late_s": 0.0, "between_s": 0.0}
BACK_TO_BACK_S = 0.05  # a longer gap is the server idle, not work between steps


def sleeping_runner(step_s: float) -> type[LlamaRunner]:
    """A LlamaRunner whose step sleeps `step_s` and samples a fixed ordinary token."""

    class SleepingRunner(LlamaRunner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # A few ordinary words in turn: no end token, no stop string, real detokenizing.
            self._cycle = list(self.model.tokenize(" the river runs north", add_special=False))
            self._next = 0
            self._ended = 0.0

        def step(self, plan: list[PlanRow], meanwhile: Callable[[], None] | None = None) -> StepResult:
            # As a GPU's: the step is launched, the scheduler's `meanwhile` runs while it computes,
            # and the results are ready STEP_MS after the launch.
            began = time.perf_counter()
            if meanwhile is not None:
                meanwhile()
            time.sleep(max(0.0, step_s - (time.perf_counter() - began)))
            slept = time.perf_counter()
            if began - self._ended < BACK_TO_BACK_S:
                STEPS["steps"] += 1
                STEPS["late_s"] += slept - began - step_s
                STEPS["between_s"] += began - self._ended
            samples: list[list[Sample]] = []
            for row in plan:
                row_samples = []
                for _ in row.samplers:
                    row_samples.append(Sample(self._cycle[self._next]))
                    self._next = (self._next + 1) % len(self._cycle)
                samples.append(row_samples)
            self._ended = time.perf_counter()
            return StepResult(samples)

    return SleepingRunner


def tight_timer_slack() -> None:
    """The calling thread's timer slack to 1 ns (threads started later inherit it); Linux only."""
    try:
        ctypes.CDLL(None).prctl(29, ctypes.c_ulong(1), 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def write_thread_names(path: Path) -> None:
    """Every half second: the thread names to `path`, the step figures (STEPS) to steps_file(path)."""
    while True:
        names = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id is not None}
        for target, value in ((path, names), (steps_file(path), STEPS)):
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(value))
            tmp.replace(target)
        time.sleep(0.5)


def steps_file(threads_file: Path) -> Path:
    return threads_file.with_name(threads_file.stem + "-steps.json")


if __name__ == "__main__":
    step_ms, threads_file, *flags = sys.argv[1:]
    tight_timer_slack()
    compose.LlamaRunner = sleeping_runner(float(step_ms) / 1000)  # type: ignore[misc]
    threading.Thread(target=write_thread_names, args=(Path(threads_file),), name="bench-names", daemon=True).start()
    sys.exit(main(flags))
