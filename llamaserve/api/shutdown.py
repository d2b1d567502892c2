"""Graceful shutdown: in-flight requests get a grace period, then end cleanly.

uvicorn alone would wait for every open request (a long generation can run for
minutes) or, with a graceful timeout, cancel the tasks and log each one as an
"Exception in ASGI application". `DrainMiddleware` knows every in-flight
exchange; `drain(grace)` waits up to `grace` seconds and then cancels the rest
itself, finishing each answer properly: a started stream gets its final
(empty) chunk, an answer not yet started gets 503 in the error envelope.
Cancelling a generation's task closes its engine stream, which aborts the
request and frees its slot.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from llamaserve.errors import APIError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_FINISH_S = 2.0  # the closing message may wait this long on a slow client


@dataclass
class _Exchange:
    started: bool = False
    complete: bool = False
    drained: bool = False  # cancelled by drain(), not by the client or uvicorn


class DrainMiddleware:
    """Tracks in-flight HTTP exchanges so `drain` can end them (plain ASGI)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inflight: dict[asyncio.Task[Any], _Exchange] = {}

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope["type"] != "http" or task is None:
            await self.app(scope, receive, send)
            return
        exchange = _Exchange()

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                exchange.complete = True
            await send(message)

        self._inflight[task] = exchange
        try:
            await self.app(scope, receive, tracking_send)
        except BaseException:
            if not exchange.drained:
                raise
            task.uncancel()  # the cancellation was ours and is handled here
            await self._finish(scope, send, exchange)
        finally:
            self._inflight.pop(task, None)

    async def drain(self, grace: float) -> None:
        """Wait up to `grace` seconds for in-flight exchanges, then cancel what is left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._inflight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for task, exchange in list(self._inflight.items()):
            exchange.drained = True
            task.cancel()

    @staticmethod
    async def _finish(scope: Scope, send: Send, exchange: _Exchange) -> None:
        try:
            async with asyncio.timeout(_FINISH_S):
                if exchange.complete:
                    return
                if exchange.started:
                    # Ends a chunked stream (SSE) the normal way; the client sees the stream stop.
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                err = APIError("the server is shutting down", "unavailable_error")
                anthropic = str(scope.get("path", "")).startswith("/v1/messages")
                payload = json.dumps(err.anthropic_body() if anthropic else err.openai_body()).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": err.status,
                        "headers": [
                            (b"content-type", b"application/json; charset=utf-8"),
                            (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": payload})
        except (TimeoutError, OSError, RuntimeError):
            pass  # the client is gone or the answer cannot be finished: uvicorn closes the connection
