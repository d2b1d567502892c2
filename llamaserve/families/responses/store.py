"""Stored Responses: finished /v1/responses kept in an embedded SQLite file.

One row per stored response: the Response object exactly as the client got
it, the input items of that request (ids added), its instructions and its
previous_response_id. A row never copies its ancestors' items: a conversation
is rebuilt by walking previous_response_id back to its first response, so the
file grows linearly with a conversation, not quadratically.

Threading: one connection opened with check_same_thread=False and guarded by
a lock. A sqlite3 connection must not be used by two threads at once, and
SQLite admits one writer at a time anyway, so a single guarded connection
loses nothing here and keeps every transaction obvious. Every method blocks
(disk reads, an fsync per commit); the asyncio side calls them through
asyncio.to_thread so the event loop never waits on the disk. WAL lets another
process (a second server on the same file, the sqlite3 shell) read while this
one writes.

The file is opened on first use, not at startup: a server that never stores
a response never creates it.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llamaserve.sqlite_file import open_versioned

Item = dict[str, Any]
Order = Literal["asc", "desc"]

# Bumped when the table changes shape; a newer file is refused, not misread.
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id                   TEXT PRIMARY KEY,
    created_at           INTEGER NOT NULL,
    model                TEXT NOT NULL,
    previous_response_id TEXT,
    instructions         TEXT,
    input_items          TEXT NOT NULL,  -- JSON list: this request's items, ids added
    response             TEXT NOT NULL   -- JSON object: the Response as returned
)
"""

# A chain longer than this is treated as corrupt (it can only come from a
# hand-edited file: ids are random, so a real chain cannot loop).
MAX_CHAIN = 100_000

# Id prefixes for input items the client sent without one (OpenAI's spelling
# where it has one).
_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


class ResponseNotFound(LookupError):
    """`missing` is not stored: the asked id, or an ancestor deleted since."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


class UnknownCursor(ValueError):
    """An `after` item id that is not among the listed items."""


@dataclass(frozen=True)
class StoredResponse:
    id: str
    created_at: int
    model: str
    response: dict[str, Any]
    input_items: list[Item]
    instructions: str | None = None
    previous_response_id: str | None = None

    @property
    def output_items(self) -> list[Item]:
        return list(self.response.get("output") or [])


@dataclass(frozen=True)
class ItemPage:
    data: list[Item]
    has_more: bool

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's list envelope (first_id/last_id are null on an empty page)."""
        return {
            "object": "list",
            "data": self.data,
            "first_id": self.data[0].get("id") if self.data else None,
            "last_id": self.data[-1].get("id") if self.data else None,
            "has_more": self.has_more,
        }


