"""How a server tells the edge in front of it (the router, the `--upstreams` front) what a
request used, so the edge that holds the keys can charge and count it.

The edge asks with the request header `x-llamaserve-usage: report`. The server answers with
the response header `x-llamaserve-usage: PROMPT CACHED COMPLETION MODEL` (the model's name
percent-quoted); a streamed answer knows its counts only at its end, so its header carries
zeros and the stream ends with the SSE comment `: llamaserve-usage PROMPT CACHED COMPLETION`,
which every SSE reader skips (a comment line, like the keep-alive pings). Generated text
cannot forge it: a stream's text travels inside JSON strings, so no line of it starts with ':'.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

HEADER = b"x-llamaserve-usage"
ASK = b"report"
COMMENT = b": llamaserve-usage "
_COMMENT_RE = re.compile(rb"(?:^|\n): llamaserve-usage (\d+) (\d+) (\d+)\n")


@dataclass
class Reported:
    prompt: int = 0
    cached: int = 0
    completion: int = 0
    model: str = ""


def header_value(tokens: tuple[int, int, int] | None, model: str) -> bytes:
    p, c, d = tokens or (0, 0, 0)
    return f"{p} {c} {d} {urllib.parse.quote(model, safe='')}".encode("latin-1")


def comment(tokens: tuple[int, int, int]) -> bytes:
    return COMMENT + f"{tokens[0]} {tokens[1]} {tokens[2]}\n\n".encode()


def _read_header(value: bytes, into: Reported) -> None:
    parts = value.decode("latin-1").split(" ")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return
    into.prompt, into.cached, into.completion = (int(p) for p in parts[:3])
    into.model = urllib.parse.unquote(parts[3])


def _read_comment(data: bytes, into: Reported) -> bool:
    """The counts of a comment in `data`, if it holds a whole one."""
    found = _COMMENT_RE.search(data)
    if found is None:
        return False
    into.prompt, into.cached, into.completion = (int(g) for g in found.groups())
    return True


class ReportReader:
    """The edge's side: reads the report out of one answer as it is relayed, and takes it out
    of what the client gets."""

    def __init__(self) -> None:
        self.got = Reported()
        self.streamed = False
        self._closed = False  # the stream's closing comment arrived
        self._events = 0  # data events relayed: the estimate when a stream ends without its comment
        self._tail = b""

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The answer's headers less the report, which is read."""
        kept = []
        for name, value in headers:
            if name == HEADER:
                _read_header(value, self.got)
            else:
                kept.append((name, value))
                self.streamed = self.streamed or (name == b"content-type" and value.startswith(b"text/event-stream"))
        return kept

    def body(self, chunk: bytes) -> bytes:
        """A chunk of a streamed answer less the closing comment, which is read."""
        self._events += chunk.count(b"data: ")
        if COMMENT in chunk and _read_comment(chunk, self.got):
            self._closed = True
            start = chunk.index(COMMENT)
            chunk = chunk[:start] + chunk[chunk.index(b"\n\n", start) + 2 :]
        elif self._tail and _read_comment(self._tail + chunk, self.got):
            self._closed = True  # the rare comment split between two chunks (its start already relayed)
        self._tail = chunk[-64:]
        return chunk

    def counts(self) -> Reported:
        """What the request used. A stream cut short (the client left, the server broke off)
        sends no closing comment: about one token per event relayed is counted instead."""
        if self.streamed and not self._closed:
            self.got.completion = max(self.got.completion, self._events)
        return self.got
