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
    # Waiting for another sequence's prefill to write the prompt prefix this one will share
    # (engine/kv/sharing.py); then it prefills only its own suffix.
    JOINING = "joining"
    GENERATING = "generating"


@dataclass
class Task:
    """A request as the scheduler holds it."""

    id: int
    request: GenerationRequest
    sink: EventSink
    t_submit: float = 0.0  # perf_counter() when it was submitted: the queue time starts there


@dataclass
class Lent:
    """A sequence's first ``n`` cells, tagged from ``lender`` when its kv_epoch was ``epoch``:
    while the lender has cut nothing since, those cells are the lender's too (counted once)."""

    lender: Slot
    epoch: int
    n: int

    def holds(self) -> bool:
        """The lender still holds the lent cells (it cut nothing since)."""
        return self.lender.kv_epoch == self.epoch


@dataclass
class Join:
    """A request waiting for ``leader``'s prefill (of task ``task_id``) to write its first ``n``
    prompt tokens, which it then shares instead of computing them."""

    leader: Slot
    task_id: int
    n: int


def common_prefix_length(a: list[int], b: list[int], start: int = 0) -> int:
    """Longest common prefix of two token lists (whose first ``start`` tokens are taken as equal:
    the caller knows it, or checks it apart).

    Slice comparisons keep the work in C, which matters for prompts of thousands of
    tokens checked against every slot and cache entry. Chunks that double in size
    walk the equal part, so the slices copied add up to about twice the prefix
    (a binary search from the start copies that much at every one of its steps);
    the chunk holding the first difference is then halved down to it.
    """
    n = min(len(a), len(b))
    done, step = min(start, n), 64  # a[:done] == b[:done]
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
        # Cell sharing with other sequences of a unified KV (engine/kv/sharing.py). kv_version
        # grows whenever cells are cut from this sequence (the prefix index then hashes it
        # again); kv_epoch when the cut reached cells a peer may hold, so a borrower can tell
        # that the cells it borrowed may now be its own alone. lent: the leading cells this sequence
        # borrowed (by seq_cp) from another one. peers: every sequence that may hold some of
        # this one's cells, with the position below which they may (conservative: a peer's
        # bound only ever shrinks when one of the two cuts its cells).
        self.kv_version = 0
        self.kv_epoch = 0
        self.lent: Lent | None = None
        self.peers: dict[int, int] = {}
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
        self.joining: Join | None = None  # SlotState.JOINING: whose prefill it waits for
        self.n_shared = 0  # of the prompt's cached tokens, those shared with another sequence

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE

    @property
    def n_past(self) -> int:
        return len(self.cache_tokens)

    @property
    def prompt_remaining(self) -> int:
        return len(self.prompt) - len(self.cache_tokens)
