"""--reasoning-budget and Anthropic's `thinking.budget_tokens`: end a reasoning block after N tokens;
`reasoning_control`: end it when the client asks (`POST /v1/chat/completions/control`).

A slot whose request carries a budget watches its own output text: inside the
reasoning block (opened by the prompt, or by the model writing the start tag)
it counts tokens, and when the budget is spent it forces the closing tokens
(the budget message, if any, then the end tag) in place of what the model
samples, so the answer follows. Text-level tags, because a model may spell a
tag with different tokens than the tokenizer would.

A request armed for control (llama-server's `reasoning_control`) carries a budget too, unlimited
unless it set one, and `force_end` starts the same closing sequence at once, as llama.cpp's
`common_reasoning_budget_force` does: only while the block is open and not already closing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReasoningBudgetSpec:
    """What the request asks for; plain data, filled in by the HTTP side."""

    budget: int  # tokens allowed inside the block; 0 closes it at once; -1: no limit
    close_tokens: tuple[int, ...]  # forced when the budget is spent: message + end tag
    start_tag: str = "<think>"
    end_tag: str = "</think>"
    opened_by_prompt: bool = False  # the generation prompt itself opened the block
    control: bool = False  # reasoning_control: the client may end the block (force_end)


@dataclass
class ReasoningBudget:
    """Per-slot state: inside the block or not, tokens spent, tokens still to force."""

    spec: ReasoningBudgetSpec
    inside: bool = False
    spent: int = 0
    done: bool = False  # the block closed (by the model or by us): nothing more to watch
    forced: deque[int] = field(default_factory=deque)
    _tail: str = ""  # recent text, to find a tag split across tokens

    def __post_init__(self) -> None:
        self.inside = self.spec.opened_by_prompt
        if self.inside and self.spec.budget == 0:
            self._close()

    def next_forced(self) -> int | None:
        """The token to put in place of the sampled one, or None."""
        return self.forced.popleft() if self.forced else None

    def force_end(self) -> bool:
        """Close the open block now (the closing tokens replace the next samples); False when
        there is nothing to close: not yet inside it, already closing, or closed."""
        if not self.inside or self.done:
            return False
        self._close()
        return True

    def observe(self, piece: str) -> None:
        """Account for one generated token's text."""
        if self.done or self.forced:
            return
        window = self._tail + piece
        self._tail = window[-64:]
        if not self.inside:
            if self.spec.start_tag in window:
                self.inside = True
                self._tail = window[window.index(self.spec.start_tag) + len(self.spec.start_tag) :]
                if self.spec.budget == 0:
                    self._close()
            return
        if self.spec.end_tag in window:
            self.done = True
            return
        self.spent += 1
        if 0 <= self.spec.budget <= self.spent:
            self._close()

    def _close(self) -> None:
        self.forced.extend(self.spec.close_tokens)
        self.done = True
