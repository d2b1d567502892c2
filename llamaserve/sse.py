"""Server-sent events framing, shared by `serving/` (which frames) and `api/` (which sends)."""

from __future__ import annotations

import json
from typing import Any


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data_event(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def named_event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
