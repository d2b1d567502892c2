"""Resumable streams: the SSE bytes of a generation, kept past the client's disconnect.

A streamed request with an `X-Conversation-Id` header (the web UI sends one) gets a
`StreamSession`: every byte its answer sends is appended here, and the generation runs
on even when the connection drops (a page reload, a phone going to sleep). A client
reattaches with `GET /v1/stream?conv_id=ID&from=N`, which replays from byte N and then
follows the live bytes; `DELETE /v1/stream` is the explicit Stop. This is llama-server's
feature (server-stream.cpp), with its limits: one live session per conversation (a new
request replaces and cancels the old one), a 4 MiB buffer per session whose oldest bytes
go first, and finished sessions dropped 300 s after they end.

Everything here runs on the event loop thread, so there are no locks: readers wait on an
`asyncio.Event` that each append or the end sets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

MAX_BYTES = 4 * 1024 * 1024
TTL_SECONDS = 300.0


class OffsetLost(Exception):
    """The bytes from the asked offset were dropped to keep the buffer within its cap."""


class StreamSession:
    def __init__(self, conversation_id: str, max_bytes: int = MAX_BYTES) -> None:
        self.conversation_id = conversation_id
        self.started_at = int(time.time())
        self.completed_at = 0  # unix seconds once finished
        self.cancelled = False  # set by a Stop: the producer stops pulling the generation
        self.max_bytes = max_bytes
        self._buffer = bytearray()
        self.dropped = 0  # bytes evicted from the front
        self._changed = asyncio.Event()
        self.producer: asyncio.Task[None] | None = None  # kept here so the task is not collected

    @property
    def done(self) -> bool:
        return self.completed_at != 0

    @property
    def total_bytes(self) -> int:
        return self.dropped + len(self._buffer)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self._buffer += data
        excess = len(self._buffer) - self.max_bytes
        if excess > 0:
            del self._buffer[:excess]
            self.dropped += excess
        self._wake()

    def finish(self) -> None:
        if not self.done:
            self.completed_at = int(time.time())
            self._wake()

    def cancel(self) -> None:
        """Stop: readers end, and the producer is cancelled even while it waits for the next
        chunk (its `finally` closes the generation, which aborts the engine request)."""
        self.cancelled = True
        self.finish()
        if self.producer is not None:
            self.producer.cancel()

    async def read(self, offset: int) -> AsyncIterator[bytes]:
        """Bytes from `offset` on, following the live ones until the session ends."""
        while True:
            if offset < self.dropped:
                raise OffsetLost()
            end = self.total_bytes
            if offset < end:
                chunk = bytes(self._buffer[offset - self.dropped :])
                offset = end
                yield chunk
                continue
            if self.done:
                return
            await self._changed.wait()

    def describe(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "is_done": self.done,
            "total_bytes": self.total_bytes,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
        }


class StreamSessions:
    """The live sessions by conversation id."""

    def __init__(self, ttl_seconds: float = TTL_SECONDS) -> None:
        self.ttl_seconds = ttl_seconds
        self._sessions: dict[str, StreamSession] = {}

    def _expire(self) -> None:
        """Drop sessions finished longer than the TTL ago (done on every access, no timer)."""
        cutoff = time.time() - self.ttl_seconds
        for key, s in list(self._sessions.items()):
            if s.done and s.completed_at <= cutoff:
                del self._sessions[key]

    def create(self, conversation_id: str) -> StreamSession:
        """A fresh session; one that the conversation still had is cancelled (one live stream each)."""
        self._expire()
        previous = self._sessions.get(conversation_id)
        if previous is not None:
            previous.cancel()
        session = StreamSession(conversation_id)
        self._sessions[conversation_id] = session
        return session

    def get(self, conversation_id: str) -> StreamSession | None:
        self._expire()
        return self._sessions.get(conversation_id)

    def stop(self, conversation_id: str) -> None:
        """The explicit Stop: forget the session and cancel its generation (idempotent)."""
        session = self._sessions.pop(conversation_id, None)
        if session is not None:
            session.cancel()

    def lookup(self, conversation_ids: list[str]) -> list[dict[str, Any]]:
        """Sessions of the asked ids only (an id also matches its `ID::model` variants), so
        nobody can list conversations they do not already know."""
        self._expire()
        out = []
        for rid in conversation_ids:
            for key, s in self._sessions.items():
                if key == rid or key.startswith(rid + "::"):
                    out.append(s.describe())
        return out

    def producing(self) -> int:
        """Generations still writing into a session (they keep --sleep-idle-seconds awake)."""
        return sum(1 for s in self._sessions.values() if s.producer is not None and not s.producer.done())

    def close_all(self) -> None:
        for s in self._sessions.values():
            s.cancel()
        self._sessions.clear()
