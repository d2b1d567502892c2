"""Runs the batches: one at a time, oldest first, a bounded number of lines at once, at the
engine's lowest priority.

Each line is handed to `dispatch`, which runs it through the app as a request to its route
(routes.py builds it over the app in-process, as Vertex AI's /predict does): the same key
check, validation, error envelopes, metrics and code paths as a live request. Two things make
a batch give way to interactive traffic:

- its chat and completion lines carry `priority` BATCH_PRIORITY, so the scheduler admits and
  prefills every interactive request (priority 0 unless it asks otherwise) before them;
- at most `limit()` lines run at once, fewer than the server's slots, so an interactive
  request always finds a slot free instead of waiting for a batch line to finish.

A 429 (a queue limit, a quota) or a 503 (the model loading or waking) is not the line's
answer: the line waits as long as Retry-After says and runs again. A cancelled batch's
lines in flight are cancelled (their generations aborted) and get no record, as do those in
flight when the server stops; the latter run again after a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llamaserve.families.batches.lines import Line, Outcome, answered
from llamaserve.families.batches.store import BatchStore

log = logging.getLogger("llamaserve.batches")

# Lower values go first (engine/admission.py); interactive requests default to 0.
BATCH_PRIORITY = 1_000_000
_PRIORITISED = ("/v1/chat/completions", "/v1/completions")
_RETRY_STATUSES = (429, 503)
_MAX_RETRY_WAIT_S = 30.0
# Besides wake(): a batch created through another server on the same folder, or that server's
# exit leaving this one to lead.
_IDLE_POLL_S = 5.0

# (url, body, credentials) -> (status, JSON body, Retry-After seconds or None)
Dispatch = Callable[[str, bytes, list[tuple[str, str]]], Awaitable[tuple[int, Any, float | None]]]


def line_body(line: Line) -> bytes:
    """The body sent for a line: the client's, with the batch priority on generating routes (a
    line may ask for a later place still, never an earlier one)."""
    body = dict(line.body)
    if line.url in _PRIORITISED:
        asked = body.get("priority")
        own = asked if isinstance(asked, int) and not isinstance(asked, bool) else 0
        body["priority"] = max(own, BATCH_PRIORITY)
    return json.dumps(body).encode()


class BatchRunner:
    def __init__(self, store: BatchStore, dispatch: Dispatch, limit: Callable[[], int]) -> None:
        self.store = store
        self.dispatch = dispatch
        self.limit = limit
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._cancelled: set[str] = set()

    def start(self) -> None:
        """Start the loop (idempotent); it resumes whatever an earlier run left unfinished."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="llamaserve-batches")

    async def stop(self) -> None:
        """Cancel the loop and the lines in flight; they keep no record and run again later."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def wake(self) -> None:
        """A batch was created: look now rather than at the next poll."""
        self.start()
        self._wake.set()

    def cancel(self, batch_id: str) -> None:
        """The batch was marked cancelling: stop its lines in flight."""
        self._cancelled.add(batch_id)
        self.wake()

    async def _run(self) -> None:
        while True:
            try:
                leading = await asyncio.to_thread(self.store.try_lead)
                active = await asyncio.to_thread(self.store.active) if leading else []
                for batch_id in active:
                    await self._process(batch_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken store must not end the loop; the next pass tries again
                log.exception("batch runner")
            if not active:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), _IDLE_POLL_S)
                except TimeoutError:
                    pass

    async def _process(self, batch_id: str) -> None:
        store = self.store
        obj = await asyncio.to_thread(store.validate, batch_id)
        if obj["status"] == "in_progress":
            log.info("batch %s: %d lines", batch_id, obj["request_counts"]["total"])
            expired = await self._run_lines(batch_id, obj["expires_at"])
            if expired:
                await asyncio.to_thread(store.expire_pending, batch_id)
                await asyncio.to_thread(store.finalize, batch_id, "expired")
                return
        status = await asyncio.to_thread(store.status, batch_id)
        if status == "cancelling":
            await asyncio.to_thread(store.finalize, batch_id, "cancelled")
        elif status in ("in_progress", "finalizing"):
            await asyncio.to_thread(store.begin_finalizing, batch_id)
            done = await asyncio.to_thread(store.finalize, batch_id, "completed")
            counts = done["request_counts"]
            log.info("batch %s completed: %d answered, %d failed", batch_id, counts["completed"], counts["failed"])
        self._cancelled.discard(batch_id)

    async def _run_lines(self, batch_id: str, expires_at: int) -> bool:
        """Run the batch's lines without a record, at most limit() at once; True if it expired."""
        pending = await asyncio.to_thread(self.store.pending, batch_id)
        credentials = await asyncio.to_thread(self.store.credentials, batch_id)
        running: set[asyncio.Task[None]] = set()
        try:
            for line in pending:
                while len(running) >= max(1, self.limit()) and batch_id not in self._cancelled:
                    _, running = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                if batch_id in self._cancelled:
                    return False
                if time.time() >= expires_at:
                    if running:
                        await asyncio.wait(running)
                    return True
                running.add(asyncio.create_task(self._run_line(batch_id, line, credentials)))
            while running:
                if batch_id in self._cancelled:
                    return False
                _, running = await asyncio.wait(running, timeout=0.5)
            return False
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _run_line(self, batch_id: str, line: Line, credentials: list[tuple[str, str]]) -> None:
        body = line_body(line)
        while True:
            try:
                status, answer, retry_after = await self.dispatch(line.url, body, credentials)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the line's failure is its own record, never the batch's
                status, answer, retry_after = 500, _server_error(exc), None
            if status not in _RETRY_STATUSES:
                break
            await asyncio.sleep(min(retry_after or 1.0, _MAX_RETRY_WAIT_S))
        outcome: Outcome = answered(line.index, line.custom_id, status, answer)
        await asyncio.to_thread(self.store.record, batch_id, outcome)


def _server_error(exc: Exception) -> dict[str, Any]:
    return {"error": {"code": 500, "message": f"{type(exc).__name__}: {exc}", "type": "server_error"}}
