"""ASGI middleware: API keys, one access-log line per request, idle tracking for sleep.

Written as plain ASGI (not Starlette's BaseHTTPMiddleware) so streaming
responses pass through untouched and without extra buffering.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, ClassVar

from llamaserve.errors import APIError
from llamaserve.serving.sleep import IdleSleeper

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

access_log = logging.getLogger("llamaserve.access")

# Paths anyone may read without a key: health checks and the web UI's files
# (the UI asks for the key itself before calling the API).
PUBLIC_PATHS = {"/health", "/v1/health", "/", "/index.html", "/favicon.ico", "/favicon.svg"}
PUBLIC_PREFIXES = ("/css/", "/js/", "/vendor/", "/static/", "/assets/")

# Reads that are not tasks for --sleep-idle-seconds (llama-server's list, plus
# /v1/models and the web UI's files): they neither wake a sleeping model nor
# restart the idle clock.
IDLE_EXEMPT_PATHS = PUBLIC_PATHS | {"/props", "/models", "/v1/models", "/metrics"}
# Not tasks whatever the method: the resumable-stream routes read buffered bytes only, the
# agent tools and the MCP proxy never touch the model, and the chat control route acts only on
# a running answer (a sleeping model runs none).
# The Batch API's own routes store and read files and batches, never the model (a batch's lines
# are sub-requests to the generating routes, tasks of their own): a client polling a batch's
# status keeps no model awake.
IDLE_EXEMPT_ROOTS = ("/v1/files", "/v1/batches")
IDLE_EXEMPT_ANY_METHOD = {"/v1/stream", "/v1/streams/lookup", "/tools", "/cors-proxy", "/v1/chat/completions/control"}


async def send_json(
    send: Send, status: int, payload: bytes, extra_headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    """A whole JSON answer from plain ASGI middleware, before any route runs (401, 403, 404, 408)."""
    headers = [(b"content-type", b"application/json; charset=utf-8"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *extra_headers]})
    await send({"type": "http.response.body", "body": payload})


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def presented_key(scope: Scope) -> str | None:
    auth = _header(scope, b"authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return _header(scope, b"x-api-key")


def key_is_valid(candidate: str | None, keys: tuple[str, ...]) -> bool:
    """Constant-time comparison against every key (no early exit on a match)."""
    if candidate is None:
        return False
    given = candidate.encode()
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.encode())
    return ok


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or key_is_valid(presented_key(scope), self.keys):
            await self.app(scope, receive, send)
            return
        if path.startswith("/v1/messages"):
            body: dict[str, Any] = {
                "type": "error",
                "error": {"type": "authentication_error", "message": "Invalid API Key"},
            }
        else:
            body = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
        await send_json(send, 401, json.dumps(body).encode(), ((b"www-authenticate", b"Bearer"),))


class AccessLogMiddleware:
    """Logs method, path, status, duration and, when a route recorded them, token counts."""

    QUIET: ClassVar[set[str]] = {"/health", "/v1/health", "/metrics", "/slots"}

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0
        state = scope.setdefault("state", {})

        async def logging_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self._log(scope, status, start, state)

        try:
            await self.app(scope, receive, logging_send)
        except BaseException as exc:
            # An exception may say what the client is answered (a stalled read: 408).
            self._log(scope, status or getattr(exc, "http_status", 500), start, state)
            raise

    def _log(self, scope: Scope, status: int, start: float, state: MutableMapping[str, Any]) -> None:
        path = scope.get("path", "")
        if path in self.QUIET and status < 400:
            return
        client = scope.get("client") or ("-", 0)
        tokens = state.get("tokens")
        extra = f" prompt={tokens[0]} cached={tokens[1]} predicted={tokens[2]}" if tokens else ""
        access_log.info(
            "%s %s %s %d %.1fms%s",
            client[0],
            scope.get("method"),
            path,
            status,
            (time.perf_counter() - start) * 1000.0,
            extra,
        )


class IdleMiddleware:
    """Feeds --sleep-idle-seconds: counts every task from arrival until its response is complete.

    Plain ASGI because only here the end of a streamed body is visible: the app
    call returns after the last chunk (or the client's disconnect), so a long
    generation is never put to sleep. Sits inside the API-key check, so a
    request without a valid key never wakes the model.
    """

    def __init__(self, app: ASGIApp, sleeper: IdleSleeper) -> None:
        self.app = app
        self.sleeper = sleeper

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.sleeper.start()  # the lifespan call at startup gets here first
        if (
            scope["type"] != "http"
            or scope.get("method") == "OPTIONS"
            or scope.get("path", "") in IDLE_EXEMPT_ANY_METHOD
            or _under(scope.get("path", ""), IDLE_EXEMPT_ROOTS)
            or (
                scope.get("method") in ("GET", "HEAD")
                and (scope.get("path", "") in IDLE_EXEMPT_PATHS or scope.get("path", "").startswith(PUBLIC_PREFIXES))
            )
        ):
            await self.app(scope, receive, send)
            return
        self.sleeper.begin()
        try:
            try:
                await self.sleeper.awake()
            except APIError as exc:  # the reload failed: this task cannot run
                anthropic = scope.get("path", "").startswith("/v1/messages")
                payload = json.dumps(exc.anthropic_body() if anthropic else exc.openai_body()).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": exc.status,
                        "headers": [
                            (b"content-type", b"application/json; charset=utf-8"),
                            (b"content-length", str(len(payload)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": payload})
                return
            await self.app(scope, receive, send)
        finally:
            self.sleeper.end()
