"""The asyncio face of the scheduler: submit, stream events back, abort.

Events cross from the scheduler thread to the event loop through a
`LoopMailbox`: the values of one scheduler step (one per request) share a
single `loop.call_soon_threadsafe` wakeup. A wakeup costs a self-pipe write on
the scheduler thread and a select return on the loop thread; with 2 cores both
steal time from ggml's threads, so N streams should not pay N of them a step.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from llamaserve.engine.admission import QueueFull
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, Failed, Finished, GenerationRequest

T = TypeVar("T")


class LoopMailbox:
    """Values posted from other threads, run on one event loop in posting order.

    Only the post that finds the mailbox empty schedules a drain; the posts
    that follow before the drain runs ride along with it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: deque[tuple[Callable[[Any], object], object]] = deque()
        self._drain_scheduled = False

    def post(self, fn: Callable[[T], object], value: T) -> None:
        with self._lock:
            self._pending.append((fn, value))
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the event loop is closed: nobody is left to read
            with self._lock:
                self._pending.clear()
                self._drain_scheduled = False

    def _drain(self) -> None:
        with self._lock:
            batch = self._pending
            self._pending = deque()
            self._drain_scheduled = False
        for fn, value in batch:
            try:
                fn(value)
            except Exception as error:  # one failing consumer must not starve the others
                self._loop.call_exception_handler({"message": "mailbox delivery failed", "exception": error})


class EventChannel:
    """One request's events on the event loop: what the mailbox delivers, awaited by one reader.

    asyncio.Queue would do, but it is built for many readers and writers (a future per
    waiting reader, a task-done count and an Event per put); this runs once per
    generated token on the thread every stream shares.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[int, list[Event]]] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: tuple[int, list[Event]]) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> tuple[int, list[Event]]:
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()


def mailbox_for(loop: asyncio.AbstractEventLoop) -> LoopMailbox:
    """The loop's one mailbox. Looked up on the loop thread, once per request, so the
    scheduler thread posts without touching this registry."""
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = LoopMailbox(loop)
        return box


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
        inbox = EventChannel(loop)
        mailbox = mailbox_for(loop)

        def sink_for(index: int) -> Callable[[list[Event]], None]:
            def sink(events: list[Event]) -> None:
                mailbox.post(inbox.put, (index, events))

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
        mailbox = mailbox_for(loop)

        def settle(outcome: tuple[object, BaseException | None]) -> None:
            value, error = outcome
            if future.cancelled():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)  # type: ignore[arg-type]

        def reply(value: object, error: BaseException | None) -> None:
            mailbox.post(settle, (value, error))

        self.scheduler.call(fn, reply, idle_slot=idle_slot)
        return await future
