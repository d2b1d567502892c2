"""Slot state: one KV-cache sequence and the request it is serving, if any."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llamaserve.engine.reasoning_budget import ReasoningBudget
from llamaserve.engine.runner import Sampler
from llamaserve.engine.textstream import TextStream
from llamaserve.engine.types import EventSink, GenerationRequest, TokenLogprob


class SlotState(enum.Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    FOLLOWING = "following"  # an n > 1 choice waiting for its leader's prompt KV
    GENERATING = "generating"


@dataclass
class Task:
    """A request as the scheduler holds it."""

    id: int
    request: GenerationRequest
    sink: EventSink
    t_submit: float = 0.0  # perf_counter() when it was submitted: the queue time starts there


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Longest common prefix of two token lists.

    Slice comparisons keep the work in C, which matters for prompts of thousands of
    tokens checked against every slot and cache entry. Chunks that double in size
    walk the equal part, so the slices copied add up to about twice the prefix
    (a binary search from the start copies that much at every one of its steps);
    the chunk holding the first difference is then halved down to it.
    """
    n = min(len(a), len(b))
    done, step = 0, 64  # a[:done] == b[:done]
    while done < n:
        end = min(done + step, n)
        if a[done:end] != b[done:end]:
            break
        done, step = end, step * 2
    else:
        return n
    lo, hi = done, min(done + step, n)  # the first difference is in [lo, hi)
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


class Slot:
    """A sequence id in the KV cache plus the generation running on it."""

    def __init__(self, slot_id: int, n_ctx: int) -> None:
        self.id = slot_id
        self.n_ctx = n_ctx
        self.state = SlotState.IDLE
        self.cache_tokens: list[int] = []  # tokens whose KV this sequence holds, in order
        self.cache_lora: tuple[float, ...] = ()  # the LoRA scales that KV was computed with
        # Block hashes (engine/kv/blocks.py) of a leading part of cache_tokens, so parking
        # the KV in the host-memory cache need not hash the whole sequence again.
        self.cache_hashes: list[int] = []
        self.last_used = 0.0
        self.last_task_id = -1
        self.clear_task()

    def clear_task(self) -> None:
        # The host-memory prompt cache holds a copy of this KV: set when parked; a task starting
        # or ending here means the sequence changed.
        self.kv_in_host_cache = False
        self.task: Task | None = None
        self.sampler: Sampler | None = None
        self.prompt: list[int] = []
        self.n_cached = 0
        self.next_token: int | None = None  # sampled, not yet decoded
        self.generated: list[int] = []
        self.unsent_tokens: list[int] = []
        self.unsent_logprobs: list[TokenLogprob] = []
        self.followers: list[Slot] = []  # slots of the other n > 1 choices sharing this prompt
        self.prompt_logprobs: list[TokenLogprob] = []
        self.truncated = False  # a context shift dropped tokens during this request
        self.stream = TextStream()
        self.reasoning: ReasoningBudget | None = None  # with a reasoning budget
        self.t_start = 0.0
        self.t_prompt_done = 0.0
        # Prompt tokens other slots' prefills were given while this one waited (admission.py).
        self.prefill_credit = 0
        self.n_draft = 0  # speculative decoding: draft tokens verified for this request
        self.n_draft_accepted = 0

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE

    @property
    def n_past(self) -> int:
        return len(self.cache_tokens)

    @property
    def prompt_remaining(self) -> int:
        return len(self.prompt) - len(self.cache_tokens)
