"""One SQLite file of ours opened the way every store wants it (a leaf: nothing of ours).

The stored Responses, the Batch API's state and the per-key usage each keep a SQLite file that
several threads of the server use through one connection and a lock of the store's own. They
open it alike: autocommit (explicit BEGIN where a read needs one snapshot or a write must be
atomic), WAL so readers never wait for the writer, the store's durability, and a schema version
in `user_version`, so a file written by a newer llamaserve is refused instead of misread.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Literal


def open_versioned(
    path: Path,
    schema: str,
    version: int,
    *,
    synchronous: Literal["FULL", "NORMAL"],
) -> sqlite3.Connection:
    """The connection to ``path`` with ``schema`` applied (its statements must be idempotent:
    CREATE ... IF NOT EXISTS), or sqlite3.DatabaseError for a file of a newer schema.

    ``synchronous``: FULL when an acknowledged write must survive a power cut (one fsync of the
    WAL per commit); NORMAL when losing the last commits to a power cut is acceptable.
    """
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        found = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if found > version:
            raise sqlite3.DatabaseError(f"{path} was written by a newer llamaserve (schema {found} > {version})")
        conn.executescript(schema)
        conn.execute(f"PRAGMA user_version={version}")
    except BaseException:
        conn.close()
        raise
    return conn
