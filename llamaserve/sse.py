"""Server-sent events framing, shared by `serving/` (which frames) and `api/` (which sends)."""

from __future__ import annotations

import json
from typing import Any

# Built once: json.dumps with options builds an encoder per call, and this runs per token.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


def data_event(obj: Any) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def named_event(name: str, obj: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode()


DONE = b"data: [DONE]\n\n"
