"""Vertex AI's prediction protocol (AIP_MODE=PREDICTION): `POST /predict`.

A body `{"instances": [...]}` answers `{"predictions": [...]}`, one per instance, in
order. Each instance names the route it is for in `@requestFormat`, either as the
route's camel-case alias (`chatCompletions` for `/v1/chat/completions`) or as the
path itself; the rest of the instance is that route's body. llama-server runs the
instances concurrently and never streams them; an instance that fails becomes its
own `{"error": ...}` prediction while the answer stays a 200.

Each instance goes through the whole app again (as a sub-request with the caller's
headers), so it meets the same key check, body limit and error envelopes as a
direct call.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from llamaserve.api.http import JSONUTF8Response, parse_json, read_body
from llamaserve.api.site_guard import is_guarded
from llamaserve.errors import APIError

MAX_INSTANCES = 128  # llama-server's bound


def route_alias(path: str) -> str:
    """llama-server's alias of a path: `/v1/chat/completions` → `chatCompletions`,
    `/apply-template` → `applyTemplate` (a leading /v1 dropped, separators capitalise)."""
    if path.startswith("/v1") and len(path) > 3:
        path = path[3:]
    if path.startswith("/"):
        path = path[1:]
    out: list[str] = []
    cap = False
    for c in path:
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def _targets(routers: list[APIRouter]) -> dict[str, tuple[str, str]]:
    """Every plain route by alias and by path → (path, method); the first registered wins.

    Routes with a path parameter are left out: an instance has nowhere to put it. So are the
    routes that act on the machine: a sub-request is sent as JSON whatever the outer request
    was, which would step around the site guard's Content-Type rule."""
    out: dict[str, tuple[str, str]] = {}
    for route in (r for router in routers for r in router.routes):
        if not isinstance(route, APIRoute) or "{" in route.path:
            continue
        methods = route.methods or {"POST"}
        method = "POST" if "POST" in methods else sorted(methods)[0]
        if is_guarded(method, route.path):
            continue
        out.setdefault(route_alias(route.path), (route.path, method))
        out.setdefault(route.path, (route.path, method))
    return out


def _error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return APIError(message, kind).openai_body()


async def _call(request: Request, path: str, method: str, body: bytes) -> Any:
    """One sub-request through the app; its body as JSON (else text, None when empty)."""
    scope = dict(request.scope)
    prefix = request.app.state.server.config.api_prefix
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope.update(
        path=prefix + path,
        raw_path=(prefix + path).encode(),
        method=method,
        query_string=b"",
        headers=headers,
        state={},
    )
    scope.pop("route", None)
    scope.pop("endpoint", None)
    scope.pop("path_params", None)
    sent = False
    chunks: list[bytes] = []
    streamed = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the caller's disconnect is not this sub-request's
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal streamed
        if message["type"] == "http.response.start":
            types = [v for k, v in message.get("headers", []) if k.lower() == b"content-type"]
            streamed = any(t.startswith(b"text/event-stream") for t in types)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await request.app(scope, receive, send)
    if streamed:
        return _error("predict route does not support streaming responses")
    data = b"".join(chunks)
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


async def _predict_one(request: Request, targets: dict[str, tuple[str, str]], instance: Any) -> Any:
    if not isinstance(instance, dict):
        return _error("each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return _error("each instance must include a string @requestFormat")
    target = targets.get(fmt)
    if target is None:
        return _error(f"no handler registered for @requestFormat: {fmt}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # one JSON answer per instance: the protocol has no streams
    try:
        return await _call(request, target[0], target[1], json.dumps(payload).encode())
    except Exception as exc:  # one instance's failure is its own prediction, not the batch's
        return _error(f"{type(exc).__name__}: {exc}", "server_error")


def add_predict_route(app: FastAPI, routers: list[APIRouter], route: str, health_route: str) -> None:
    """Register the predict route (and the extra health route) for the routes of `routers`."""
    targets = _targets(routers)
    if route in targets:
        raise ValueError(f"AIP_PREDICT_ROUTE={route} conflicts with an existing llama-server route")

    async def predict(request: Request) -> Response:
        data = parse_json(await read_body(request))
        if not isinstance(data, dict):
            raise APIError("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            raise APIError("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise APIError(f"instances array exceeds maximum size of {MAX_INSTANCES}")
        predictions = await asyncio.gather(*(_predict_one(request, targets, i) for i in instances))
        return JSONUTF8Response({"predictions": list(predictions)})

    app.add_api_route(route, predict, methods=["POST"])
    if health_route and health_route not in ("/health", "/v1/health"):
        health = next(r for rs in routers for r in rs.routes if isinstance(r, APIRoute) and r.path == "/health")
        app.add_api_route(health_route, health.endpoint, methods=["GET"])
