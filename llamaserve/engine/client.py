"""The asyncio face of the scheduler: submit, stream events back, abort.

Events cross from the scheduler thread to the event loop with
`loop.call_soon_threadsafe`, one call per request per scheduler step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, Failed, Finished, GenerationRequest

T = TypeVar("T")


class EngineClient:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Yield TextDelta events, then one Finished or Failed.

        If the consumer stops early (client disconnect, cancellation), the
        request is aborted and its slot freed on the next scheduler step.
        """
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[list[Event]] = asyncio.Queue()

        def sink(events: list[Event]) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, events)

        task_id = self.scheduler.next_task_id()
        self.scheduler.submit(task_id, request, sink)
        done = False
        try:
            while not done:
                for event in await inbox.get():
                    if isinstance(event, (Finished, Failed)):
                        done = True
                    yield event
        finally:
            if not done:
                self.scheduler.abort(task_id)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the scheduler thread between steps and await its result."""
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
            loop.call_soon_threadsafe(settle)

        self.scheduler.call(fn, reply)
        return await future
