"""Engine-side request and event types: plain dataclasses, no pydantic, no ctypes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llamaserve.engine.reasoning_budget import ReasoningBudgetSpec
from llamaserve.engine.sampling import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability and the k most likely tokens at its position.

    With post_sampling_probs these are logs of the probabilities after the sampler chain;
    a token the chain removed has none (-inf), so `top` lists only the survivors.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


@dataclass
class GenerationRequest:
    """What the scheduler needs to run one completion."""

    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1: until end of generation or the slot's context is full
    stop: tuple[str, ...] = ()
    cache_prompt: bool = True
    id_slot: int = -1
    t_max_predict_ms: int = 0
    n_indent: int = 0  # the least indentation of a line after the first newline; 0: any
    n_keep: int = 0  # tokens kept at the start by a context shift; -1: the whole prompt
    n_discard: int = 0  # tokens a context shift drops; 0: half of those after n_keep
    n_cache_reuse: int = -1  # smallest chunk reused by KV shifting; -1: the server's --cache-reuse
    lora: tuple[float, ...] = ()  # a scale per loaded adapter; () when none applies (the base model)
    n_probs: int = -1  # -1: no log-probabilities; k >= 0: the chosen token's plus the top k
    # The probabilities after the sampler chain (top-k, top-p, temperature, … applied) instead
    # of the model's raw distribution: llama-server's post_sampling_probs.
    post_sampling_probs: bool = False
    reasoning_budget: ReasoningBudgetSpec | None = None  # None: reasoning runs as long as the model likes
    prompt_logprobs: bool = False  # also score every prompt token (legacy completions' echo)
    echo_text: str = ""  # prompt text the answer starts with (legacy completions' echo)
    timings_per_token: bool = False  # every TextDelta carries the timings so far
    return_progress: bool = False  # PromptProgress reports while the prompt is processed
    priority: int = 0  # lower values are admitted and prefilled first (vLLM's convention)
    # Special tokens whose text the answer shows even without -sp (llama-server's preserved_tokens).
    preserved_tokens: frozenset[int] = frozenset()
    # The answer's id as the client sees it (`chatcmpl-…`), shared by n choices: what
    # `POST /v1/chat/completions/control` names to act on the running generation.
    completion_id: str = ""


@dataclass
class Timings:
    """llama-server's `timings` object."""

    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    queue_ms: float = 0.0  # waiting for a slot, before prompt_ms starts (ours; llama-server has none)
    draft_n: int = 0  # speculative decoding: tokens drafted, and those the target accepted
    draft_n_accepted: int = 0

    @property
    def predicted_steps(self) -> int:
        """Decode steps spent generating: the first token comes from the logits of the last
        prompt batch and costs none, so rates are over n - 1 tokens (llama-server's n_gen_steps)."""
        return max(self.predicted_n - 1, 0)

    def to_json(self) -> dict[str, float | int]:
        # Unrounded, as llama-server sends them: clients recompute rates from the fields.
        steps = self.predicted_steps
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": 1e3 / self.prompt_ms * self.prompt_n if self.prompt_ms > 0 else 0.0,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 / self.predicted_ms * steps if self.predicted_ms > 0 else 0.0,
            "queue_ms": self.queue_ms,
            # As llama-server: only for a request that drafted.
            **({"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted} if self.draft_n else {}),
        }


@dataclass(frozen=True)
class PromptProgress:
    """llama-server's `prompt_progress`: prompt tokens in all, from the cache, processed so far
    (cached ones included), and the milliseconds since the prompt started."""

    total: int
    cache: int
    processed: int
    time_ms: float

    def to_json(self) -> dict[str, float | int]:
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


@dataclass(slots=True)  # built once per token or row: slots make that cheaper
class TextDelta:
    """New output text (never a broken UTF-8 sequence, never part of a stop string).

    A progress report (return_progress) is a TextDelta without text or tokens, so that
    every consumer of the stream that does not ask for progress can pass it over.
    """

    text: str
    tokens: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token when n_probs > 0
    timings: Timings | None = None  # with timings_per_token
    progress: PromptProgress | None = None


@dataclass
class Finished:
    """The last event of a request.

    stop_type is llama-server's: "eos", "limit" (n_predict, context or time),
    "word" (a stop string), "abort" (client gone) or "none".
    """

    stop_type: str
    stopping_word: str
    n_prompt_tokens: int
    n_cached: int
    n_predicted: int
    timings: Timings
    id_slot: int
    truncated: bool = False
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # for prompt tokens 1..n-1
    # time.perf_counter() when the request finished: with `timings` (queue, prompt, generation,
    # back to back up to here) it places each phase in time, for the HTTP side's trace spans.
    t_done: float = 0.0


@dataclass
class Failed:
    """The request could not run (e.g. the prompt does not fit the slot)."""

    message: str
    kind: str = "invalid_request_error"
    status: int = 400
    extra: dict[str, int] = field(default_factory=dict)
    retry_after_s: int = 0  # > 0: refused for now (a queue limit); the client may retry after this long


Event = TextDelta | Finished | Failed
EventSink = Callable[[list[Event]], None]
