"""The seam between the scheduler and llama.cpp.

The scheduler describes one step as a plan (rows of tokens per sequence);
a runner decodes it and samples where asked. `LlamaRunner` does it with
llama.cpp; tests use a fake runner with the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from llamaserve.engine.types import SamplingParams
from llamaserve.llama.context import Context
from llamaserve.llama.model import Model
from llamaserve.llama.sampler import SamplerChain


class Sampler(Protocol):
    seed: int

    def accept(self, token: int) -> None: ...

    def close(self) -> None: ...


@dataclass
class PlanRow:
    """Tokens of one sequence placed at positions start_pos, start_pos+1, …

    When ``sampler`` is set, the logits of the last token are sampled.
    """

    seq_id: int
    tokens: list[int]
    start_pos: int
    sampler: Sampler | None = None


@dataclass
class StepResult:
    """Sampled token per plan row (None where no sampling was asked)."""

    sampled: list[int | None]
    error: str | None = None


class Runner(Protocol):
    n_ctx_seq: int
    n_batch: int
    n_seq_max: int

    def new_sampler(self, params: SamplingParams) -> Sampler: ...

    def step(self, plan: list[PlanRow]) -> StepResult: ...

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...


class LlamaRunner:
    """Runs plans on a real llama.cpp context."""

    def __init__(self, model: Model, context: Context) -> None:
        self.model = model
        self.context = context
        self.n_ctx_seq = context.n_ctx_seq
        self.n_batch = context.n_batch
        self.n_seq_max = context.settings.n_seq_max

    def new_sampler(self, params: SamplingParams) -> SamplerChain:
        return SamplerChain(self.model, params)

    def step(self, plan: list[PlanRow]) -> StepResult:
        rows: list[tuple[int, int, int, bool]] = []
        sample_at: list[int] = []
        for row in plan:
            last = len(row.tokens) - 1
            for i, tok in enumerate(row.tokens):
                rows.append((tok, row.start_pos + i, row.seq_id, row.sampler is not None and i == last))
            sample_at.append(len(rows) - 1 if row.sampler is not None else -1)
        code = self.context.decode(rows)
        if code != 0:
            return StepResult([None] * len(plan), error=f"llama_decode failed with code {code}")
        ctx = self.context.handle
        sampled: list[int | None] = []
        for row, index in zip(plan, sample_at):
            sampled.append(row.sampler.sample(ctx, index) if index >= 0 else None)  # type: ignore[union-attr]
        return StepResult(sampled)

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None:
        self.context.seq_remove(seq_id, p0, p1)

    def piece(self, token: int) -> bytes:
        return self.model.piece(token)

    def is_eog(self, token: int) -> bool:
        return self.model.is_eog(token)
