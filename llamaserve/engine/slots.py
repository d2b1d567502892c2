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


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Longest common prefix of two token lists.

    Binary search over slice equality keeps the comparisons in C, which
    matters for prompts of thousands of tokens checked against every slot.
    """
    hi = min(len(a), len(b))
    if hi == 0 or a[0] != b[0]:
        return 0
    if a[:hi] == b[:hi]:
        return hi
    lo = 1  # a[:lo] == b[:lo] holds; a[:hi] == b[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class Slot:
    """A sequence id in the KV cache plus the generation running on it."""

    def __init__(self, slot_id: int, n_ctx: int) -> None:
        self.id = slot_id
        self.n_ctx = n_ctx
        self.state = SlotState.IDLE
        self.cache_tokens: list[int] = []  # tokens whose KV this sequence holds, in order
        self.cache_lora: tuple[float, ...] = ()  # the LoRA scales that KV was computed with
        self.last_used = 0.0
        self.last_task_id = -1
        self.clear_task()

    def clear_task(self) -> None:
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
