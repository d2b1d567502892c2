"""ASGI middleware: API keys and one access-log line per request.

Written as plain ASGI (not Starlette's BaseHTTPMiddleware) so streaming
responses pass through untouched and without extra buffering.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
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
            body: dict[str, Any] = {"type": "error", "error": {"type": "authentication_error",
                                                               "message": "Invalid API Key"}}
        else:
            body = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
        payload = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-length", str(len(payload)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": payload})


class AccessLogMiddleware:
    """Logs method, path, status, duration and, when a route recorded them, token counts."""

    QUIET = {"/health", "/v1/health", "/metrics", "/slots"}

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
        except BaseException:
            self._log(scope, status or 500, start, state)
            raise

    def _log(self, scope: Scope, status: int, start: float, state: MutableMapping[str, Any]) -> None:
        path = scope.get("path", "")
        if path in self.QUIET and status < 400:
            return
        client = scope.get("client") or ("-", 0)
        tokens = state.get("tokens")
        extra = f" prompt={tokens[0]} cached={tokens[1]} predicted={tokens[2]}" if tokens else ""
        access_log.info("%s %s %s %d %.1fms%s", client[0], scope.get("method"), path, status,
                        (time.perf_counter() - start) * 1000.0, extra)
