"""Sending server-sent events, and the disconnect watch shared by all routes (framing: llamaserve/sse.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from llamaserve.api.direct_body import DirectBody, direct_body
from llamaserve.api.keepalive import Pinger, body_message

T = TypeVar("T")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    """A stream of server-sent events; with `ping_after`, a ping fills each quiet gap that long.

    The middle chunks go straight to the connection when the server offers that
    (api/direct_body.py); the start and the end pass every middleware as usual."""

    def __init__(self, body: AsyncIterator[bytes], ping_after: float | None = None) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self.ping_after = ping_after
        self._direct: DirectBody | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._direct = direct_body(scope)
        await super().__call__(scope, receive, send)

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        direct = self._direct
        pinger = Pinger(send, self.ping_after) if self.ping_after is not None else None
        try:
            async for chunk in self.body_iterator:
                data = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
                if pinger is not None:
                    pinger.chunk_sent()
                if direct is None or not direct.write(data):
                    await send(body_message(data))
        finally:
            if pinger is not None:
                pinger.stop()
            # A client that left ends the loop on a failed write: closing the body now runs
            # its `finally` (which aborts the generation) instead of whenever it is collected.
            closer = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                await closer()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def sse_response(body: AsyncIterator[bytes], ping_after: float | None = None) -> StreamingResponse:
    return SSEResponse(body, ping_after)


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it as soon as the client disconnects.

    Cancelling the work closes the engine's event stream, which aborts the
    request and frees its slot on the next scheduler step.
    """
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        raise ClientGone()
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
