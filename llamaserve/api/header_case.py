"""llama-server's spelling of some header names (CORS, /metrics' start time), put back after
uvicorn lowercases them.

uvicorn's httptools protocol writes every response header name in lower case. HTTP names
are case-insensitive and browsers do not care, but clients that copy the headers into a
plain dict do (llama.cpp's own server tests read `headers["Access-Control-Allow-Origin"]`).
Only the status line and header block of a response are touched, only for these names.
"""

from __future__ import annotations

_SPELLING = {
    name.lower().encode(): name.encode()
    for name in (
        "Access-Control-Allow-Origin",
        "Access-Control-Allow-Credentials",
        "Access-Control-Allow-Methods",
        "Access-Control-Allow-Headers",
        "Process-Start-Time-Unix",  # /metrics
    )
}


def respell_headers(data: bytes) -> bytes:
    """`data` with those names respelled, when it starts a response; else unchanged."""
    if not data.startswith(b"HTTP/1.1 ") or (
        b"\r\naccess-control-" not in data and b"\r\nprocess-start-time-unix" not in data
    ):
        return data
    end = data.find(b"\r\n\r\n")
    head, rest = (data, b"") if end < 0 else (data[:end], data[end:])
    for lower, spelled in _SPELLING.items():
        head = head.replace(b"\r\n" + lower + b": ", b"\r\n" + spelled + b": ")
    return head + rest
