"""The scheduler-to-event-loop mailbox: order kept, wakeups shared, shutdown survived."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from llamaserve.engine.client import LoopMailbox


def test_values_from_another_thread_arrive_in_order_with_shared_wakeups() -> None:
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        box = LoopMailbox(loop)
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(callback, *args):  # type: ignore[no-untyped-def]
            nonlocal wakeups
            wakeups += 1
            return real(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        received: list[int] = []
        done = asyncio.Event()

        def take(value: int) -> None:
            received.append(value)
            if value == 999:
                done.set()

        def producer() -> None:
            for value in range(1000):
                box.post(take, value)

        thread = threading.Thread(target=producer)
        thread.start()
        await asyncio.wait_for(done.wait(), 10)
        thread.join()
        return received, wakeups

    received, wakeups = asyncio.run(main())
    assert received == list(range(1000))
    # A burst posted faster than the loop drains shares wakeups; at worst one per value.
    assert 1 <= wakeups < 1000


def test_a_failing_consumer_does_not_drop_the_values_behind_it() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, _ctx: None)
        box = LoopMailbox(loop)
        got: list[str] = []

        def boom(_: str) -> None:
            raise ValueError("consumer bug")

        box.post(boom, "x")
        box.post(got.append, "after")
        await asyncio.sleep(0.05)
        return got

    assert asyncio.run(main()) == ["after"]


class Value:
    """A posted value that can be watched for being let go (a str or an int cannot be weakly referenced)."""


def test_delivery_to_a_closed_loop_is_dropped_quietly() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    box = LoopMailbox(loop)
    got: list[Value] = []
    first, second = Value(), Value()
    watched = [weakref.ref(first), weakref.ref(second)]
    box.post(got.append, first)  # must not raise on the scheduler thread
    box.post(got.append, second)  # nor does the next one, which must not wait for a drain that never comes
    del first, second
    gc.collect()
    assert got == []
    # Dropped means let go: a mailbox that kept undeliverable values would grow for as long as
    # the scheduler thread outlives the loop.
    assert [ref() for ref in watched] == [None, None]
