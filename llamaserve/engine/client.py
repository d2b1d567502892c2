"""The engine's one front for the HTTP side: submit, stream events back, abort, and read.

`EngineClient` is all that `serving/` and `api/` see of the engine, the way llama-server's
HTTP code sees only `server_response_reader` and never a slot: generation, calls run on
the scheduler thread, slot views, the /metrics counters, the speculative settings /props
shows, the host cache's size, the queue's figures, slot files, and stopping. The
scheduler it wraps stays private, so the routes cannot come to depend on its internals
(`tests/unit/test_layering.py` checks that they do not try).

Events cross from the scheduler thread to the event loop through a
`LoopMailbox`: the values of one scheduler step (one per request) share a
single `loop.call_soon_threadsafe` wakeup. A wakeup costs a self-pipe write on
the scheduler thread and a select return on the loop thread; with 2 cores both
steal time from ggml's threads, so N streams should not pay N of them a step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from llamaserve.engine.admission import QueueFull
from llamaserve.engine.kv.files import SlotFileError as SlotFileError  # re-exported: the slot actions' error
from llamaserve.engine.kv.files import SlotFiles, validate_filename
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.stats import SchedulerStats
from llamaserve.engine.types import Event, Failed, Finished, GenerationRequest
from llamaserve.engine.views import SlotView, slot_view

log = logging.getLogger("llamaserve")

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
    """The engine as the HTTP side uses it; the composition root builds it over a started scheduler."""

    def __init__(
        self, scheduler: Scheduler, *, slot_files: SlotFiles | None = None, persist_slots: bool = False
    ) -> None:
        self._scheduler = scheduler
        self._slot_files = slot_files  # with --slot-save-path
        self._persist_slots = persist_slots and slot_files is not None  # --cache-persist

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

        scheduler = self._scheduler
        ids = [scheduler.next_task_id() for _ in requests]
        try:
            if len(requests) == 1:
                scheduler.submit(ids[0], requests[0], sink_for(0))
            else:
                scheduler.submit_choices([(tid, req, sink_for(i)) for i, (tid, req) in enumerate(zip(ids, requests))])
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
                scheduler.abort(ids[index])

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

        self._scheduler.call(fn, reply, idle_slot=idle_slot)
        return await future

    async def end_reasoning(self, completion_id: str) -> tuple[bool, str]:
        """llama-server's `reasoning_end` control: the running generation(s) of `completion_id`
        close their reasoning block now. (success, why not): llama-server's answer and messages.

        Every choice of the id is ended (llama-server acts on the first slot it finds). A
        request still waiting for a slot is not running yet, so it is not found, as there."""
        slots = self._scheduler.slots

        def act() -> tuple[bool, str]:
            found = [
                s for s in slots if s.busy and s.task is not None and s.task.request.completion_id == completion_id
            ]
            if not completion_id or not found:
                return False, "no active completion for this id"
            budgets = [s.reasoning for s in found if s.reasoning is not None and s.reasoning.spec.control]
            if not budgets:
                return False, "reasoning control not enabled for this completion"
            for budget in budgets:
                # As llama-server: success once armed, whether or not a block was open to close.
                budget.force_end()
            return True, ""

        return await self.call(act)

    # ------------------------------------------------------------ reads (event loop)
    @property
    def n_slots(self) -> int:
        return len(self._scheduler.slots)

    def slots(self) -> list[SlotView]:
        """A copy of every slot's state, in slot order (/slots, /health?fail_on_no_slot)."""
        return [slot_view(slot) for slot in self._scheduler.slots]

    @property
    def stats(self) -> SchedulerStats:
        """The /metrics counters. Live: the scheduler thread adds to them, and so do calls
        run on it (embeddings count their decodes there). The cells in use are counted when
        asked, from the slots as they are (a snapshot, like /slots), not on every step."""
        stats = self._scheduler.stats
        stats.kv_cells_used = self._scheduler.kv.sharing.distinct_cells(self._scheduler.slots)
        return stats

    @stats.setter
    def stats(self, value: SchedulerStats) -> None:
        # Waking from sleep carries the old counters over, so /metrics never goes back.
        self._scheduler.stats = value

    @property
    def speculative(self) -> bool:
        """Whether speculative decoding is set up (/slots' `speculative`)."""
        return self._scheduler.spec is not None

    @property
    def spec_types(self) -> str:
        """The speculative types in use as llama-server names them, "none" when off."""
        spec = self._scheduler.spec
        return spec.type_names if spec is not None else "none"

    @property
    def prefix_sharing_note(self) -> str:
        """Why requests sharing a prompt prefix do not share its KV cells; "" when they do."""
        return self._scheduler.kv.sharing_note

    def prompt_cache_bytes(self) -> int:
        """Bytes the host-memory prompt cache holds (0 without --cache-ram)."""
        cache = self._scheduler.kv.prompt_cache
        return cache.bytes_used if cache is not None else 0

    def queued_tokens(self) -> int:
        """Prompt tokens of the requests waiting for a slot."""
        return self._scheduler.admission.pending_tokens

    # ------------------------------------------------------------ slot files
    @property
    def has_slot_files(self) -> bool:
        return self._slot_files is not None

    async def save_slot(self, slot_id: int, filename: object) -> dict[str, Any]:
        """Write a slot's KV to a file once the slot is idle; SlotFileError for a bad name or file."""
        files = self._files()
        name = validate_filename(filename)  # before waiting for the slot: a bad name is answered at once
        return await self.call(lambda: files.save(slot_id, name), idle_slot=slot_id)

    async def restore_slot(self, slot_id: int, filename: object) -> dict[str, Any]:
        files = self._files()
        name = validate_filename(filename)
        return await self.call(lambda: files.restore(slot_id, name), idle_slot=slot_id)

    async def erase_slot(self, slot_id: int) -> dict[str, Any]:
        files = self._files()
        return await self.call(lambda: files.erase(slot_id), idle_slot=slot_id)

    def _files(self) -> SlotFiles:
        if self._slot_files is None:
            raise SlotFileError("slot files are off (no --slot-save-path)")
        return self._slot_files

    # ------------------------------------------------------------ lifetime
    def stop(self) -> None:
        """Stop the scheduler thread; with --cache-persist, then write every slot's KV to disk."""
        self._scheduler.stop()
        if self._persist_slots and self._slot_files is not None:
            try:
                self._slot_files.persist_all()
            except OSError as exc:  # a full disk must not turn a clean stop into a crash
                log.error("could not persist the slot caches: %s", exc)
