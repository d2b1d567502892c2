"""`/cors-proxy?url=...` (--ui-mcp-proxy): lets the web UI reach a remote MCP server that
sends no CORS headers of its own, as llama-server's proxy does.

Only headers the page names explicitly travel on (`x-llama-server-proxy-header-<name>: v`
becomes `<name>: v`): the browser's cookies, our API key and any Authorization meant for us
stay here. The target must be an http(s) URL without credentials in it. The answer streams
back with its status and headers (a 204 stays empty), so an MCP server's event stream works.
Off, both methods answer 403 "this feature is disabled".

What comes back is served from our own origin, so it must never act there: the target's
cookies are dropped, and every answer carries a sandboxing Content-Security-Policy (a page
opened on the proxy runs no script, in an opaque origin) and `nosniff`. The target may not
resolve to a link-local or cloud metadata address (`llamaserve/outbound.py`), and the name
is resolved once and connected to as checked. api/site_guard.py refuses the route to
requests from other sites and to navigations before any of this runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from llamaserve.api.body import read_body
from llamaserve.api.routes_tools import disabled
from llamaserve.errors import APIError
from llamaserve.outbound import PROXY, AddressRefused, pinned_request_args, resolve_allowed

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0  # llama-server's read and write timeouts
# Hop-by-hop headers, and the length of a body that we send on in chunks.
_DROPPED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
    | {"proxy-authenticate", "proxy-authorization"}
    # The target's cookies would be set on our origin; its own policy is replaced by ours.
    | {"set-cookie", "set-cookie2", "content-security-policy", "x-content-type-options"}
)
# Whatever the target sends, it runs nothing on our origin: no script, no plugin, no form,
# an opaque origin of its own.
_CONFINE = {"content-security-policy": "sandbox; default-src 'none'", "x-content-type-options": "nosniff"}


def _target(request: Request) -> str:
    url = request.query_params.get("url", "")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise APIError(f"invalid target URL: {url}") from None
    if not host:
        raise APIError("invalid target URL: missing host")
    if parts.password:
        raise APIError("authentication in target URL is not supported")
    if parts.scheme not in ("http", "https"):
        raise APIError(f"unsupported URL scheme in target URL: {parts.scheme}")
    return url if parts.path else url.replace(parts.netloc, parts.netloc + "/", 1)


def _forwarded(request: Request) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in request.headers.items():
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX):
            out[key[len(PREFIX) :]] = value
    return out


def cors_proxy_routes(enabled: bool) -> APIRouter:
    router = APIRouter()

    @router.api_route("/cors-proxy", methods=["GET", "POST"])
    async def proxy(request: Request) -> Response:
        if not enabled:
            return disabled()
        import httpx  # deferred: a server without --ui-mcp-proxy never loads the HTTP client

        url = _target(request)
        try:
            address = await resolve_allowed(url, PROXY)
        except AddressRefused as exc:
            raise APIError(f"the proxy refuses this target: {exc}", "permission_error") from None
        target, host, extensions = pinned_request_args(url, address)
        body = await read_body(request) if request.method == "POST" else b""
        client = httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False)
        try:
            outgoing = client.build_request(
                request.method, target, headers={**_forwarded(request), **host}, content=body, extensions=extensions
            )
            upstream = await client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            raise APIError(f"proxy request failed: {exc}", "server_error", status=502) from exc
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED} | _CONFINE

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        if upstream.status_code in (204, 304):
            await upstream.aclose()
            await client.aclose()
            return Response(status_code=upstream.status_code, headers=headers)
        return StreamingResponse(relay(), status_code=upstream.status_code, headers=headers)

    return router
