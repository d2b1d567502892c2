"""--max-itl-ms: how many prompt tokens a step may carry so generating slots keep their pace.

A step that mixes a long prompt chunk with the generating slots' tokens makes
every one of those slots wait for the whole chunk. This keeps a running
estimate of what a step costs, a fixed part (the generating rows, measured on
steps without prompt work) plus a part per prompt token, and turns the latency
bound into a token budget for the prompt rows of the next step.
"""

from __future__ import annotations

# Fewer prompt tokens than this per step would stall long prompts for little latency gain.
MIN_PREFILL_TOKENS = 16
SMOOTHING = 0.2  # weight of the newest measurement in the running averages


class PrefillBudget:
    def __init__(self, max_itl_ms: int) -> None:
        self.max_itl_s = max_itl_ms / 1000.0
        self._base_s: float | None = None  # a step with generating rows only
        self._per_token_s: float | None = None  # each prompt token added to a step

    @property
    def active(self) -> bool:
        return self.max_itl_s > 0

    def observe(self, seconds: float, n_generating: int, n_prompt_tokens: int) -> None:
        """Learn from a step that took ``seconds``."""
        if not self.active:
            return
        if n_prompt_tokens == 0:
            if n_generating:
                self._base_s = seconds if self._base_s is None else self._base_s + SMOOTHING * (seconds - self._base_s)
            return
        extra = max(seconds - (self._base_s or 0.0), 0.0) / n_prompt_tokens
        self._per_token_s = (
            extra if self._per_token_s is None else self._per_token_s + SMOOTHING * (extra - self._per_token_s)
        )

    def prompt_tokens(self, available: int) -> int:
        """The prompt tokens the next step may carry beside generating rows (of ``available``)."""
        if not self.active or self._per_token_s is None or self._per_token_s <= 0:
            return available  # nothing learnt yet: the first mixed step teaches the cost
        room = (self.max_itl_s - (self._base_s or 0.0)) / self._per_token_s
        return max(MIN_PREFILL_TOKENS, min(available, int(room)))
