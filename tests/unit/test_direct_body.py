"""Streamed bodies written straight to the connection (api/direct_body.py): the bytes on the wire
are uvicorn's chunked framing of every chunk in order, for a client that reads at once and for
one that stops reading for a while (then the chunks wait in `send` as before); the response's
start and end still pass the middleware (the access log's line); and the chat stream's
pre-built chunk bytes are those of the whole JSON encoding."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn

from llamaserve.api.middleware import AccessLogMiddleware
from llamaserve.api.sse import SSEResponse
from llamaserve.api.timeouts import read_timeout_protocol
from llamaserve.sse import OneStringEvent, data_event

CHUNKS = [f"data: {i} {'x' * (i % 700)}\n\n".encode() for i in range(3000)]
PASSED: list[str] = []  # the messages that went through the middleware's send, by type


def _counting(app: Any) -> Any:
    async def middleware(scope: Any, receive: Any, send: Any) -> None:
        async def counted_send(message: Any) -> None:
            PASSED.append(message["type"])
            await send(message)

        await app(scope, receive, counted_send)

    return middleware


async def _stream_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return

    async def body() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk

    await SSEResponse(body())(scope, receive, send)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    protocol = read_timeout_protocol(30.0)
    assert protocol is not None
    number = _free_port()
    config = uvicorn.Config(
        AccessLogMiddleware(_counting(_stream_app)), host="127.0.0.1", port=number, http=protocol, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.02)
    yield number
    server.should_exit = True
    thread.join(10)


def _fetch(port: int, pause_s: float) -> bytes:
    """The raw answer to one request, read after `pause_s` (the server's writes pile up meanwhile)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sendall(b"GET /stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        time.sleep(pause_s)
        data = b""
        while part := conn.recv(65536):
            data += part
    return data


def _chunked(expected: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in expected) + b"0\r\n\r\n"


@pytest.mark.parametrize("pause_s", [0.0, 0.5])
def test_every_chunk_arrives_in_order_in_uvicorns_framing(port: int, pause_s: float) -> None:
    head, _, body = _fetch(port, pause_s).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
    assert body == _chunked(CHUNKS)


def test_the_middle_of_the_stream_passes_the_middleware_by(port: int, caplog: Any) -> None:
    PASSED.clear()
    with caplog.at_level(logging.INFO, logger="llamaserve.access"):
        _fetch(port, 0.0)
        for _ in range(100):
            if any("GET /stream 200" in r.getMessage() for r in caplog.records):
                break
            time.sleep(0.02)
    assert any("GET /stream 200" in r.getMessage() for r in caplog.records)  # the end went through
    # The start, the end, and only the chunks written while the client was behind.
    assert PASSED[0] == "http.response.start" and PASSED.count("http.response.body") < len(CHUNKS) // 2


def test_a_prebuilt_event_is_the_whole_encoding() -> None:
    envelope = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": 'm"é\\'}
    for index in (0, 2):
        shape = {"choices": [{"index": index, "delta": {"content": OneStringEvent.MARK}, "finish_reason": None}]}
        event = OneStringEvent({**envelope, **shape})
        for text in ["", " river", 'é"\\\n\t\x00\u2028\U0001f600', "</script>", OneStringEvent.MARK]:
            whole = {"choices": [{"index": index, "delta": {"content": text}, "finish_reason": None}]}
            assert event.event(text) == data_event({**envelope, **whole})


def test_a_shape_without_exactly_one_mark_is_refused() -> None:
    with pytest.raises(ValueError):
        OneStringEvent({"a": "b"})
    with pytest.raises(ValueError):
        OneStringEvent({"a": OneStringEvent.MARK, "b": OneStringEvent.MARK})
