"""CORS as llama-server does it (server-http.cpp's pre-routing handler), as plain ASGI.

- `--cors-origins *` (the default) with credentials (the default): the request's `Origin`
  is reflected; without credentials: `Access-Control-Allow-Origin: *`.
- `--cors-origins localhost`: only an `http(s)://` origin whose host is `localhost`,
  `127.0.0.1` or `[::1]` (any port) is reflected; look-alikes such as
  `localhost.evil.com` get no header.
- a list of origins: the request's `Origin` is reflected when it is one of them exactly.
  (llama-server sends the configured text itself, comma-joined, which no browser accepts
  for more than one origin; reflecting the listed one is what the list means.)
- every OPTIONS request is a preflight: 200, an empty text/html body and exactly
  llama-server's four headers, answered before the key check and the loading check
  because browsers send preflights without credentials.

As in llama-server, `Access-Control-Allow-Credentials` goes only on preflight answers, and
the header names are spelled as llama-server spells them (HTTP names are case-insensitive,
but clients that copy headers into a plain dict, llama.cpp's own tests among them, are not).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from llamaserve.api.middleware import ASGIApp, Message, Receive, Scope, Send
from llamaserve.config import ServerConfig

LOCALHOST = "localhost"  # the special --cors-origins value
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def origin_is_localhost(origin: str) -> bool:
    """llama-server's origin_is_localhost: an http(s) URL whose host is a loopback name."""
    try:
        parts = urlsplit(origin)
        host = parts.hostname
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host in _LOCAL_HOSTS


@dataclass(frozen=True)
class CorsPolicy:
    origins: tuple[str, ...]
    methods: str
    headers: str
    credentials: bool

    @classmethod
    def from_config(cls, config: ServerConfig) -> CorsPolicy:
        return cls(
            origins=config.cors_origins,
            methods=", ".join(config.cors_methods),
            headers=", ".join(config.cors_headers),
            # Not given: on, llama-server's default.
            credentials=config.cors_credentials is not False,
        )

    def allow_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request's Origin, or None for no header.

        A request without an Origin is not cross-origin: llama-server then sends an empty
        value when reflecting, which means nothing to anyone, so none is sent.
        """
        if self.origins == ("*",):
            return (origin or None) if self.credentials else "*"
        if self.origins == (LOCALHOST,):
            return origin if origin and origin_is_localhost(origin) else None
        return origin if origin and origin in self.origins else None

    def preflight_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        headers = self.origin_header(origin)
        headers += [
            (b"Access-Control-Allow-Credentials", b"true" if self.credentials else b"false"),
            (b"Access-Control-Allow-Methods", self.methods.encode("latin-1")),
            (b"Access-Control-Allow-Headers", self.headers.encode("latin-1")),
            (b"Content-Type", b"text/html"),
            (b"Content-Length", b"0"),
        ]
        return headers

    def origin_header(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        allowed = self.allow_origin(origin)
        return [] if allowed is None else [(b"Access-Control-Allow-Origin", allowed.encode("latin-1"))]


class CORSMiddleware:
    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = _origin(scope)
        if scope.get("method") == "OPTIONS":
            await send({"type": "http.response.start", "status": 200, "headers": self.policy.preflight_headers(origin)})
            await send({"type": "http.response.body", "body": b""})
            return
        extra = self.policy.origin_header(origin)
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_origin(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_origin)


def _origin(scope: Scope) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"origin":
            return str(value.decode("latin-1"))
    return None
