"""The scheduler's inbox: what other threads send it (requests, aborts, calls, shutdown)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llamaserve.engine.kv.slot import Task


@dataclass
class Submit:
    """One request, or the n choices of one request (they share the prompt's KV)."""

    tasks: list[Task]


@dataclass
class Abort:
    task_id: int


@dataclass
class Call:
    """Run a function on the scheduler thread (slot save/restore, state reads).

    With ``idle_slot`` set, the call waits until that slot has no request.
    """

    fn: Callable[[], object]
    reply: Callable[[object, BaseException | None], None]
    idle_slot: int = -1


@dataclass
class Shutdown:
    pass


Message = Submit | Abort | Call | Shutdown
