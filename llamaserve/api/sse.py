"""Sending server-sent events, and the disconnect watch shared by all routes (framing: llamaserve/sse.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Send

from llamaserve.api.keepalive import Pinger

T = TypeVar("T")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(StreamingResponse):
    """A stream of server-sent events; with `ping_after`, a ping fills each quiet gap that long."""

    def __init__(self, body: AsyncIterator[bytes], ping_after: float | None = None) -> None:
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self.ping_after = ping_after

    async def stream_response(self, send: Send) -> None:
        if self.ping_after is None:
            await super().stream_response(send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pinger = Pinger(send, self.ping_after)
        try:
            async for chunk in self.body_iterator:
                await pinger.send_chunk(chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset))
        finally:
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
