"""The router's model management: `/models` and `/v1/models` (the listing, `?reload=1` reads
the catalog again), `/models/load`, `/models/unload`, and `/models/sse` (status events)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamaserve.errors import APIError
from llamaserve.router.context import context_of
from llamaserve.router.registry import Instance, Registry
from llamaserve.router.routes_forward import model_from_json
from llamaserve.sse import data_event


def _status(inst: Instance) -> dict[str, Any]:
    status: dict[str, Any] = {
        "value": inst.status,
        "args": inst.args,
        "preset": inst.spec.preset.ini_text(inst.spec.name),
    }
    if inst.failed:
        status["failed"] = True
        status["exit_code"] = inst.exit_code
        status["log_tail"] = inst.log_tail
    return status


def _entry(inst: Instance, now: int) -> dict[str, Any]:
    """One model as llama-server's router lists it; a running one adds its child's own fields."""
    spec = inst.spec
    entry: dict[str, Any] = {
        "id": spec.name,
        "aliases": list(spec.aliases),
        "tags": list(spec.tags),
        "object": "model",
        "owned_by": "llamacpp",
        "created": now,
        "status": _status(inst),
        "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
        "source": spec.source,
        "can_remove": False,
    }
    if inst.running:
        for key, value in inst.loaded_info.items():
            entry.setdefault(key, value)
    return entry


def listing(registry: Registry) -> dict[str, Any]:
    now = int(time.time())
    shown = sorted((i for i in registry.models.values() if not i.spec.hidden), key=lambda i: i.name)
    return {"data": [_entry(inst, now) for inst in shown], "object": "list"}


async def models(request: Request) -> Response:
    ctx = context_of(request)
    if request.query_params.get("reload"):
        await ctx.registry.reload(ctx.reload_catalog())
    return JSONResponse(listing(ctx.registry))


async def _named(request: Request) -> Instance | None:
    name = model_from_json(await request.body())
    return context_of(request).registry.resolve(name) if name else None


async def load(request: Request) -> Response:
    inst = await _named(request)
    if inst is None:
        raise APIError("model is not found", "not_found_error")
    if inst.running:
        raise APIError("model is already running")
    await context_of(request).registry.load(inst)
    return JSONResponse({"success": True})


async def unload(request: Request) -> Response:
    inst = await _named(request)
    if inst is None:
        raise APIError("model is not found")
    if not inst.running:
        raise APIError("model is not running")
    context_of(request).registry.unload(inst)
    return JSONResponse({"success": True})


async def manage(request: Request) -> Response:
    raise APIError("downloading and removing models through the router is not supported", "not_supported_error")


async def models_sse(request: Request) -> Response:
    registry = context_of(request).registry
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    registry.subscribers.add(queue)

    async def events() -> AsyncIterator[bytes]:
        try:
            yield b": connected\n\n"
            while True:
                yield data_event(await queue.get())
        finally:
            registry.subscribers.discard(queue)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
