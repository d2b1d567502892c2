"""The HTTP side of a front for several servers: each request forwarded to the member the balancer picks.

Every route is forwarded (all API families, streams unchanged, through the router's proxy)
except the front's own `/health` (200 while a member is healthy), `/metrics` (every
member's, with an `upstream` label) and, when the front's own flags turn them on, the agent
tools and the MCP proxy (api/edge_tools.py). The edge (edge/app.py) checks keys, the site
guard, CORS and `--api-prefix` before any of it. The answer names its member in `x-llamaserve-upstream`.
A member that refuses the connection is marked down and the request goes to another one
(nothing was sent yet); one that breaks mid-answer fails only that answer, with an error
event in the API family's shape (the proxy's). Responses stay on the member that stored
them: the id of each created response is read from the first bytes of its answer, and a
later `previous_response_id` or `/v1/responses/{id}` goes to that member.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamaserve.api.edge_tools import EdgeTools
from llamaserve.config import ServerConfig
from llamaserve.edge.app import edge_app
from llamaserve.edge.metrics import merge_metrics
from llamaserve.edge.proxy import Upstream
from llamaserve.errors import APIError
from llamaserve.scale.balancer import Balancer, Choice, NoMember
from llamaserve.scale.prefix_index import block_hashes, prompt_text

log = logging.getLogger("llamaserve.scale")

SESSION_HEADERS = ("x-session-id", "x-conversation-id")
UPSTREAM_HEADER = "x-llamaserve-upstream"
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]+)"')
_SNIFF_BYTES = 65_536
_STORED = re.compile(r"^/v1/responses/([^/]+)")


def _json(body: Any, status: int = 200) -> Response:
    return JSONResponse(body, status_code=status)


def _parsed(request: Request, body: bytes) -> Any:
    if request.method != "POST" or not body or "json" not in request.headers.get("content-type", "json"):
        return None
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # the member answers the bad body in its own words


def session_key(headers: Mapping[str, str], conv_id: str | None) -> str:
    """What keeps a conversation together: `x-session-id`, a resumable stream's conversation id."""
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return f"{name}:{value}"
    return f"x-conversation-id:{conv_id}" if conv_id else ""


def response_ids(seen: bytes) -> list[str]:
    """The ids of created responses in the first bytes of an answer."""
    return [m.decode() for m in _RESPONSE_ID.findall(seen)]


def _sniffed(body: AsyncIterator[bytes], record: Callable[[str], None]) -> AsyncIterator[bytes]:
    async def relay() -> AsyncIterator[bytes]:
        seen = b""
        found = False
        async for chunk in body:
            if not found and len(seen) < _SNIFF_BYTES:
                seen += chunk
                ids = response_ids(seen)
                if ids:
                    found = True
                    record(ids[0])
            yield chunk

    return relay()


def _record(balancer: Balancer, url: str, response_id: str) -> None:
    balancer.record_response(response_id, url)


async def member_metrics(balancer: Balancer, client: httpx.AsyncClient) -> str:
    texts: dict[str, str] = {}
    for member in balancer.healthy():
        try:
            answer = await client.get(member.url + "/metrics", timeout=5.0)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200:
            texts[member.url] = answer.text
    own = [
        (
            "llamaserve:upstreams_healthy",
            "Upstream servers answering /health.",
            "gauge",
            float(len(balancer.healthy())),
        ),
        ("llamaserve:upstreams_total", "Upstream servers configured.", "gauge", float(len(balancer.members))),
    ]
    for member in balancer.members.values():
        own.append(
            (
                f'llamaserve:upstream_requests_in_flight{{upstream="{member.url}"}}',
                "Requests the front is forwarding to this upstream.",
                "gauge",
                float(member.inflight),
            )
        )
    # merge_metrics labels each member's samples `model=`; here the label names the server.
    return merge_metrics(texts, own).replace('{model="', '{upstream="')


