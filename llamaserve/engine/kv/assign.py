"""Which idle slot a request goes to, and binding a request to the slot it got.

`choose_slot` is llama-server's rule: the slot the request names, else the idle slot whose
cached tokens share the longest prefix with the prompt (past --slot-prompt-similarity), else
the one idle longest. `bind_task` resets a slot for a new task; a leader and the followers of
n > 1 choices differ only in the state they start in and in what their KV already holds.
"""

from __future__ import annotations

import time

from llamaserve.engine.kv.slot import Slot, SlotState, Task, common_prefix_length
from llamaserve.engine.reasoning_budget import ReasoningBudget
from llamaserve.engine.runner import Sampler
from llamaserve.engine.textstream import TextStream
from llamaserve.engine.types import GenerationRequest


def choose_slot(slots: list[Slot], req: GenerationRequest, similarity: float) -> Slot | None:
    """The idle slot for req, or None when the one it names (or every slot) is busy."""
    if req.id_slot >= 0:
        slot = slots[req.id_slot]
        return None if slot.busy else slot
    idle = [s for s in slots if not s.busy]
    if not idle:
        return None
    if req.cache_prompt and req.prompt_tokens:
        best, best_len = None, 0
        for s in idle:
            n = common_prefix_length(s.cache_tokens, req.prompt_tokens)
            if n > best_len:
                best, best_len = s, n
        if best is not None and best_len / len(req.prompt_tokens) > similarity:
            return best
    return min(idle, key=lambda s: s.last_used)


def bind_task(slot: Slot, task: Task, state: SlotState, sampler: Sampler) -> None:
    """Give slot the task: its prompt, stop strings, reasoning budget and sampler (which has
    seen the prompt when its penalties read the history)."""
    req = task.request
    slot.clear_task()
    slot.task = task
    slot.prompt = list(req.prompt_tokens)
    slot.state = state
    slot.stream = TextStream(req.stop, req.n_indent)
    slot.reasoning = ReasoningBudget(req.reasoning_budget) if req.reasoning_budget is not None else None
    slot.t_start = time.perf_counter()
    slot.last_task_id = task.id
    slot.sampler = sampler
    if req.sampling.uses_history():
        for tok in slot.prompt:
            sampler.accept(tok)
