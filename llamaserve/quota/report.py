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


def read_header(value: bytes, into: Reported) -> None:
    parts = value.decode("latin-1").split(" ")
    if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]):
        return
    into.prompt, into.cached, into.completion = (int(p) for p in parts[:3])
    into.model = urllib.parse.unquote(parts[3])


def read_comment(data: bytes, into: Reported) -> bool:
    """The counts of a comment in `data`, if it holds a whole one."""
    found = _COMMENT_RE.search(data)
    if found is None:
        return False
    into.prompt, into.cached, into.completion = (int(g) for g in found.groups())
    return True
