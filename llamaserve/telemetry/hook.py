"""Where the HTTP side's generation code hands each finished choice to the request's trace.

Plain Python, no OpenTelemetry: `serving/generate.py` calls `note_finished` for every
`Finished` it sees, which costs one context-variable read when tracing is off. With tracing
on, the request's span (telemetry/middleware.py) opens a collector first; a context
variable carries it into the route, into the tasks a streamed body runs in (each copies the
context, and so the same list) and back out.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamaserve.engine.types import Finished

_collector: ContextVar[list[tuple[int, Finished]] | None] = ContextVar("llamaserve_trace_finished", default=None)


def note_finished(choice: int, event: Finished) -> None:
    """Hands a finished choice (its index among the request's n) to the current request's
    trace, if one is collecting."""
    collected = _collector.get()
    if collected is not None:
        collected.append((choice, event))


def start_collecting() -> tuple[list[tuple[int, Finished]], Token[list[tuple[int, Finished]] | None]]:
    """A fresh list that this context's `note_finished` calls fill, and the token to stop it."""
    collected: list[tuple[int, Finished]] = []
    return collected, _collector.set(collected)


def stop_collecting(token: Token[list[tuple[int, Finished]] | None]) -> None:
    _collector.reset(token)
