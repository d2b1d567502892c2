"""Forwarding one HTTP request to another server, answers streamed back chunk by chunk.

Independent of where the server comes from (a child process of the router, or any
llama-server-compatible base URL): `Upstream.forward(base_url, ...)` sends the method,
path, query, headers and body, and returns a Starlette response that relays the
status, the headers and each body chunk as it arrives (SSE unbuffered). A client that
goes away closes the upstream response, so the other server sees the disconnect and
frees its slot. A connection that breaks mid-answer ends a stream with an error event
in the API family's shape.
"""

from __future__ import annotations

import functools
import logging
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpcore
import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from llamaserve.errors import APIError
from llamaserve.sse import data_event, named_event

log = logging.getLogger("llamaserve.router")  # the name its lines always had (log filters know it)

# Request headers that describe this hop, not the request (httpx sets its own).
_DROP_REQUEST = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "accept-encoding",  # answers pass through undecoded, so ask for none
    "upgrade",
    "te",
    "proxy-connection",
}
# Answer headers the router sets itself (CORS included: the router's own policy applies).
_DROP_RESPONSE = {"server", "date", "transfer-encoding", "content-length", "keep-alive", "connection"}


# The browser's word on where a request comes from: the edge (router, front) judged it against
# its own origin already, and the server behind, reached at another address, would judge it
# against that one and refuse the web UI's own requests.
_DROP_SITE = {"origin"}
_DROP_SITE_PREFIX = "sec-fetch-"


def _forwardable(name: str) -> bool:
    low = name.lower()
    return low not in _DROP_REQUEST and low not in _DROP_SITE and not low.startswith(_DROP_SITE_PREFIX)


def forwardable_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The client's headers less those that describe its own connection (hop-by-hop, length)
    and those that say which site sent it."""
    return [(k, v) for k, v in headers if _forwardable(k)]


def transparent_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """For a server with no edge of ours in front (a Ray replica's child): the client's `Host`
    and site headers travel, so it judges the request as the browser sent it."""
    return [(k, v) for k, v in headers if k.lower() == "host" or k.lower() not in _DROP_REQUEST]


def request_headers(headers: Iterable[tuple[str, str]], host: str, length: int) -> list[tuple[bytes, bytes]]:
    out = [(b"host", host.encode("latin-1")), (b"content-length", str(length).encode())]
    out += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in forwardable_headers(headers)]
    return out


def _response_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for raw_key, raw_value in headers:
        key = raw_key.decode("latin-1")
        low = key.lower()
        if low in _DROP_RESPONSE or low.startswith("access-control-"):
            continue
        out.append((key, raw_value.decode("latin-1")))
    return out


def _stream_error(path: str, message: str) -> bytes:
    error = APIError(message, "server_error")
    if path.startswith("/v1/messages"):
        return named_event("error", error.anthropic_body())
    return data_event(error.openai_body())


class _Relay(StreamingResponse):
    """A streaming response whose headers are given as a list (repeated names kept)."""

    def __init__(self, body: AsyncIterator[bytes], status: int, headers: list[tuple[str, str]], done: BackgroundTask):
        super().__init__(body, status_code=status, background=done)
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


class Upstream:
    """One connection pool for every forwarded request (httpcore: httpx's own transport,
    without the client layer that costs a millisecond per request on a busy machine), and an
    httpx client for the router's own small calls (health, listings, metrics)."""

    def __init__(self, timeout: float) -> None:
        # No pool limit: each concurrent stream needs its own connection.
        self.pool = httpcore.AsyncConnectionPool(max_connections=None, max_keepalive_connections=64)
        self.timeouts = {"connect": 10.0, "read": timeout, "write": timeout, "pool": timeout}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), trust_env=False)

    async def close(self) -> None:
        await self.pool.aclose()
        await self.client.aclose()

    async def forward(
        self,
        base_url: str,
        method: str,
        path: str,
        query: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        on_done: Callable[[], Any] | None = None,
    ) -> Response:
        """The upstream's answer as a streaming response; `on_done` runs once it has been relayed.

        An upstream that cannot be reached is an APIError (503), with `on_done` already run.
        """
        scheme, host, port, base_path = _split(base_url)
        request = httpcore.Request(
            method.encode(),
            httpcore.URL(scheme=scheme, host=host, port=port, target=_target(base_path + path, query)),
            headers=request_headers(headers, f"{host.decode()}:{port}", len(body)),
            content=body,
            extensions={"timeout": self.timeouts},
        )
        try:
            upstream = await self.pool.handle_async_request(request)
        except _ERRORS as exc:
            if on_done is not None:
                on_done()
            raise APIError(f"model server unreachable: {type(exc).__name__}", "unavailable_error") from exc
        out_headers = _response_headers(upstream.headers)
        is_sse = any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in out_headers)
        finished = False

        def done_once() -> None:
            nonlocal finished
            if not finished:
                finished = True
                if on_done is not None:
                    on_done()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_stream():
                    yield chunk
            except _ERRORS as exc:
                log.warning("upstream %s%s broke mid-answer: %s", base_url, path, type(exc).__name__)
                if is_sse:
                    yield _stream_error(path, "the model server stopped while answering")
            finally:
                # Runs on completion, on an upstream failure and when the client disconnects
                # (Starlette cancels the iteration): closing drops the upstream connection.
                await upstream.aclose()
                done_once()

        async def finish() -> None:
            await upstream.aclose()
            done_once()

        return _Relay(relay(), upstream.status, out_headers, BackgroundTask(finish))


@functools.lru_cache(maxsize=256)
def _split(base_url: str) -> tuple[bytes, bytes, int, str]:
    """Scheme, host, port and the path every forwarded path goes under (a server's --api-prefix)."""
    parts = urllib.parse.urlsplit(base_url)
    return (
        parts.scheme.encode(),
        (parts.hostname or "").encode(),
        parts.port or (443 if parts.scheme == "https" else 80),
        parts.path.rstrip("/"),
    )


def _target(path: str, query: str) -> bytes:
    return (path + (f"?{query}" if query else "")).encode("latin-1")


_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, OSError)
