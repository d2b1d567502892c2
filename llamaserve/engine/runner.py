"""The seam between the scheduler and llama.cpp.

The scheduler describes one step as a plan (rows of tokens per sequence);
a runner decodes it and samples where asked. `llama/runner.LlamaRunner`
does it with llama.cpp; tests use a fake runner with the same interface.
Nothing here loads llama.cpp, so the scheduler runs without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.types import TokenLogprob


class Sampler(Protocol):
    seed: int

    def accept(self, token: int) -> None: ...

    def sample(self, ctx: object, index: int) -> int: ...

    def sample_post(self, ctx: object, index: int, k: int) -> tuple[int, TokenLogprob]:
        """Sample, and report the chosen token and the top k after the chain (log-probabilities)."""
        ...

    def close(self) -> None: ...


@dataclass(slots=True)  # built once per token or row: slots make that cheaper
class PlanRow:
    """Tokens of one sequence placed at positions start_pos, start_pos+1, …

    Each sampler in ``samplers`` draws one token from the logits of the last
    token: normally one, several when n > 1 choices share a prompt. With
    ``n_probs`` >= 0 each draw also reports log-probabilities.
    """

    seq_id: int
    tokens: list[int]
    start_pos: int
    samplers: list[Sampler] = field(default_factory=list)
    n_probs: int = -1
    # When set, every row's logits are kept and scored against these tokens
    # (the prompt token that follows each row): prompt log-probabilities.
    targets: list[int] | None = None
    post_sampling: bool = False  # report the chain's probabilities instead of the raw ones
    # Speculative decoding: tokens[1:] are a draft. Every row keeps its logits and the one
    # sampler draws through the draft while it agrees (`verify_draft`); the row's samples are
    # the accepted draft tokens and then the target's own token.
    draft: list[int] = field(default_factory=list)
    # Benchmarking only (--spec-synth-*): says, per draft position, whether to accept the
    # draft token whatever the target sampled.
    synth: Callable[[int], bool] | None = None


@dataclass(slots=True)  # built once per token or row: slots make that cheaper
class Sample:
    token: int
    logprob: TokenLogprob | None = None


def verify_draft(row: PlanRow, sample_at: Callable[[int], Sample], is_eog: Callable[[int], bool]) -> list[Sample]:
    """Sample row positions 0, 1, ... in order while the target agrees with the draft.

    The sampler draws at each position exactly as plain decoding would (same chain, same
    random numbers, grammar and penalties fed the same tokens), so the accepted tokens are
    the ones plain decoding would have produced. The drafts are deterministic (a copy of
    earlier tokens, or the draft model's most likely token), i.e. q is a point mass: the
    speculative-sampling rule min(1, p/q) then accepts the draft token d with probability
    p(d), and on rejection resamples from p without d, which is what drawing x ~ p and
    accepting when x == d does.
    """
    out: list[Sample] = []
    for i, token in enumerate(row.draft):
        drawn = sample_at(i)
        if row.synth is not None:
            # Synthetic acceptance: the draft token by the dice, not by the target's agreement.
            if row.synth(i) and not is_eog(token):
                out.append(Sample(token))
                continue
            out.append(drawn)
            return out
        out.append(drawn)
        if drawn.token != token:
            return out
    out.append(sample_at(len(row.draft)))
    return out


@dataclass
class DraftRequest:
    """Draft up to n_max tokens for a sequence holding ``history`` and about to decode ``last``."""

    seq_id: int
    history: list[int]
    last: int
    n_max: int


class DraftRunner(Protocol):
    """A draft model in a context of its own (`llama/draft.DraftModel`)."""

    def draft(self, requests: list[DraftRequest], p_min: float) -> list[list[int]]:
        """Greedy drafts for several sequences at once, one decode per drafted position; a
        sequence stops when its best token's probability falls under p_min."""
        ...

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None: ...


# A sequence's KV cells, serialised by llama.cpp (kept in the host-memory prompt cache).
SeqState = bytes | bytearray


@dataclass
class StepResult:
    """Per plan row, one Sample per sampler of that row (empty when none)."""

    samples: list[list[Sample]]
    error: str | None = None
    # The KV cache had no room for the batch (llama_decode's 1): with a unified KV cache the
    # slots share it, so one long answer can leave none for the others.
    no_space: bool = False
    prompt_logprobs: list[list[TokenLogprob]] = field(default_factory=list)  # per row, when targets were set
    # Rows that were not decoded, by plan index, with why: their slots fail, the others go on
    # (a media row whose embeddings are gone from the store).
    failed_rows: dict[int, str] = field(default_factory=dict)


class Runner(Protocol):
    n_ctx_seq: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int

    def new_sampler(self, params: SamplingParams) -> Sampler: ...

    def step(self, plan: list[PlanRow], meanwhile: Callable[[], None] | None = None) -> StepResult:
        """Decode the plan's rows and sample them. `meanwhile`, when given, is called once before
        the step returns, at the point where the device works on its own (after a GPU's decode is
        launched and before its results are waited for), so the scheduler's bookkeeping of the
        previous step overlaps this one; a runner with no such point calls it first."""
        ...

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None: ...

    def set_lora(self, scales: tuple[float, ...]) -> None: ...

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Give dst the cells src holds at positions [p0, p1) (-1: open ends). Within a unified
        KV this tags the cells with dst and copies nothing: both sequences then hold them."""
        ...

    @property
    def shares_cells(self) -> bool:
        """Whether seq_copy over a range shares cells (a unified KV cache of plain attention
        layers); False where a copy is physical or whole (split KV, SWA, recurrent state)."""
        ...

    @property
    def sharing_note(self) -> str:
        """Why cells are not shared ("" when they are), for /props and the log."""
        ...

    def seq_shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None: ...

    @property
    def can_shift(self) -> bool: ...

    def seq_state(self, seq_id: int) -> SeqState: ...

    def set_seq_state(self, seq_id: int, data: SeqState, tokens: list[int]) -> bool:
        """Restore a sequence's KV saved by `seq_state`; ``tokens``: the tokens it holds."""
        ...

    def save_seq_file(self, path: str, seq_id: int, tokens: list[int]) -> int: ...

    def load_seq_file(self, path: str, seq_id: int) -> tuple[int, list[int]]: ...

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The token's text; a special token's only with -sp or ``special`` (a preserved token)."""
        ...

    def is_eog(self, token: int) -> bool: ...
