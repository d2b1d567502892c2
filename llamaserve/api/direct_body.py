"""A streamed body's chunks written straight to the connection, past the middleware's send wrappers.

A streamed answer sends one body message per token, and each message passes every middleware's
send wrapper (access log, CORS, timeouts, shutdown tracking, tracing, ...) before uvicorn frames
it: with 256 streams that chain costs more of the event loop than the JSON does. None of those
wrappers looks at a body chunk in the middle of a stream: they act on the response's start and on
its last message, and the write timeout acts only on a write that has to wait. So uvicorn's
protocol (api/timeouts.py) puts a `DirectBody` for the request's response into the scope's
extensions, and the SSE response (api/sse.py) writes each middle chunk through it, framed exactly
as uvicorn frames it. The start, the last message, and any chunk that could not be written at
once (the client stopped reading, the connection is gone, the response is not a chunked one) go
through the ordinary `send`, so every wrapper still sees what it acts on, and a stalled client
still meets the write timeout in uvicorn's own wait.

A middleware that changes or reads a response's body chunks must take the extension out of
the scope it hands on (`without_direct_body`), or the chunks would pass it by.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, Protocol

EXTENSION = "llamaserve.direct_body"


class _Flow(Protocol):
    write_paused: bool


class _Cycle(Protocol):
    """What of uvicorn's RequestResponseCycle (httptools_impl) this reads."""

    flow: _Flow
    disconnected: bool
    response_started: bool
    response_complete: bool
    chunked_encoding: bool | None


class DirectBody:
    """Writes a chunk of the response's body now, when that is what uvicorn's send would do."""

    __slots__ = ("_cycle", "_transport")

    def __init__(self, cycle: _Cycle, transport: asyncio.WriteTransport) -> None:
        self._cycle = cycle
        self._transport = transport

    def write(self, chunk: bytes | memoryview) -> bool:
        """True once the chunk is written; False when it must go through `send` (nothing written)."""
        cycle = self._cycle
        if (
            cycle.flow.write_paused  # the client is behind: send waits, bounded by the write timeout
            or cycle.disconnected
            or not cycle.response_started
            or cycle.response_complete
            or cycle.chunked_encoding is not True  # a HEAD, or a body with a content-length
            or not chunk
        ):
            return False
        data = chunk if isinstance(chunk, bytes) else bytes(chunk)
        # uvicorn's chunked framing of a body message with more to come (httptools_impl.send).
        self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return True


def direct_body(scope: MutableMapping[str, Any]) -> DirectBody | None:
    """The request's direct writer, None when the server or a middleware offers none."""
    extensions = scope.get("extensions")
    writer = extensions.get(EXTENSION) if extensions else None
    return writer if isinstance(writer, DirectBody) else None


def offer_direct_body(scope: MutableMapping[str, Any], cycle: _Cycle, transport: asyncio.WriteTransport) -> None:
    """Called by the HTTP protocol once the request's cycle exists."""
    extensions = scope.get("extensions")
    if extensions is None:
        extensions = scope["extensions"] = {}
    extensions[EXTENSION] = DirectBody(cycle, transport)


def without_direct_body(scope: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """`scope` for an app whose body chunks the caller must see: a copy without the writer."""
    extensions = scope.get("extensions")
    if not extensions or EXTENSION not in extensions:
        return scope
    return {**scope, "extensions": {k: v for k, v in extensions.items() if k != EXTENSION}}
