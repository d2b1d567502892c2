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


class OneStringEvent:
    """`data_event` of one object shape whose events differ in one string value only (a streamed
    token's text): the bytes around that value are built once, so each event costs one string's
    escaping instead of the whole object's encoding. The bytes are `data_event`'s exactly: the
    encoder escapes a string inside an object as it does a string alone."""

    MARK = "\ue000llamaserve-slot\ue000"  # a private-use character: no request or model text is encoded this way

    def __init__(self, shape: Any) -> None:
        """`shape`: the object with MARK where the varying string goes (once)."""
        head, sep, tail = data_event(shape).partition(dumps(self.MARK).encode())
        if not sep or self.MARK in tail.decode():
            raise ValueError("the shape must hold MARK exactly once")
        self._head = head.decode()
        self._tail = tail.decode()

    def event(self, text: str) -> bytes:
        return (self._head + _ENCODER.encode(text) + self._tail).encode()
