"""Batches and their files, kept across restarts: an SQLite file and a folder of files beside it.

`<dir>/batches.sqlite3` holds the file table, each batch (the Batch object as JSON, its status,
the credentials its lines run with), the lines still to run and every line's record as it
finishes. `<dir>/files/<file id>` holds each file's bytes. A line's record is committed the
moment it finishes, and a line is run only while it has none (the table's key is the batch
and the line), so a batch stopped by a crash or a restart resumes with exactly the lines that
had no answer yet, and every line is answered once. The output and error files are written
from the records, in the order the lines finished, when the batch ends.

Threading, as in the Responses store: one connection guarded by a lock, every method
blocking, called from the event loop through `asyncio.to_thread`. WAL with synchronous=NORMAL:
a record survives the process dying; a power cut may lose the last few, which then run again.

The folder is created on first use (mode 0700: the files hold prompts and answers, and a
batch keeps the API key it was created with so that its lines pass the same key check).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, Literal

from llamaserve.families.batches.lines import MAX_LINES, Line, Outcome, batch_usage, parse_input, refused
from llamaserve.families.batches.protocol import COMPLETION_WINDOW, COMPLETION_WINDOW_S
from llamaserve.sqlite_file import open_versioned

Order = Literal["asc", "desc"]
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id         TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    purpose    TEXT NOT NULL,
    object     TEXT NOT NULL              -- JSON: the File object
);
CREATE TABLE IF NOT EXISTS batches (
    id          TEXT PRIMARY KEY,
    created_at  INTEGER NOT NULL,
    status      TEXT NOT NULL,
    object      TEXT NOT NULL,            -- JSON: the Batch object (counts refreshed when read)
    credentials TEXT NOT NULL             -- JSON: [[header, value], ...] its lines are sent with
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id  TEXT NOT NULL,
    idx       INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    url       TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (batch_id, idx)
);
CREATE TABLE IF NOT EXISTS results (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order lines finished in
    batch_id TEXT NOT NULL,
    idx      INTEGER NOT NULL,
    ok       INTEGER NOT NULL,
    record   TEXT NOT NULL,
    UNIQUE (batch_id, idx)
);
"""

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"


class NotFound(LookupError):
    """No such file or batch."""


class Conflict(ValueError):
    """The request does not fit the object's state (deleting a running batch's input, cancelling a
    finished batch)."""


