"""`-to/--timeout`: llama-server's read/write timeout, on uvicorn.

Three places a client can stall a connection, and what bounds each:
- before the headers are complete (nothing sent, or half a request line):
  `read_timeout_protocol`, uvicorn's httptools protocol with a timer armed
  until the headers are in; it answers 408 to a partial request and closes;
- while the body is arriving: `TimeoutMiddleware` bounds each `receive()` of
  the body and answers 408 in the OpenAI (or Anthropic) error envelope;
- while the answer is written: `TimeoutMiddleware` bounds each `send()`, which
  only waits when the client stops reading and the socket buffer is full
  (`WriteWatch`: one timer per request, not one per streamed token).
A generation that keeps streaming is never cut: each chunk is a fresh send,
and waiting for the client's disconnect after the body is not bounded.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llamaserve.api.direct_body import offer_direct_body
from llamaserve.api.header_case import respell_headers
from llamaserve.api.middleware import send_json
from llamaserve.errors import APIError

log = logging.getLogger("llamaserve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _TimedOut(BaseException):
    """Unwinds the app after a stalled read or write.

    A BaseException so no route or exception handler mistakes it for an error
    to answer with a 500: only `TimeoutMiddleware` catches it. The access log
    reads `http_status` on its way through.
    """

    http_status = 408


class WriteWatch:
    """Bounds each write of one response by `timeout` seconds.

    A streamed answer writes once per token, and almost every write returns at once.
    So a write only notes when it began, and one timer looks for writes older than
    the timeout; it re-arms only while writes are in flight. (An `asyncio.timeout`
    per write arms and disarms an event-loop timer per token.) A stalled write's task
    is cancelled, and the write raises TimeoutError.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._writing: dict[asyncio.Task[Any], float] = {}  # the task in a write → when it began
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def write(self, send: Send, message: Message) -> None:
        task = asyncio.current_task()
        assert task is not None  # a send always runs in a task
        self._writing[task] = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self.timeout, self._check)
        try:
            await send(message)
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            self._expired.discard(task)
            task.uncancel()
            raise TimeoutError from None
        finally:
            del self._writing[task]

    def _check(self) -> None:
        self._timer = None
        now = self._loop.time()
        oldest: float | None = None
        for task, began in self._writing.items():
            if now - began >= self.timeout:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            elif oldest is None or began < oldest:
                oldest = began
        if oldest is not None:
            self._timer = self._loop.call_at(oldest + self.timeout, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class TimeoutMiddleware:
    """Bounds each body read and each response write by `timeout` seconds (plain ASGI)."""

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False
        started = False
        stalled: str | None = None  # "read" or "write" once the client has stalled
        writes = WriteWatch(self.timeout)

        async def bounded_receive() -> Message:
            nonlocal body_done, stalled
            if body_done:
                # After the body only a disconnect can come; waiting for it is not a stall.
                return await receive()
            try:
                async with asyncio.timeout(self.timeout):
                    message = await receive()
            except TimeoutError:
                stalled = "read"
                raise _TimedOut() from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def bounded_send(message: Message) -> None:
            nonlocal started, stalled
            if message["type"] == "http.response.start":
                started = True
            try:
                await writes.write(send, message)
            except TimeoutError:
                stalled = "write"
                raise _TimedOut() from None

        try:
            await self.app(scope, bounded_receive, bounded_send)
        except BaseException:
            # Anything unwinding after a stall (the marker itself, a task group's
            # group around it, a cancellation) ends here; everything else propagates.
            if stalled is None:
                raise
            client = scope.get("client") or ("?", 0)
            log.warning(
                "%s %s from %s: %s timed out after %g s; closing the connection",
                scope.get("method"),
                scope.get("path"),
                client[0],
                stalled,
                self.timeout,
            )
            if stalled == "read" and not started:
                await self._answer_408(scope, send)
            # After a write stall the response cannot be finished: returning makes
            # uvicorn close the connection.
        finally:
            writes.close()

    async def _answer_408(self, scope: Scope, send: Send) -> None:
        err = APIError(f"request timed out: the body did not arrive within {self.timeout:g} s (--timeout)", status=408)
        anthropic = str(scope.get("path", "")).startswith("/v1/messages")
        payload = json.dumps(err.anthropic_body() if anthropic else err.openai_body()).encode()
        try:
            async with asyncio.timeout(self.timeout):
                # The rest of the body is still owed: the connection is never reused.
                await send_json(send, 408, payload, ((b"connection", b"close"),))
        except (TimeoutError, OSError):
            pass


class RespellingTransport:
    """A transport whose writes respell header names as llama-server does (api/header_case.py)."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self._inner = inner

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._inner.write(respell_headers(bytes(data)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def read_timeout_protocol(timeout: float) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol, closing connections whose headers stall; None without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn[standard] brings httptools; without it only bodies and writes are bounded
        return None

    class ReadTimeoutProtocol(HttpToolsProtocol):
        """Arms a timer from connection (or request) start until the headers are complete."""

        _header_timer: asyncio.TimerHandle | None = None
        _partial = False  # some of a request has arrived, not yet all its headers

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # The response cycles write through this wrapper (uvloop's transports take no
            # new attributes, so write cannot be replaced on the transport itself).
            self.transport = RespellingTransport(transport)  # type: ignore[assignment]
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._partial = True
            self._arm()

        def on_headers_complete(self) -> None:
            self._partial = False
            self._disarm()
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade: this request's cycle
                # Streamed bodies write their middle chunks here (api/direct_body.py); never a
                # response's head, so the header respelling is not needed on this path.
                inner = self.transport._inner if isinstance(self.transport, RespellingTransport) else self.transport
                offer_direct_body(self.scope, cycle, inner)  # type: ignore[arg-type]

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout, self._headers_timed_out)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_timed_out(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                # A pipelined request is half-sent while an answer still streams:
                # cutting the stream would punish the wrong request; look again later.
                self._arm()
                return
            if self._partial:
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()

    return ReadTimeoutProtocol