def default_db_path() -> Path:
    """llamaserve/responses.sqlite3 in the user cache directory (XDG_CACHE_HOME or ~/.cache)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "llamaserve" / "responses.sqlite3"


def db_path(configured: str | None) -> Path:
    """--responses-db, or the default when unset or empty."""
    return Path(configured).expanduser() if configured else default_db_path()


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def normalise_input(input_: str | list[Item]) -> list[Item]:
    """The request's input as items with ids, as input_items lists them.

    Items keep every field the client sent. Only what OpenAI fills in too is
    added: an id, the 'message' type of role-only items, and string content
    turned into a single text part (input_text, or output_text for the
    assistant). A string input is one user message.
    """
    if isinstance(input_, str):
        return [
            {
                "id": _new_id("msg_"),
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": input_}],
            }
        ]
    items: list[Item] = []
    for raw in input_:
        item = dict(raw)
        if "type" not in item and "role" in item:
            item["type"] = "message"
        if item.get("type") == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        if not item.get("id"):
            item = {"id": _new_id(_ID_PREFIX.get(str(item.get("type")), "item_")), **item}
        items.append(item)
    return items


class ResponseStore:
    """The SQLite file of stored responses; every method is blocking and thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    # ---------------------------------------------------------- connection
    def _connection(self) -> sqlite3.Connection:
        """The open connection (opened, and the file created, on first use). Hold the lock."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # FULL: a response acknowledged as stored survives a power cut, not just a crash of
            # this process.
            self._conn = open_versioned(self.path, _SCHEMA, SCHEMA_VERSION, synchronous="FULL")
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -------------------------------------------------------------- writes
    def put(self, stored: StoredResponse) -> None:
        row = (
            stored.id,
            stored.created_at,
            stored.model,
            stored.previous_response_id,
            stored.instructions,
            json.dumps(stored.input_items, ensure_ascii=False),
            json.dumps(stored.response, ensure_ascii=False),
        )
        with self._lock:
            self._connection().execute(
                "INSERT INTO responses (id, created_at, model, previous_response_id, instructions, "
                "input_items, response) VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )

    def delete(self, response_id: str) -> bool:
        """Whether a row was deleted. Later responses that continue it keep their own rows."""
        with self._lock:
            cursor = self._connection().execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return cursor.rowcount > 0

    # --------------------------------------------------------------- reads
    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            return self._get(self._connection(), response_id)

    @staticmethod
    def _get(conn: sqlite3.Connection, response_id: str) -> StoredResponse | None:
        row = conn.execute(
            "SELECT id, created_at, model, previous_response_id, instructions, input_items, "
            "response FROM responses WHERE id = ?",
            (response_id,),
        ).fetchone()
        if row is None:
            return None
        return StoredResponse(
            id=row[0],
            created_at=int(row[1]),
            model=row[2],
            previous_response_id=row[3],
            instructions=row[4],
            input_items=json.loads(row[5]),
            response=json.loads(row[6]),
        )

    def chain(self, response_id: str) -> tuple[list[StoredResponse], str | None]:
        """The response and its ancestors, oldest first, and the first missing ancestor's id (or None).

        Read in one transaction so a concurrent delete cannot tear the chain
        between two lookups. Raises ResponseNotFound when `response_id` itself
        is not stored.
        """
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                newest_first: list[StoredResponse] = []
                seen: set[str] = set()
                next_id: str | None = response_id
                while next_id is not None:
                    if next_id in seen or len(seen) >= MAX_CHAIN:
                        raise sqlite3.DatabaseError(f"the previous_response_id chain of {response_id} loops")
                    seen.add(next_id)
                    row = self._get(conn, next_id)
                    if row is None:
                        break
                    newest_first.append(row)
                    next_id = row.previous_response_id
            finally:
                conn.execute("COMMIT")
        if not newest_first:
            raise ResponseNotFound(response_id)
        return newest_first[::-1], next_id

    def context(self, response_id: str) -> list[Item]:
        """What a request continuing `response_id` starts from: every input and output item of the chain.

        Instructions are not part of it: only the new request's apply.
        Raises ResponseNotFound naming the id that is missing, the asked one
        or an ancestor deleted since, because a silently shortened history
        would answer a different conversation.
        """
        responses, missing = self.chain(response_id)
        if missing is not None:
            raise ResponseNotFound(missing)
        return _conversation(responses)

    def input_items(
        self, response_id: str, *, limit: int = 20, order: Order = "desc", after: str | None = None
    ) -> ItemPage:
        """One page of the items used to generate `response_id`: its ancestors' inputs and outputs, then its input.

        A deleted ancestor ends the listing there (what survives is listed).
        `after` is an item id: the page starts just past it, in `order`.
        Raises ResponseNotFound for an unknown id, UnknownCursor for an
        `after` that is not in the list.
        """
        responses, _ = self.chain(response_id)
        items = _conversation(responses[:-1]) + responses[-1].input_items
        if order == "desc":
            items.reverse()
        start = 0
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise UnknownCursor(f"after: no item '{after}' among the input items of {response_id}")
            start = ids.index(after) + 1
        page = items[start : start + limit]
        return ItemPage(page, has_more=start + limit < len(items))


def _conversation(responses: Iterable[StoredResponse]) -> list[Item]:
    items: list[Item] = []
    for stored in responses:
        items += stored.input_items
        items += stored.output_items
    return items
