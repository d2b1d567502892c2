"""--sse-ping-interval's wrapper (api/keepalive.py): pings only in quiet gaps, none when off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llamaserve.api.keepalive import PING, ping_seconds, with_pings


async def _slow(gaps: list[float]) -> AsyncIterator[bytes]:
    for i, gap in enumerate(gaps):
        await asyncio.sleep(gap)
        yield f"data: {i}\n\n".encode()


async def _collect(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


def test_a_ping_fills_each_quiet_interval() -> None:
    out = asyncio.run(_collect(with_pings(_slow([0.0, 0.25, 0.0]), 0.1)))
    assert out[0] == b"data: 0\n\n" and out[-2:] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert out[1:-2] and set(out[1:-2]) == {PING}
    assert PING == b":\n\n"  # llama-server's bytes


def test_no_pings_when_off_or_busy() -> None:
    assert ping_seconds(-1) is None and ping_seconds(0) is None and ping_seconds(30) == 30.0
    assert asyncio.run(_collect(with_pings(_slow([0.05, 0.05]), None))) == [b"data: 0\n\n", b"data: 1\n\n"]
    assert PING not in asyncio.run(_collect(with_pings(_slow([0.0, 0.0]), 0.2)))


def test_closing_the_stream_closes_the_producer() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield b"data: x\n\n"
        finally:
            closed.set()

    async def run() -> None:
        pinged = with_pings(endless(), 1.0)
        await pinged.__anext__()
        await pinged.aclose()
        assert closed.is_set()

    asyncio.run(run())
