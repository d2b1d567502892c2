"""--sse-ping-interval: an SSE comment after N quiet seconds, so proxies and clients with
idle timeouts (undici's, nginx's) keep a stream whose model is busy elsewhere.

The bytes are llama-server's (server-context.cpp): `:\\n\\n`, a comment line that every
SSE parser skips. The clock restarts after every chunk, the ping included, as there.

The pings come from one timer task per response (`Pinger`), which sends them beside the
body's chunks. A chunk only notes the time it went out: racing each chunk against a
timeout instead costs a task and a wait per token, on the thread that serves every stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

from starlette.requests import Request
from starlette.types import Message, Send

T = TypeVar("T")

PING = b":\n\n"


def ping_seconds(interval: int) -> float | None:
    """The configured interval in seconds; None when pings are off (-1, or any value < 1)."""
    return float(interval) if interval > 0 else None


def request_ping_seconds(request: Request, asked: int | None = None) -> float | None:
    """The ping interval of a stream answering `request`: the request's own `sse_ping_interval`
    when it sets one (llama-server's per-request override), else the server's --sse-ping-interval."""
    if asked is not None:
        return ping_seconds(asked)
    return ping_seconds(getattr(request.app.state, "sse_ping_interval", -1))


async def next_of(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


async def arrives_within(task: asyncio.Future[T], seconds: float | None) -> bool:
    """Whether `task` is done within `seconds` (None: waits for it); never cancels it."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return bool(done)


def body_message(chunk: bytes | memoryview) -> Message:
    return {"type": "http.response.body", "body": chunk, "more_body": True}


class Pinger:
    """Sends PING through `send` whenever `seconds` pass without a chunk.

    Start it once the response has started; call `chunk_sent` for each of the body's chunks
    (before writing it: a chunk written straight to the connection, api/direct_body.py, never
    passes `send`); `stop` it before the last body message (a ping after that would break the
    response).
    """

    def __init__(self, send: Send, seconds: float) -> None:
        self._send = send
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._task = self._loop.create_task(self._run())

    def chunk_sent(self) -> None:
        self._last = self._loop.time()

    async def _run(self) -> None:
        while True:
            quiet_for = self._loop.time() - self._last
            if quiet_for < self._seconds:
                await asyncio.sleep(self._seconds - quiet_for)
                continue
            self._last = self._loop.time()
            await self._send(body_message(PING))

    def stop(self) -> None:
        """No ping goes out once this returns: a cancelled task never resumes past the
        await it is in, and a write happens only after its last await."""
        self._task.cancel()
        self._task.add_done_callback(_seen)


def _seen(task: asyncio.Task[None]) -> None:
    """Marks a failed ping write (the client left) as seen: the body's next write reports it."""
    if not task.cancelled():
        task.exception()
