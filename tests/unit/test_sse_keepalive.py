"""--sse-ping-interval (api/keepalive.py, api/sse.py): pings only in quiet gaps, none when
off, none after the response's last message, and a client that leaves closes the body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from llamaserve.api.keepalive import PING, ping_seconds
from llamaserve.api.sse import SSEResponse


async def _slow(gaps: list[float]) -> AsyncIterator[bytes]:
    for i, gap in enumerate(gaps):
        await asyncio.sleep(gap)
        yield f"data: {i}\n\n".encode()


async def _wire(body: AsyncIterator[bytes], ping_after: float | None, linger: float = 0.0) -> list[Any]:
    """What the response sends: b"start", then each body, then b"end" for the last message.
    `linger` keeps listening that long after the response returned."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            sent.append(b"start")
        elif message.get("more_body", False):
            sent.append(message["body"])
        else:
            sent.append(b"end")

    await SSEResponse(body, ping_after).stream_response(send)
    await asyncio.sleep(linger)
    return sent


def test_a_ping_fills_each_quiet_interval() -> None:
    out = asyncio.run(_wire(_slow([0.0, 0.25, 0.0]), 0.1))
    assert out[:2] == [b"start", b"data: 0\n\n"] and out[-3:] == [b"data: 1\n\n", b"data: 2\n\n", b"end"]
    pings = out[2:-3]
    assert 1 <= len(pings) <= 2 and set(pings) == {PING}
    assert PING == b":\n\n"  # llama-server's bytes


def test_no_pings_when_off_or_busy() -> None:
    assert ping_seconds(-1) is None and ping_seconds(0) is None and ping_seconds(30) == 30.0
    expected = [b"start", b"data: 0\n\n", b"data: 1\n\n", b"end"]
    assert asyncio.run(_wire(_slow([0.15, 0.15]), None)) == expected
    assert asyncio.run(_wire(_slow([0.0, 0.05]), 0.2)) == expected


def test_no_ping_follows_the_last_message() -> None:
    # The body ends just before a ping is due; the timer must not outlive the response.
    out = asyncio.run(_wire(_slow([0.0, 0.09]), 0.1, linger=0.3))
    assert out[-1] == b"end" and out.count(b"end") == 1


def test_a_client_that_leaves_closes_the_body() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield b"data: x\n\n"
        finally:
            closed.set()

    async def run() -> None:
        sent = 0

        async def send(message: Any) -> None:
            nonlocal sent
            sent += 1
            if sent == 3:  # the start, one chunk, then the socket is gone
                raise OSError("connection reset")

        try:
            await SSEResponse(endless(), 1.0).stream_response(send)
        except OSError:
            pass
        assert closed.is_set()

    asyncio.run(run())
