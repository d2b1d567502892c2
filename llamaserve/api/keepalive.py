"""--sse-ping-interval: an SSE comment after N quiet seconds, so proxies and clients with
idle timeouts (undici's, nginx's) keep a stream whose model is busy elsewhere.

The bytes are llama-server's (server-context.cpp): `:\\n\\n`, a comment line that every
SSE parser skips. The clock restarts after every chunk, the ping included, as there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")

PING = b":\n\n"


def ping_seconds(interval: int) -> float | None:
    """The configured interval in seconds; None when pings are off (-1, or any value < 1)."""
    return float(interval) if interval > 0 else None


async def next_of(items: AsyncIterator[T]) -> T:
    return await items.__anext__()


async def arrives_within(task: asyncio.Future[T], seconds: float | None) -> bool:
    """Whether `task` is done within `seconds` (None: waits for it); never cancels it."""
    done, _ = await asyncio.wait({task}, timeout=seconds)
    return bool(done)


async def with_pings(chunks: AsyncIterator[bytes], seconds: float | None) -> AsyncGenerator[bytes, None]:
    """`chunks`, with PING whenever none came for `seconds`."""
    if seconds is None:
        async for chunk in chunks:
            yield chunk
        return
    pending = asyncio.ensure_future(next_of(chunks))
    try:
        while True:
            if not await arrives_within(pending, seconds):
                yield PING
                continue
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                return
            yield chunk
            pending = asyncio.ensure_future(next_of(chunks))
    finally:
        # The client went away, or the stream ended: stop the producer and let its
        # `finally` run (that is what aborts the generation and frees the slot).
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
            await pending
        closer = getattr(chunks, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()
