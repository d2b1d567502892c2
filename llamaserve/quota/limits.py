"""Per-key limits over a sliding minute: requests, tokens, requests in flight.

A request is admitted when the key has a free concurrency place, fewer than its
requests-per-minute admitted in the last 60 s, and fewer than its tokens-per-minute
charged in the last 60 s. Tokens are charged when a request ends, with what it really
used (prompt + completion, from the answer's own counts): the prompt's size is not known
before the model's tokenizer has seen it, and a guess would refuse or admit wrongly.
So a key over its token budget is refused until enough of the minute has passed, and
the requests admitted while it was still under the budget may take it past it once.

Everything here runs on the event loop thread (no locks): admission and the charge are
plain calls from the quota middleware.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from llamaserve.quota.policy import KeyPolicy

WINDOW_S = 60.0


@dataclass(frozen=True)
class Refusal:
    limit: str  # the config field that refused: requests_per_minute, tokens_per_minute, max_concurrent
    message: str
    retry_after_s: int


@dataclass
class _KeyState:
    admitted: deque[float] = field(default_factory=deque)  # admission times in the window
    charges: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens) in the window
    tokens_in_window: int = 0
    in_flight: int = 0

    def prune(self, now: float) -> None:
        edge = now - WINDOW_S
        while self.admitted and self.admitted[0] <= edge:
            self.admitted.popleft()
        while self.charges and self.charges[0][0] <= edge:
            self.tokens_in_window -= self.charges.popleft()[1]


def _seconds(until: float, now: float) -> int:
    return max(1, math.ceil(until - now))


class Limiter:
    def __init__(self) -> None:
        self._keys: dict[str, _KeyState] = {}

    def _state(self, name: str) -> _KeyState:
        state = self._keys.get(name)
        if state is None:
            state = self._keys[name] = _KeyState()
        return state

    def admit(self, policy: KeyPolicy, now: float) -> Refusal | None:
        """None and the request counted in, or the first limit that refuses it."""
        state = self._state(policy.name)
        state.prune(now)
        cap = policy.max_concurrent
        if cap is not None and state.in_flight >= cap:
            return Refusal(
                "max_concurrent", f"key '{policy.name}' has {cap} requests in flight, its max_concurrent limit", 1
            )
        rpm = policy.requests_per_minute
        if rpm is not None and len(state.admitted) >= rpm:
            wait = _seconds(state.admitted[0] + WINDOW_S, now)
            return Refusal(
                "requests_per_minute",
                f"key '{policy.name}' reached its requests_per_minute limit of {rpm}; retry in {wait} s",
                wait,
            )
        tpm = policy.tokens_per_minute
        if tpm is not None and state.tokens_in_window >= tpm:
            wait = _seconds(self._under_budget_at(state, tpm), now)
            return Refusal(
                "tokens_per_minute",
                f"key '{policy.name}' used {state.tokens_in_window} tokens in the last minute, "
                f"over its tokens_per_minute limit of {tpm}; retry in {wait} s",
                wait,
            )
        state.admitted.append(now)
        state.in_flight += 1
        return None

    @staticmethod
    def _under_budget_at(state: _KeyState, tpm: int) -> float:
        """When enough of the window's charges will have expired to be under the budget."""
        left = state.tokens_in_window
        for at, tokens in state.charges:
            left -= tokens
            if left < tpm:
                return at + WINDOW_S
        return state.charges[-1][0] + WINDOW_S if state.charges else 0.0

    def finish(self, name: str, tokens: int, now: float) -> None:
        """The request ended: its place freed, the tokens it used charged to the window."""
        state = self._state(name)
        state.in_flight = max(0, state.in_flight - 1)
        if tokens > 0:
            state.charges.append((now, tokens))
            state.tokens_in_window += tokens
