"""Our whole server (HTTP, SSE, scheduler) over a runner that sleeps instead of decoding.

    python benchmarks/sleeping_server.py STEP_MS THREADS_FILE [llama-server flags...]

The model is loaded as usual (its vocabulary, chat template and a real llama.cpp context
for the KV bookkeeping), but each step of the scheduler sleeps STEP_MS with the GIL
released, as a GPU's decode would leave the Python side free, and returns one fixed
ordinary token per sampler. What the server then streams is bounded by its own costs only:
`serving_ceiling.py` compares it with the ideal rate of one token per stream per step.

Python 3.11 does not name native threads, so a thread of this process writes
{native_id: Python thread name} to THREADS_FILE every half second: the benchmark reads the
CPU time of each thread from /proc and names it with that map.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaserve import compose
from llamaserve.cli import main
from llamaserve.engine.runner import PlanRow, Sample, StepResult
from llamaserve.llama.runner import LlamaRunner


def sleeping_runner(step_s: float) -> type[LlamaRunner]:
    """A LlamaRunner whose step sleeps `step_s` and samples a fixed ordinary token."""

    class SleepingRunner(LlamaRunner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # A few ordinary words in turn: no end token, no stop string, real detokenizing.
            self._cycle = list(self.model.tokenize(" the river runs north", add_special=False))
            self._next = 0

        def step(self, plan: list[PlanRow]) -> StepResult:
            time.sleep(step_s)
            samples: list[list[Sample]] = []
            for row in plan:
                row_samples = []
                for _ in row.samplers:
                    row_samples.append(Sample(self._cycle[self._next]))
                    self._next = (self._next + 1) % len(self._cycle)
                samples.append(row_samples)
            return StepResult(samples)

    return SleepingRunner


def write_thread_names(path: Path) -> None:
    while True:
        names = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id is not None}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(names))
        tmp.replace(path)
        time.sleep(0.5)


if __name__ == "__main__":
    step_ms, threads_file, *flags = sys.argv[1:]
    compose.LlamaRunner = sleeping_runner(float(step_ms) / 1000)  # type: ignore[misc]
    threading.Thread(target=write_thread_names, args=(Path(threads_file),), name="bench-names", daemon=True).start()
    sys.exit(main(flags))