def default_dir() -> Path:
    """llamaserve/batches in the user cache folder, beside the stored Responses' file."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "llamaserve" / "batches"


def batch_dir(configured: str | None) -> Path:
    """--batch-dir, or the default when unset or empty."""
    return Path(configured).expanduser() if configured else default_dir()


def _now() -> int:
    return int(time.time())


def _page(rows: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": rows,
        "first_id": rows[0]["id"] if rows else None,
        "last_id": rows[-1]["id"] if rows else None,
        "has_more": has_more,
    }


class BatchStore:
    """Every method blocks and is thread-safe."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.db_path = self.dir / "batches.sqlite3"
        self.files_dir = self.dir / "files"
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._lead: BinaryIO | None = None

    # ---------------------------------------------------------- connection
    def exists(self) -> bool:
        """Whether a store was ever created here (a server that never saw a batch has none)."""
        return self.db_path.exists()

    def _connection(self) -> sqlite3.Connection:
        """The open connection, the folder and file created on first use. Hold the lock."""
        if self._conn is None:
            self.files_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            conn = open_versioned(self.db_path, _SCHEMA, SCHEMA_VERSION, synchronous="NORMAL")
            os.chmod(self.db_path, 0o600)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._lead is not None:
                self._lead.close()  # closing the descriptor releases the flock
                self._lead = None

    def try_lead(self) -> bool:
        """Whether this process runs the folder's batches: the first to hold `runner.lock` does.
        Two servers on one folder (the same default, say) then never run a batch twice; the
        other takes over when the first exits. False, creating nothing, when no store exists."""
        with self._lock:
            if self._lead is not None:
                return True
            if self._conn is None and not self.exists():
                return False
            handle = open(self.dir / "runner.lock", "a+b")  # noqa: SIM115 -- held open while leading
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                return False
            self._lead = handle
            return True

    # --------------------------------------------------------------- files
    def _write_file(self, conn: sqlite3.Connection, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        """The bytes on disk first (written whole, then renamed), then the row."""
        file_id = f"file-{uuid.uuid4().hex}"
        part = self.files_dir / f"{file_id}.part"
        part.write_bytes(data)
        os.replace(part, self.files_dir / file_id)
        created = _now()
        obj = {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": created,
            "expires_at": None,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        conn.execute(
            "INSERT INTO files (id, created_at, purpose, object) VALUES (?, ?, ?, ?)",
            (file_id, created, purpose, json.dumps(obj)),
        )
        return obj

    def add_file(self, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        with self._lock:
            return self._write_file(self._connection(), filename, purpose, data)

    def _absent(self) -> bool:
        """No store was ever created here: reads answer empty without creating one."""
        return self._conn is None and not self.exists()

    def file(self, file_id: str) -> dict[str, Any]:
        if self._absent():
            raise NotFound(file_id)
        with self._lock:
            row = self._connection().execute("SELECT object FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise NotFound(file_id)
        obj: dict[str, Any] = json.loads(row[0])
        return obj

    def file_bytes(self, file_id: str) -> bytes:
        self.file(file_id)
        return (self.files_dir / file_id).read_bytes()

    def list_files(self, purpose: str | None, limit: int, order: Order, after: str | None) -> dict[str, Any]:
        if self._absent() and after is None:
            return _page([], False)
        with self._lock:
            conn = self._connection()
            rows = conn.execute("SELECT id, object FROM files ORDER BY created_at, rowid").fetchall()
        objs = [json.loads(o) for _, o in rows if purpose is None or json.loads(o)["purpose"] == purpose]
        if order == "desc":
            objs.reverse()
        start = 0
        if after is not None:
            ids = [o["id"] for o in objs]
            if after not in ids:
                raise NotFound(after)
            start = ids.index(after) + 1
        return _page(objs[start : start + limit], start + limit < len(objs))

    def delete_file(self, file_id: str) -> dict[str, Any]:
        if self._absent():
            raise NotFound(file_id)
        with self._lock:
            conn = self._connection()
            if conn.execute("SELECT 1 FROM files WHERE id = ?", (file_id,)).fetchone() is None:
                raise NotFound(file_id)
            for batch_id, obj in conn.execute(
                f"SELECT id, object FROM batches WHERE status IN ({','.join('?' * len(ACTIVE))})", ACTIVE
            ):
                if json.loads(obj)["input_file_id"] == file_id:
                    raise Conflict(f"file '{file_id}' is the input of batch '{batch_id}', which has not finished")
            conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
        (self.files_dir / file_id).unlink(missing_ok=True)
        return {"id": file_id, "object": "file", "deleted": True}

    # ------------------------------------------------------------- batches
    def create_batch(
        self, input_file_id: str, endpoint: str, metadata: dict[str, Any] | None, credentials: list[list[str]]
    ) -> dict[str, Any]:
        if self._absent():
            raise NotFound(input_file_id)
        with self._lock:
            conn = self._connection()
            row = conn.execute("SELECT object FROM files WHERE id = ?", (input_file_id,)).fetchone()
            if row is None:
                raise NotFound(input_file_id)
            if json.loads(row[0])["purpose"] != INPUT_PURPOSE:
                raise Conflict(f"file '{input_file_id}' was not uploaded with purpose 'batch'")
            created = _now()
            obj: dict[str, Any] = {
                "id": f"batch_{uuid.uuid4().hex}",
                "object": "batch",
                "endpoint": endpoint,
                "errors": None,
                "input_file_id": input_file_id,
                "completion_window": COMPLETION_WINDOW,
                "status": "validating",
                "output_file_id": None,
                "error_file_id": None,
                "created_at": created,
                "in_progress_at": None,
                "expires_at": created + COMPLETION_WINDOW_S,
                "finalizing_at": None,
                "completed_at": None,
                "failed_at": None,
                "expired_at": None,
                "cancelling_at": None,
                "cancelled_at": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0},
                "usage": None,  # the answered lines' tokens, summed when the batch ends
                "metadata": metadata,
            }
            conn.execute(
                "INSERT INTO batches (id, created_at, status, object, credentials) VALUES (?, ?, ?, ?, ?)",
                (obj["id"], created, obj["status"], json.dumps(obj), json.dumps(credentials)),
            )
        return obj

    @staticmethod
    def _load(conn: sqlite3.Connection, batch_id: str) -> dict[str, Any]:
        row = conn.execute("SELECT object FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise NotFound(batch_id)
        obj: dict[str, Any] = json.loads(row[0])
        if obj["status"] in ("in_progress", "finalizing", "cancelling"):
            # A running batch's counts come from its records; a finished one's were frozen.
            done = conn.execute(
                "SELECT COALESCE(SUM(ok), 0), COUNT(*) FROM results WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            obj["request_counts"]["completed"] = int(done[0])
            obj["request_counts"]["failed"] = int(done[1]) - int(done[0])
        return obj

    @staticmethod
    def _save(conn: sqlite3.Connection, obj: dict[str, Any]) -> None:
        conn.execute(
            "UPDATE batches SET status = ?, object = ? WHERE id = ?", (obj["status"], json.dumps(obj), obj["id"])
        )

    def batch(self, batch_id: str) -> dict[str, Any]:
        if self._absent():
            raise NotFound(batch_id)
        with self._lock:
            return self._load(self._connection(), batch_id)

    def credentials(self, batch_id: str) -> list[tuple[str, str]]:
        with self._lock:
            row = self._connection().execute("SELECT credentials FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise NotFound(batch_id)
        return [(str(k), str(v)) for k, v in json.loads(row[0])]

    def list_batches(self, limit: int, after: str | None) -> dict[str, Any]:
        """Newest first; `after` is the id of the last batch of the previous page."""
        if self._absent() and after is None:
            return _page([], False)
        with self._lock:
            conn = self._connection()
            ids = [r[0] for r in conn.execute("SELECT id FROM batches ORDER BY created_at DESC, rowid DESC")]
            start = 0
            if after is not None:
                if after not in ids:
                    raise NotFound(after)
                start = ids.index(after) + 1
            page = [self._load(conn, i) for i in ids[start : start + limit]]
        return _page(page, start + limit < len(ids))

    def active(self) -> list[str]:
        """Batches not finished, oldest first: what the runner has to do (again, after a restart)."""
        if self._absent():
            return []
        with self._lock:
            rows = self._connection().execute(
                f"SELECT id FROM batches WHERE status IN ({','.join('?' * len(ACTIVE))}) ORDER BY created_at, rowid",
                ACTIVE,
            )
            return [r[0] for r in rows]

    def request_cancel(self, batch_id: str) -> dict[str, Any]:
        """validating/in_progress → cancelling (the runner then stops its lines and finalizes)."""
        if self._absent():
            raise NotFound(batch_id)
        with self._lock:
            conn = self._connection()
            obj = self._load(conn, batch_id)
            if obj["status"] in ("validating", "in_progress"):
                obj["status"] = "cancelling"
                obj["cancelling_at"] = _now()
                self._save(conn, obj)
            elif obj["status"] not in ("cancelling", "cancelled"):
                raise Conflict(f"batch '{batch_id}' is {obj['status']} and cannot be cancelled")
            return obj

    # ---------------------------------------------------------- the runner
    def validate(self, batch_id: str) -> dict[str, Any]:
        """validating → in_progress: the input file's lines stored (the bad ones already recorded
        for the error file), or → failed when the file cannot be used at all."""
        with self._lock:
            conn = self._connection()
            obj = self._load(conn, batch_id)
            if obj["status"] != "validating":
                return obj
            problem, lines, bad = self._read_input(conn, obj["input_file_id"])
            now = _now()
            if problem is not None:
                obj.update(status="failed", failed_at=now, errors={"object": "list", "data": [problem]})
                self._save(conn, obj)
                return obj
            conn.execute("BEGIN")
            try:
                conn.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
                conn.executemany(
                    "INSERT INTO lines (batch_id, idx, custom_id, url, body) VALUES (?, ?, ?, ?, ?)",
                    [(batch_id, ln.index, ln.custom_id, ln.url, json.dumps(ln.body)) for ln in lines],
                )
                self._insert_records(conn, batch_id, bad)
                obj.update(status="in_progress", in_progress_at=now)
                obj["request_counts"]["total"] = len(lines) + len(bad)
                self._save(conn, obj)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return self._load(conn, batch_id)

    def _read_input(
        self, conn: sqlite3.Connection, file_id: str
    ) -> tuple[dict[str, Any] | None, list[Line], list[Outcome]]:
        def error(code: str, message: str) -> dict[str, Any]:
            return {"code": code, "message": message, "param": "input_file_id", "line": None}

        row = conn.execute("SELECT 1 FROM files WHERE id = ?", (file_id,)).fetchone()
        path = self.files_dir / file_id
        if row is None or not path.exists():
            return error("file_not_found", f"the input file '{file_id}' was deleted"), [], []
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return error("invalid_file", "the input file is not UTF-8 text"), [], []
        lines, bad = parse_input(text)
        if not lines and not bad:
            return error("empty_file", "the input file has no lines"), [], []
        if len(lines) + len(bad) > MAX_LINES:
            return error("too_many_lines", f"a batch has at most {MAX_LINES} lines"), [], []
        return None, lines, bad

    @staticmethod
    def _insert_records(conn: sqlite3.Connection, batch_id: str, outcomes: Iterable[Outcome]) -> None:
        conn.executemany(
            "INSERT OR IGNORE INTO results (batch_id, idx, ok, record) VALUES (?, ?, ?, ?)",
            [(batch_id, o.index, int(o.ok), json.dumps(o.record, ensure_ascii=False)) for o in outcomes],
        )

    def pending(self, batch_id: str) -> list[Line]:
        """The lines with no record yet, in file order."""
        with self._lock:
            rows = self._connection().execute(
                "SELECT idx, custom_id, url, body FROM lines WHERE batch_id = ? AND idx NOT IN "
                "(SELECT idx FROM results WHERE batch_id = ?) ORDER BY idx",
                (batch_id, batch_id),
            )
            return [Line(int(i), c, u, json.loads(b)) for i, c, u, b in rows]

    def record(self, batch_id: str, outcome: Outcome) -> None:
        """A line's answer, kept at once; a line that already has one keeps the first."""
        with self._lock:
            self._insert_records(self._connection(), batch_id, [outcome])

    def status(self, batch_id: str) -> str:
        with self._lock:
            row = self._connection().execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise NotFound(batch_id)
        return str(row[0])

    def expire_pending(self, batch_id: str) -> None:
        """The completion window is over: every line not run yet gets an error record."""
        pending = self.pending(batch_id)
        with self._lock:
            self._insert_records(
                self._connection(),
                batch_id,
                [
                    refused(ln.index, ln.custom_id, "batch_expired", "the batch expired before this line ran")
                    for ln in pending
                ],
            )

    def begin_finalizing(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            conn = self._connection()
            obj = self._load(conn, batch_id)
            if obj["status"] == "in_progress":
                obj.update(status="finalizing", finalizing_at=_now())
                self._save(conn, obj)
            return obj

    def finalize(self, batch_id: str, final: str) -> dict[str, Any]:
        """Write the output and error files from the records (in the order the lines finished) and
        end the batch as `final` (completed, expired or cancelled); its line rows are dropped."""
        with self._lock:
            conn = self._connection()
            obj = self._load(conn, batch_id)
            rows = conn.execute(
                "SELECT ok, record FROM results WHERE batch_id = ? ORDER BY seq", (batch_id,)
            ).fetchall()
            good = "".join(r + "\n" for ok, r in rows if ok).encode()
            bad = "".join(r + "\n" for ok, r in rows if not ok).encode()
            conn.execute("BEGIN")
            try:
                if good:
                    obj["output_file_id"] = self._write_file(conn, f"{batch_id}_output.jsonl", OUTPUT_PURPOSE, good)[
                        "id"
                    ]
                if bad:
                    obj["error_file_id"] = self._write_file(conn, f"{batch_id}_error.jsonl", OUTPUT_PURPOSE, bad)["id"]
                obj["usage"] = batch_usage([json.loads(r) for ok, r in rows if ok])
                now = _now()
                obj["status"] = final
                obj[f"{final}_at"] = now
                if final == "expired" and obj["finalizing_at"] is None:
                    obj["finalizing_at"] = now
                conn.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
                conn.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))
                self._save(conn, obj)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return obj