@dataclass(frozen=True)
class _Front:
    """What the front's handlers share, kept on the app's state (see `_front_of`)."""

    balancer: Balancer
    upstream: Upstream


def _front_of(request: Request) -> _Front:
    front = request.app.state.front
    if not isinstance(front, _Front):  # only create_front_app builds apps these handlers serve
        raise TypeError("front route on an app without its balancer")
    return front


async def _health(request: Request) -> Response:
    if not _front_of(request).balancer.healthy():
        raise APIError("no upstream server is healthy", "unavailable_error")
    return _json({"status": "ok"})


async def _metrics(request: Request) -> Response:
    front = _front_of(request)
    return Response(await member_metrics(front.balancer, front.upstream.client), media_type="text/plain; version=0.0.4")


async def _try(front: _Front, request: Request, body: bytes, choice: Choice) -> Response | None:
    """The member's answer; None when it refused the connection (it is then marked down)."""
    member = choice.member
    front.balancer.started(member)
    log.debug("%s %s → %s (%s)", request.method, request.url.path, member.url, choice.reason)
    try:
        answer = await front.upstream.forward(
            member.url,
            request.method,
            request.url.path,
            request.url.query,
            request.headers.items(),
            body,
            on_done=functools.partial(front.balancer.finished, member),
        )
    except APIError as exc:
        # Upstream.forward speaks httpcore (not httpx): its ConnectError is the refusal.
        if not isinstance(exc.__cause__, httpcore.ConnectError):
            raise
        log.warning("upstream %s refused the connection: taken out until /health answers", member.url)
        front.balancer.set_health(member.url, False)
        return None
    answer.headers[UPSTREAM_HEADER] = member.url
    if request.url.path.startswith("/v1/responses") and isinstance(answer, StreamingResponse):
        answer.body_iterator = _sniffed(
            answer.body_iterator,  # type: ignore[arg-type]
            functools.partial(_record, front.balancer, member.url),
        )
    return answer


async def _send(front: _Front, request: Request, body: bytes, choose: Callable[[frozenset[str]], Choice]) -> Response:
    """Forward to the chosen member; one that refuses the connection (nothing was sent yet) is
    left out and the choice made again, until no member is left (503)."""
    tried: frozenset[str] = frozenset()
    while True:
        try:
            choice = choose(tried)
        except NoMember as exc:
            raise APIError(str(exc), "unavailable_error") from exc
        answer = await _try(front, request, body, choice)
        if answer is not None:
            return answer
        tried |= {choice.member.url}


async def _forwarded(request: Request) -> Response:
    """Every route but the front's own: the member the balancer picks for this request."""
    front = _front_of(request)
    body = await request.body()
    parsed = _parsed(request, body)
    hashes = block_hashes(prompt_text(parsed)) if parsed is not None else []
    session = session_key(request.headers, request.query_params.get("conv_id"))
    previous = ""
    if isinstance(parsed, dict) and isinstance(parsed.get("previous_response_id"), str):
        previous = parsed["previous_response_id"]
    stored = _STORED.match(request.url.path)
    if stored and request.method in ("GET", "DELETE"):
        previous = stored.group(1)

    def choose(tried: frozenset[str]) -> Choice:
        return front.balancer.choose(hashes, session, previous, tried)

    return await _send(front, request, body, choose)


def create_front_app(config: ServerConfig, balancer: Balancer, upstream: Upstream, tools: EdgeTools) -> FastAPI:
    """`tools`: what the front's own --tools/MCP servers/--ui-mcp-proxy turn on is answered here;
    what they leave off goes to the members, who answer for their own."""
    app = edge_app("llamaserve front", config)
    app.state.front = _Front(balancer, upstream)
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/v1/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    for tool_routes in tools.routes(only_enabled=True):
        app.include_router(tool_routes)
    app.add_api_route("/{path:path}", _forwarded, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    return app
