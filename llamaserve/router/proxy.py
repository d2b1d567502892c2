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

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from llamaserve.errors import APIError
from llamaserve.sse import data_event, named_event

log = logging.getLogger("llamaserve.router")

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


def request_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in _DROP_REQUEST]


def _response_headers(headers: httpx.Headers) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers.multi_items():
        low = key.lower()
        if low in _DROP_RESPONSE or low.startswith("access-control-"):
            continue
        out[key] = value
    return out


def _stream_error(path: str, message: str) -> bytes:
    error = APIError(message, "server_error")
    if path.startswith("/v1/messages"):
        return named_event("error", error.anthropic_body())
    return data_event(error.openai_body())


class Upstream:
    """One shared connection pool for every forwarded request."""

    def __init__(self, timeout: float) -> None:
        # No pool limit: each concurrent stream needs its own connection.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
        )

    async def close(self) -> None:
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
        url = base_url + path + (f"?{query}" if query else "")
        request = self.client.build_request(method, url, headers=request_headers(headers), content=body)
        try:
            upstream = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            if on_done is not None:
                on_done()
            raise APIError(f"model server unreachable: {type(exc).__name__}", "unavailable_error") from exc
        is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
        finished = False

        def done_once() -> None:
            nonlocal finished
            if not finished:
                finished = True
                if on_done is not None:
                    on_done()

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError as exc:
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

        return StreamingResponse(
            relay(),
            status_code=upstream.status_code,
            headers=_response_headers(upstream.headers),
            background=BackgroundTask(finish),
        )
