"""A request's event channel: what the mailbox puts arrives in order, and a reader that
gave up (its stream was cancelled) leaves nothing behind."""

from __future__ import annotations

import asyncio

from llamaserve.engine.client import EventChannel
from llamaserve.engine.types import Event


def batch(n: int) -> tuple[int, list[Event]]:
    return n, []


def test_events_arrive_in_order_whether_put_before_or_while_the_reader_waits() -> None:
    async def scenario() -> list[int]:
        channel = EventChannel(asyncio.get_running_loop())
        channel.put(batch(1))
        channel.put(batch(2))
        got = [(await channel.get())[0], (await channel.get())[0]]
        waiting = asyncio.ensure_future(channel.get())
        await asyncio.sleep(0)  # the reader is now waiting on an empty channel
        channel.put(batch(3))
        channel.put(batch(4))
        got += [(await waiting)[0], (await channel.get())[0]]
        return got

    assert asyncio.run(scenario()) == [1, 2, 3, 4]


def test_a_cancelled_read_leaves_the_channel_usable() -> None:
    async def scenario() -> int:
        channel = EventChannel(asyncio.get_running_loop())
        reader = asyncio.ensure_future(channel.get())
        await asyncio.sleep(0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        channel.put(batch(5))  # a put after the cancelled wait must neither fail nor be lost
        return (await channel.get())[0]

    assert asyncio.run(scenario()) == 5
