"""Usage per key name and model: requests, prompt / cached / completion tokens, errors.

The totals live in memory (what /metrics and GET /usage read) and in a SQLite file, so
they survive a restart: loaded once at start, and each request's counts added to the
file when it ends. Writes are coalesced: while one write runs in a worker thread, the
requests that end meanwhile wait for the next one, which carries all their counts in one
transaction. A request's ASGI call returns only once its counts are on disk, so a
graceful shutdown (which waits for the calls in flight) loses none.

SQLite as in families/responses/store.py: WAL, one connection guarded by a lock, every
blocking call through asyncio.to_thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from llamaserve.sqlite_file import open_versioned

log = logging.getLogger("llamaserve.usage")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    key               TEXT NOT NULL,  -- the key's name from --api-keys-config, never the key
    model             TEXT NOT NULL,
    requests          INTEGER NOT NULL DEFAULT 0,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    errors            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, model)
)
"""

_UPSERT = """
INSERT INTO usage (key, model, requests, prompt_tokens, cached_tokens, completion_tokens, errors)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key, model) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    errors = errors + excluded.errors
"""


@dataclass
class Counts:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def row(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


Totals = dict[tuple[str, str], Counts]

# (metric name, Counts field, help text) for /metrics.
_METRICS = (
    ("llamaserve:key_requests_total", "requests", "Requests per API key name and model."),
    ("llamaserve:key_prompt_tokens_total", "prompt_tokens", "Prompt tokens (cached ones included) per key and model."),
    (
        "llamaserve:key_cached_tokens_total",
        "cached_tokens",
        "Prompt tokens from the KV cache per key and model.",
    ),
    ("llamaserve:key_completion_tokens_total", "completion_tokens", "Generated tokens per key and model."),
    ("llamaserve:key_errors_total", "errors", "Answers with a 4xx or 5xx status per key and model."),
)


SCHEMA_VERSION = 1


def default_usage_db() -> Path:
    """llamaserve/usage.sqlite3 in the user cache directory (XDG_CACHE_HOME or ~/.cache)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "llamaserve" / "usage.sqlite3"


class UsageStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # NORMAL: the WAL stays consistent; a power cut may lose the last commits.
        self._db = open_versioned(path, _SCHEMA, SCHEMA_VERSION, synchronous="NORMAL")

    def load(self) -> Totals:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, model, requests, prompt_tokens, cached_tokens, completion_tokens, errors FROM usage"
            ).fetchall()
        return {(key, model): Counts(*numbers) for key, model, *numbers in rows}

    def add(self, deltas: Totals) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(_UPSERT, [(key, model, *c.row()) for (key, model), c in deltas.items()])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class UsageLedger:
    def __init__(self, store: UsageStore) -> None:
        self._store = store
        self.totals: Totals = store.load()
        self._pending: Totals = {}
        self._filling = 0  # the number of the batch that new counts join
        self._written = -1  # the last batch whose write has ended
        self._writing: asyncio.Future[None] | None = None

    async def record(self, key: str, model: str, counts: Counts) -> None:
        """Adds one request's counts, and returns once they are in the file."""
        self.totals.setdefault((key, model), Counts()).add(counts)
        self._pending.setdefault((key, model), Counts()).add(counts)
        mine = self._filling
        while self._written < mine:
            writing = self._writing
            if writing is None or writing.done():
                # No write running: this request writes the batch that holds its counts.
                batch, self._pending = self._pending, {}
                self._filling += 1
                writing = self._writing = asyncio.ensure_future(self._write(batch, mine))
            # Shielded: a request cancelled while waiting must not cancel the others' write.
            await asyncio.shield(writing)

    async def _write(self, batch: Totals, number: int) -> None:
        try:
            await asyncio.to_thread(self._store.add, batch)
        except (sqlite3.Error, OSError) as exc:
            log.error("usage: cannot write to the usage file: %s (kept in memory only)", exc)
        finally:
            self._written = number

    def rows(self, key: str | None = None) -> list[dict[str, Any]]:
        """The totals as JSON rows, all keys or one key's."""
        return [
            {"key": name, "model": model, **{f.name: getattr(c, f.name) for f in fields(c)}}
            for (name, model), c in sorted(self.totals.items())
            if key is None or name == key
        ]

    def prometheus(self) -> bytes:
        lines: list[str] = []
        for metric, attr, help_text in _METRICS:
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
            for (name, model), c in sorted(self.totals.items()):
                lines.append(f'{metric}{{key="{_label(name)}",model="{_label(model)}"}} {getattr(c, attr)}')
        return ("\n".join(lines) + "\n").encode()
