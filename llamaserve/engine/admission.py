"""Which waiting request goes first, and when a request is refused instead of queued.

llama-server queues without bound and serves in arrival order. Here a request
may carry a `priority` (lower goes first, as in vLLM), and `--max-queue` /
`--max-queue-tokens` bound what waits for a slot: past them a request is
refused at once (HTTP 429 with Retry-After) rather than waiting without end.

`AdmissionControl` is used from two threads: HTTP handlers call `enter` when
they submit, the scheduler thread calls `leave` when a request stops waiting
(it got a slot, was aborted or failed) and `set_idle_slots` when a slot starts or frees. One
lock guards the counters; both sides hold it for a few additions.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueLimits:
    max_requests: int = -1  # --max-queue: requests waiting for a slot; -1: no limit
    max_tokens: int = -1  # --max-queue-tokens: their prompt tokens together; -1: no limit


class QueueFull(Exception):
    """The request would wait past a queue limit: refuse it now, suggest when to retry."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class AdmissionControl:
    """Counts what waits for a slot and refuses what would exceed the limits."""

    def __init__(self, limits: QueueLimits, n_slots: int) -> None:
        self.limits = limits
        self.n_slots = n_slots
        self._lock = threading.Lock()
        self._pending = 0  # submitted and not yet started, aborted or failed
        self._pending_tokens = 0
        self._idle_slots = n_slots
        # A moving average of how long a request holds a slot, for Retry-After.
        self._service_s = 1.0

    def enter(self, n_requests: int, n_tokens: int) -> None:
        """Count a submission (n choices of one prompt), or raise QueueFull."""
        limits = self.limits
        with self._lock:
            ahead = self._pending + n_requests - self._idle_slots  # would wait for a slot
            over_requests = limits.max_requests >= 0 and ahead > limits.max_requests
            over_tokens = limits.max_tokens >= 0 and ahead > 0 and self._pending_tokens + n_tokens > limits.max_tokens
            if over_requests or over_tokens:
                waiting = max(ahead - n_requests, 0)
                retry = max(1, min(3600, math.ceil(self._service_s * (waiting + 1) / max(self.n_slots, 1))))
                what = (
                    f"{waiting} requests are waiting (--max-queue {limits.max_requests})"
                    if over_requests
                    else f"the queued prompts hold {self._pending_tokens} tokens "
                    f"(--max-queue-tokens {limits.max_tokens})"
                )
                raise QueueFull(f"the server is busy: {what}; retry later", retry)
            self._pending += n_requests
            self._pending_tokens += n_tokens

    def leave(self, n_requests: int, n_tokens: int) -> None:
        """Requests stopped waiting: they got a slot, were aborted, or failed."""
        with self._lock:
            self._pending = max(self._pending - n_requests, 0)
            self._pending_tokens = max(self._pending_tokens - n_tokens, 0)

    def set_idle_slots(self, n: int) -> None:
        with self._lock:
            self._idle_slots = n

    def served(self, seconds: float) -> None:
        """A request released its slot after holding it this long."""
        with self._lock:
            self._service_s += 0.1 * (seconds - self._service_s)

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens


def prefill_order(priority: int, remaining: int, credit: int) -> tuple[int, int]:
    """Sort key of a slot in prefill: priority first, then the least work left.

    A prompt that another one overtook earns, as credit, the tokens spent on the others
    while it waited, and its key shrinks by them: a long prompt waits for at most its
    own length in other prompts' work, so a stream of short prompts never starves it.
    """
    return priority, remaining - credit
