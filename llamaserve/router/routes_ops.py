"""What the router answers about itself: `/health`, `/props` and `/metrics` (each of the last
two forwarded to a model instead when `?model=` names one)."""

from __future__ import annotations

import json

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from llamaserve.buildtag import build_tag
from llamaserve.edge.metrics import merge_metrics
from llamaserve.errors import APIError
from llamaserve.router.context import RouterContext, context_of
from llamaserve.router.registry import LOADED, SLEEPING
from llamaserve.router.routes_forward import routed

_METRICS_TIMEOUT_S = 5.0  # a child slow to answer /metrics is left out of this scrape


async def health() -> Response:
    return JSONResponse({"status": "ok"})


async def props(request: Request) -> Response:
    if request.query_params.get("model"):
        return await routed(request, touch=False)
    config = context_of(request).config
    return JSONResponse(
        {
            "role": "router",
            "max_instances": config.models_max,
            "models_autoload": config.models_autoload,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": json.loads(config.webui_config) if config.webui_config else {},
            "build_info": build_tag(),  # the children's (compose.BUILD_INFO), without loading llama.cpp
            "cors_proxy_enabled": config.ui_mcp_proxy,
        }
    )


async def _children_metrics(ctx: RouterContext) -> dict[str, str]:
    """Each loaded model's /metrics text, by model name (one that fails is left out)."""
    texts: dict[str, str] = {}
    for inst in list(ctx.registry.models.values()):
        child = inst.child
        if inst.status not in (LOADED, SLEEPING) or child is None:
            continue
        try:
            answer = await ctx.upstream.client.get(child.base_url + "/metrics", timeout=_METRICS_TIMEOUT_S)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200:
            texts[inst.name] = answer.text
    return texts


async def metrics(request: Request) -> Response:
    if request.query_params.get("model"):
        return await routed(request, touch=False)
    ctx = context_of(request)
    if not ctx.config.endpoint_metrics:
        raise APIError(
            "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error"
        )
    texts = await _children_metrics(ctx)
    registry = ctx.registry
    loaded = sum(1 for i in registry.models.values() if i.status in (LOADED, SLEEPING))
    own = [
        ("llamaserve:router_models_loaded", "Models loaded by the router.", "gauge", float(loaded)),
        ("llamaserve:router_models_queued", "Models requests wait for.", "gauge", float(len(registry.queue))),
    ]
    return Response(merge_metrics(texts, own), media_type="text/plain; version=0.0.4")
