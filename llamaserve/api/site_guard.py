"""Refuses, on the routes that act on the machine, what a page of another site could send.

CORS decides whether a page may *read* an answer; it does not stop a request from running.
A page on any site can make the user's browser send a "simple" request (GET or POST with a
text/plain, form or multipart body and no custom headers) to a server on localhost without
asking first, and a page whose own name it has rebound to 127.0.0.1 (DNS rebinding) even
talks to it as its own origin. So the routes that run tools, proxy requests, write files
or load models, and the Batch API's (`is_guarded`), refuse with 403:

- a `Host` that is not this machine's name or an address, when no API key is set: a
  rebound page sends its own name there (`--allowed-hosts` adds names, `*` turns it off);
- `Sec-Fetch-Site` other than `same-origin` or `none`: the browser says another site
  (another port of localhost is "same-site", and is another origin too);
- an `Origin` other than the server's own or one listed in `--cors-origins`;
- a body whose Content-Type is not JSON: a browser sends JSON cross-origin only after a
  preflight, and the other types are exactly what a page may send without one (the one
  exception, a multipart upload to POST /v1/files, is the OpenAI SDK's own shape: there the
  rules above are what refuse a foreign page's form);
- on `/cors-proxy`, a navigation: a page opening the proxy in a window would have the
  fetched page run as this origin.

Clients that send none of these browser headers (curl with a JSON body, the SDKs, llama.cpp's
tests) are unaffected. docs/security.md says who can send what, and why each rule exists.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from llamaserve.api.middleware import ASGIApp, Receive, Scope, Send, send_json
from llamaserve.config import ServerConfig

log = logging.getLogger("llamaserve.security")

# Every method: the agent tools and the MCP proxy act on the machine even on a GET.
_ANY_METHOD_PATHS = frozenset({"/tools", "/cors-proxy"})
# Writes only: their GETs are reads of state the web UI shows.
_WRITE_PATHS = frozenset({"/props", "/lora-adapters", "/models", "/models/load", "/models/unload"})
_WRITE_PREFIXES = ("/slots/",)
# The Batch API, every method: its writes store files and spend compute for hours, and its reads
# give out the prompts and answers of every batch (a rebound page must not read them).
_BATCH_ROOTS = ("/v1/files", "/v1/batches")
# Where a multipart body is the API's own shape (the SDK's file upload): the other rules still
# hold, and a browser sends a cross-site form with Origin and Sec-Fetch-Site, which they refuse.
_MULTIPART_PATHS = frozenset({"/v1/files"})
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SAFE_FETCH_SITES = frozenset({"same-origin", "none"})
_NAVIGATION_DESTS = frozenset({"document", "iframe", "frame", "embed", "object"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_guarded(method: str, path: str) -> bool:
    """Whether the request acts on the machine: tools, the proxy, slot files, LoRA, models, batches."""
    if path in _ANY_METHOD_PATHS or any(path == root or path.startswith(root + "/") for root in _BATCH_ROOTS):
        return True
    return method in _WRITES and (path in _WRITE_PATHS or path.startswith(_WRITE_PREFIXES))


def _split_host(value: str) -> tuple[str, int | None]:
    """`Host` as (lowercase name or address without brackets, port or None)."""
    try:
        parts = urlsplit("//" + value)
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return value.lower(), None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _same_origin(origin: str, host: str) -> bool:
    """The Origin names the host the request was sent to (ports by the Origin's scheme)."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port
    except ValueError:
        return False
    default = _DEFAULT_PORTS.get(parts.scheme)
    if default is None or not parts.hostname:
        return False
    name, port = _split_host(host)
    return parts.hostname.lower() == name and (origin_port or default) == (port or default)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(content_type: str) -> bool:
    kind = _media_type(content_type)
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _body_allowed(method: str, path: str, content_type: str) -> bool:
    """JSON, or a multipart form where the route takes one (POST /v1/files)."""
    if _is_json(content_type):
        return True
    return method == "POST" and path in _MULTIPART_PATHS and _media_type(content_type) == "multipart/form-data"


@dataclass(frozen=True)
class SitePolicy:
    """What the guarded routes accept; built once from the flags."""

    trusted_origins: frozenset[str]  # --cors-origins entries that name an origin exactly
    allowed_hosts: frozenset[str]  # --allowed-hosts, lowercase; "*" lets any Host through
    check_host: bool  # no API key: a rebound page needs nothing else to get in

    @classmethod
    def from_config(cls, config: ServerConfig) -> SitePolicy:
        listed = frozenset(o.rstrip("/") for o in config.cors_origins if o not in ("*", "localhost"))
        return cls(
            trusted_origins=listed,
            allowed_hosts=frozenset(h.lower() for h in config.allowed_hosts),
            check_host=not config.api_keys,
        )

    def host_allowed(self, host: str) -> bool:
        """A loopback name, an IP address (a rebound name never is one), or a name allowed."""
        if "*" in self.allowed_hosts or not host:
            return True
        name, _ = _split_host(host)
        return name == "localhost" or name.endswith(".localhost") or _is_address(name) or name in self.allowed_hosts

    def refusal(self, method: str, path: str, headers: Mapping[str, str]) -> str | None:
        """Why a guarded request is refused, or None. `headers` has lowercase names."""
        host = headers.get("host", "")
        if self.check_host and not self.host_allowed(host):
            name = _split_host(host)[0]
            return (
                f"Host '{name}' is not a name of this machine (a page that rebinds its own name to this "
                f"address sends it); start the server with --allowed-hosts {name} if it is yours"
            )
        site = headers.get("sec-fetch-site")
        if site is not None and site.lower() not in _SAFE_FETCH_SITES:
            return f"the browser says a page of another site sent this request (Sec-Fetch-Site: {site})"
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host) and origin.rstrip("/") not in self.trusted_origins:
            return f"Origin {origin} is not this server's origin nor one listed in --cors-origins"
        content_type = headers.get("content-type")
        if method in _WRITES and content_type is not None and not _body_allowed(method, path, content_type):
            takes = "multipart/form-data" if path in _MULTIPART_PATHS else "application/json"
            return (
                f"Content-Type {_media_type(content_type) or '(empty)'}: this route takes {takes} "
                "(a page of another site can send other types without the browser asking first)"
            )
        if path == "/cors-proxy" and (
            headers.get("sec-fetch-mode", "").lower() in ("navigate", "nested-navigate")
            or headers.get("sec-fetch-dest", "").lower() in _NAVIGATION_DESTS
        ):
            return "the MCP proxy answers the web UI's fetches only, never a page opened in a window"
        return None


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lowercase name (the last of a repeated name: none of those
    read here may repeat in a browser's request)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


class SiteGuardMiddleware:
    def __init__(self, app: ASGIApp, policy: SitePolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = str(scope.get("method", ""))
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or method == "OPTIONS" or not is_guarded(method, path):
            await self.app(scope, receive, send)
            return
        reason = self.policy.refusal(method, path, _headers(scope))
        if reason is None:
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("?", 0)
        log.warning("refused %s %s from %s: %s", method, path, client[0], reason)
        body = json.dumps({"error": {"code": 403, "message": reason, "type": "permission_error"}}).encode()
        await send_json(send, 403, body)
