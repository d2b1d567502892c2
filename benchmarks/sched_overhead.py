"""The scheduler's own cost per step, with a runner that does no work.

On a GPU a decode step of a small model takes a few milliseconds, so Python
time spent planning, sampling bookkeeping and emitting events is what would
cap throughput. This drives the real `Scheduler` with a runner whose `step`
returns at once (a fixed token per sampler) and counts every second of a step
as scheduler overhead (its thread's CPU time): admission, prefix matching, plan building, text
streaming, stop strings, the host-memory cache, finishing and refilling.

Workload, per slot count: every slot busy, contexts up to 32k tokens, a mix of
prompts still in prefill and answers being generated; each finished request is
replaced at once by a new one from a small set of long conversations (so
prefix matching and the host cache are exercised), and a few wait in the queue.

    .venv/bin/python benchmarks/sched_overhead.py [--slots 8,16,32,64] [--steps 400] [--no-prefix-sharing]

With prefix sharing (the default) a follow-up turn shares what another slot holds of its
conversation, so fewer slots sit in prefill and more generate: more tokens come out of each
step, and each costs its text. Compare µs/token as well as ms/step, and run with
--no-prefix-sharing to see what sharing's own bookkeeping adds.

Prints a table and exits 1 when the 64-slot step overhead exceeds the budget.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.runner import PlanRow, Sample, StepResult
from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, Finished, GenerationRequest

BUDGET_MS_PER_STEP_AT_64 = 1.0
N_CTX = 32768
N_UBATCH = 512
VOCAB = 32000


class NullSampler:
    seed = 0

    def accept(self, token: int) -> None:
        pass

    def sample(self, ctx: object, index: int) -> int:
        return 0

    def close(self) -> None:
        pass


class NullRunner:
    """The Runner seam with no model behind it: steps cost nothing, tokens cycle."""

    n_batch = 2048
    n_ubatch = N_UBATCH
    can_shift = True

    def __init__(self, n_seq: int) -> None:
        self.n_seq_max = n_seq
        # One unified pool that holds every slot's context (each capped at N_CTX), as a GPU's
        # KV would for this workload: the KV room (engine/kv/room.py) never holds a request back.
        self.n_ctx_seq = N_CTX * n_seq
        self._next = 100
        self._pieces = {t: f" w{t}".encode() for t in range(VOCAB)}

    def new_sampler(self, params: SamplingParams) -> NullSampler:
        return NullSampler()

    def step(self, plan: list[PlanRow], meanwhile: Callable[[], None] | None = None) -> StepResult:
        if meanwhile is not None:
            meanwhile()
        samples: list[list[Sample]] = []
        for row in plan:
            self._next = (self._next + 7919) % (VOCAB - 1) + 1  # never 0, the end token
            samples.append([Sample(self._next) for _ in row.samplers])
        return StepResult(samples)

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None:
        pass

    def set_lora(self, scales: tuple[float, ...]) -> None:
        pass

    shares_cells = True
    sharing_note = ""

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        pass

    def seq_shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        pass

    def seq_state(self, seq_id: int) -> bytes:
        return b"\0" * 64  # the serialised cells' size does not matter for Python's cost

    def set_seq_state(self, seq_id: int, data: bytes, tokens: list[int]) -> bool:
        return True

    def save_seq_file(self, path: str, seq_id: int, tokens: list[int]) -> int:
        return 0

    def load_seq_file(self, path: str, seq_id: int) -> tuple[int, list[int]]:
        return 0, []

    def piece(self, token: int, *, special: bool = False) -> bytes:
        return self._pieces[token]

    def is_eog(self, token: int) -> bool:
        return token == 0


class Workload:
    """Keeps every slot busy plus a short queue; counts tokens and finished requests."""

    def __init__(self, scheduler: Scheduler, n_slots: int, seed: int) -> None:
        self.scheduler = scheduler
        self.rng = random.Random(seed)
        # Conversations that come back with a longer prompt each turn: prefixes shared with
        # what slots and the host cache hold.
        self.conversations = [
            [self.rng.randrange(1, VOCAB) for _ in range(self.rng.randrange(2_000, 24_000))] for _ in range(n_slots)
        ]
        self.finished = 0
        self.tokens = 0
        self.in_flight = 0
        self.target = n_slots + max(2, n_slots // 8)

    def top_up(self) -> None:
        while self.in_flight < self.target:
            self._submit()

    def _submit(self) -> None:
        convo = self.rng.choice(self.conversations)
        convo += [self.rng.randrange(1, VOCAB) for _ in range(self.rng.randrange(16, 400))]
        if len(convo) > N_CTX - 600:
            del convo[: len(convo) // 2]  # start the conversation over, shorter
        request = GenerationRequest(
            prompt_tokens=list(convo),
            n_predict=self.rng.randrange(16, 256),
            stop=("</answer>", "\n\nUser:"),
        )
        self.in_flight += 1
        self.scheduler.submit(self.scheduler.next_task_id(), request, self._sink)

    def _sink(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Finished):
                self.finished += 1
                self.tokens += event.n_predicted
                self.in_flight -= 1


def measure(n_slots: int, steps: int, seed: int, prefix_sharing: bool = True) -> dict[str, float]:
    runner = NullRunner(n_slots)
    policy = CachePolicy(cache_ram_bytes=-1, cache_idle_slots=True, kv_unified=True, prefix_sharing=prefix_sharing)
    scheduler = Scheduler(runner, n_slots, cache=policy, n_ctx_slot=N_CTX)
    work = Workload(scheduler, n_slots, seed)
    # Warm up until every conversation's first long prompt is in (a slot or the host cache):
    # the measured steps are then the steady state of follow-up turns.
    while work.finished < 2 * n_slots:
        work.top_up()
        scheduler._step()
    decoded = scheduler.stats.tokens_predicted_total
    step_times: list[float] = []
    for _ in range(steps):
        work.top_up()
        # CPU time of this thread, not wall time: other processes on a busy machine would
        # otherwise count as overhead.
        t0 = time.thread_time()
        scheduler._step()
        step_times.append(time.thread_time() - t0)
    generated = scheduler.stats.tokens_predicted_total - decoded
    total = sum(step_times)
    return {
        "slots": n_slots,
        "step_ms_mean": 1e3 * statistics.fmean(step_times),
        "step_ms_p99": 1e3 * sorted(step_times)[int(0.99 * (len(step_times) - 1))],
        "us_per_token": 1e6 * total / max(generated, 1),
        "tokens_per_step": generated / steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", default="8,16,32,64", help="comma-separated slot counts")
    parser.add_argument("--steps", type=int, default=2000, help="measured steps per slot count")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-prefix-sharing",
        action="store_true",
        help="turn cell sharing across slots off (what the server's --no-prefix-sharing does), to see its cost",
    )
    args = parser.parse_args()
    sharing = not args.no_prefix_sharing
    rows = [measure(int(n), args.steps, args.seed, sharing) for n in args.slots.split(",")]
    print(f"budget: scheduler overhead under {BUDGET_MS_PER_STEP_AT_64:.1f} ms per step at 64 slots")
    print(f"prefix sharing: {'on' if sharing else 'off'}")
    print(f"{'slots':>5} {'ms/step mean':>13} {'ms/step p99':>12} {'µs/token':>9} {'tokens/step':>12}")
    for r in rows:
        print(
            f"{r['slots']:>5.0f} {r['step_ms_mean']:>13.3f} {r['step_ms_p99']:>12.3f} "
            f"{r['us_per_token']:>9.1f} {r['tokens_per_step']:>12.1f}"
        )
    at64 = [r for r in rows if r["slots"] == 64]
    if at64 and at64[0]["step_ms_mean"] > BUDGET_MS_PER_STEP_AT_64:
        print("over budget at 64 slots", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
