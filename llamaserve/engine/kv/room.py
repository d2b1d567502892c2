"""Whether a unified KV cache has room to start one more request.

With a unified KV cache every slot draws cells from one pool, so the number of slots no longer
bounds memory: what does is the cells the running requests hold and will still write. A request
starts only when its prompt and the answer it asked for fit beside theirs; otherwise it waits
for one of them to finish, instead of starting and then failing every request in the cache with
llama_decode's "no memory slot" (which is what llama-server does once the pool runs out).

An answer without max_tokens reserves nothing: its length is unknown, and reserving the whole
context for it would serialise every such request.
"""

from __future__ import annotations

from collections.abc import Iterable

from llamaserve.engine.kv.sharing import lent_cells
from llamaserve.engine.kv.slot import Slot
from llamaserve.engine.types import GenerationRequest


def answer_cells(req: GenerationRequest, generated: int = 0) -> int:
    """The cells the rest of this request's answer takes (0 when it set no limit)."""
    return max(req.n_predict - generated, 0) if req.n_predict > 0 else 0


def claimed_cells(slots: Iterable[Slot]) -> int:
    """Cells the busy slots hold now or will write: the whole prompt and the rest of the answer."""
    total = 0
    for slot in slots:
        if slot.task is None:
            continue
        req = slot.task.request
        # The part of its prompt whose cells a busy lender holds is counted in the lender.
        total += max(len(slot.prompt), slot.n_past) - lent_cells(slot) + answer_cells(req, len(slot.generated))
    return total


def request_cells(req: GenerationRequest, n_choices: int) -> int:
    """Cells a request needs: its prompt and each choice's answer."""
    return len(req.prompt_tokens) + n_choices * answer_cells(req)


class KVRoom:
    """The pool's free cells during one admission pass.

    A request that does not fit keeps its claim on what is free: the requests behind it start
    only in the room left beside it, so a stream of short prompts never starves a long one.
    """

    def __init__(self, slots: list[Slot], n_cells: int) -> None:
        busy = [s for s in slots if s.busy]
        self.anything_running = bool(busy)
        self.free = n_cells - claimed_cells(busy)

    def take(self, req: GenerationRequest, n_choices: int) -> bool:
        """Claim room for the request; False: it must wait (its need stays claimed)."""
        need = request_cells(req, n_choices)
        fits = not self.anything_running or need <= self.free
        self.free -= need
        self.anything_running = True
        return fits
