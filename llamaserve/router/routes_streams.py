"""Resumable streams through the router: `GET /v1/stream`, `DELETE /v1/stream` and
`POST /v1/streams/lookup` go to the child whose model serves the conversation
(router/streams.py remembers which)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llamaserve.errors import APIError
from llamaserve.router.context import RouterContext, context_of
from llamaserve.router.registry import LOADED, LOADING, SLEEPING, Instance
from llamaserve.router.routes_forward import forward

_CHILD_TIMEOUT_S = 5  # a child that does not answer a stop or a lookup in time is left out


def owner_of(ctx: RouterContext, conv_id: str) -> Instance | None:
    """The loaded model serving a conversation's stream; 503 while it is still loading."""
    if not conv_id:
        raise APIError("Missing conversation id in path")
    name = ctx.owners.model_of(conv_id)
    inst = ctx.registry.resolve(name) if name else None
    if inst is None:
        return None
    if inst.status in (LOADED, SLEEPING) and inst.child is not None:
        return inst
    if inst.status == LOADING:
        raise APIError("Stream owner model is loading, retry later", "unavailable_error")
    return None


async def stream_get(request: Request) -> Response:
    ctx = context_of(request)
    inst = owner_of(ctx, request.query_params.get("conv_id", ""))
    if inst is None:
        raise APIError("Stream not found or expired", "not_found_error")
    return await forward(ctx, request, inst, b"", touch=False, gone=request.is_disconnected)


async def stream_delete(request: Request) -> Response:
    ctx = context_of(request)
    conv_id = request.query_params.get("conv_id", "")
    try:
        inst = owner_of(ctx, conv_id)
    except APIError as exc:
        if exc.status != 503:
            raise
        inst = None  # still loading: forgetting the entry below cancels the parked request
    if inst is not None and inst.child is not None:
        with contextlib.suppress(httpx.HTTPError):
            await ctx.upstream.client.delete(
                inst.child.base_url + "/v1/stream", params={"conv_id": conv_id}, timeout=_CHILD_TIMEOUT_S
            )
    ctx.owners.forget(conv_id)
    return Response(status_code=204)


def _asked_per_child(ctx: RouterContext, ids: object) -> dict[str, list[str]]:
    """The asked conversation ids grouped by the base URL of the child serving each."""
    per_child: dict[str, list[str]] = {}
    for conv_id in ids if isinstance(ids, list) else []:
        if not isinstance(conv_id, str) or not conv_id:
            continue
        with contextlib.suppress(APIError):
            inst = owner_of(ctx, conv_id)
            if inst is not None and inst.child is not None:
                per_child.setdefault(inst.child.base_url, []).append(conv_id)
    return per_child


async def _lookup_on(ctx: RouterContext, base_url: str, wanted: list[str]) -> list[Any]:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        answer = await ctx.upstream.client.post(
            base_url + "/v1/streams/lookup", json={"conversation_ids": wanted}, timeout=_CHILD_TIMEOUT_S
        )
        if answer.status_code == 200 and isinstance(answer.json(), list):
            return [e for e in answer.json() if isinstance(e, dict)]
    return []


async def streams_lookup(request: Request) -> Response:
    ctx = context_of(request)
    try:
        parsed = json.loads(await request.body() or b"{}")
    except ValueError:
        return JSONResponse([])
    ids = parsed.get("conversation_ids") if isinstance(parsed, dict) else None
    found: list[Any] = []
    for base_url, wanted in _asked_per_child(ctx, ids).items():
        found += await _lookup_on(ctx, base_url, wanted)
    return JSONResponse(found)
