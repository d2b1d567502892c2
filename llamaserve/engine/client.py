"""The asyncio face of the scheduler: submit, stream events back, abort.

Events cross from the scheduler thread to the event loop with
`loop.call_soon_threadsafe`, one call per request per scheduler step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from llamaserve.engine.admission import QueueFull
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, Failed, Finished, GenerationRequest

T = TypeVar("T")


def deliver(loop: asyncio.AbstractEventLoop, fn: Callable[[T], object], value: T) -> None:
    """Hand a value to the event loop from the scheduler thread.

    At shutdown the loop may close before the scheduler's last events; those
    have nobody left to read them, and the scheduler thread must not die of it.
    """
    try:
        loop.call_soon_threadsafe(fn, value)
    except RuntimeError:  # the event loop is closed
        pass


class EngineClient:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Yield TextDelta events, then one Finished or Failed.

        If the consumer stops early (client disconnect, cancellation), the
        request is aborted and its slot freed on the next scheduler step.
        """
        async for _, event in self.generate_choices([request]):
            yield event

    async def generate_choices(self, requests: list[GenerationRequest]) -> AsyncIterator[tuple[int, Event]]:
        """Events of n choices of one prompt, tagged with the choice index.

        The choices are admitted together and the prompt is decoded once.
        Ends when every choice has finished or failed.
        """
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, list[Event]]] = asyncio.Queue()

        def sink_for(index: int) -> Callable[[list[Event]], None]:
            def sink(events: list[Event]) -> None:
                deliver(loop, inbox.put_nowait, (index, events))

            return sink

        ids = [self.scheduler.next_task_id() for _ in requests]
        try:
            if len(requests) == 1:
                self.scheduler.submit(ids[0], requests[0], sink_for(0))
            else:
                self.scheduler.submit_choices(
                    [(tid, req, sink_for(i)) for i, (tid, req) in enumerate(zip(ids, requests))]
                )
        except QueueFull as full:
            yield 0, Failed(full.message, kind="rate_limit_error", status=429, retry_after_s=full.retry_after_s)
            return
        remaining = set(range(len(requests)))
        try:
            while remaining:
                index, events = await inbox.get()
                for event in events:
                    if isinstance(event, (Finished, Failed)):
                        remaining.discard(index)
                    yield index, event
        finally:
            for index in remaining:
                self.scheduler.abort(ids[index])

    async def call(self, fn: Callable[[], T], *, idle_slot: int = -1) -> T:
        """Run ``fn`` on the scheduler thread between steps and await its result.

        With ``idle_slot``, it runs once that slot's current request (if any) ends.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def reply(value: object, error: BaseException | None) -> None:
            def settle() -> None:
                if future.cancelled():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)  # type: ignore[arg-type]

            deliver(loop, lambda _: settle(), None)

        self.scheduler.call(fn, reply, idle_slot=idle_slot)
        return await future
