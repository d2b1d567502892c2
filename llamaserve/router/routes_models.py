"""The router's model management: `/models` and `/v1/models` (the listing, `?reload=1` reads
the catalog again), `POST /models` (a download, router/downloads.py), `DELETE /models` (a cached
model removed), `/models/load`, `/models/unload` (which also cancels a download), and
`/models/sse` (status and download events)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamaserve.errors import APIError
from llamaserve.hub.cache import cache_dir
from llamaserve.hub.errors import DownloadError
from llamaserve.hub.remove import remove_cached_model
from llamaserve.router.context import context_of
from llamaserve.router.downloads import Downloads
from llamaserve.router.registry import Instance, Registry
from llamaserve.router.routes_forward import model_from_json
from llamaserve.sse import data_event

log = logging.getLogger("llamaserve.router")


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
        "can_remove": spec.source == "cache",
    }
    if inst.running:
        for key, value in inst.loaded_info.items():
            entry.setdefault(key, value)
    return entry


def _downloading(name: str, progress: dict[str, dict[str, int]], now: int) -> dict[str, Any]:
    """A model being downloaded (`POST /models`), as llama-server lists it until it is in the cache."""
    return {
        "id": name,
        "aliases": [],
        "tags": [],
        "object": "model",
        "owned_by": "llamacpp",
        "created": now,
        "status": {"value": "downloading", "progress": progress},
        "source": "cache",
        "can_remove": True,
    }


def listing(registry: Registry, downloads: Downloads | None = None) -> dict[str, Any]:
    now = int(time.time())
    shown = sorted((i for i in registry.models.values() if not i.spec.hidden), key=lambda i: i.name)
    data = [_entry(inst, now) for inst in shown]
    if downloads is not None:
        for name in sorted(downloads.jobs):
            if name not in registry.models:
                data.append(_downloading(name, downloads.progress(name) or {}, now))
    return {"data": data, "object": "list"}


async def models(request: Request) -> Response:
    ctx = context_of(request)
    if request.query_params.get("reload"):
        await ctx.registry.reload(ctx.reload_catalog())
    return JSONResponse(listing(ctx.registry, ctx.downloads))


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
    ctx = context_of(request)
    if await ctx.downloads.cancel(model_from_json(await request.body())):
        return JSONResponse({"success": True})  # a download cancelled, as llama-server does here
    inst = await _named(request)
    if inst is None:
        raise APIError("model is not found")
    if not inst.running:
        raise APIError("model is not running")
    context_of(request).registry.unload(inst)
    return JSONResponse({"success": True})


async def download(request: Request) -> Response:
    """`POST /models {"model": "ORG/NAME[:TAG]"}`: checked against the hub, then downloaded in the background."""
    ctx = context_of(request)
    name = model_from_json(await request.body())
    if not name:
        raise APIError("model must be a non-empty string")
    if ctx.registry.resolve(name) is not None:
        raise APIError(f"model '{name}' already exists")
    await ctx.downloads.start(name)
    return JSONResponse({"success": True})


async def remove(request: Request) -> Response:
    """`DELETE /models?model=NAME`: a model of the download cache stopped, deleted, and unlisted."""
    ctx = context_of(request)
    name = request.query_params.get("model", "")
    if not name:
        raise APIError("model must be a non-empty string")
    cancelled = await ctx.downloads.cancel(name)
    inst = ctx.registry.resolve(name)
    if inst is None and not cancelled:
        raise APIError(f"model name={name} is not found", "not_found_error")
    if inst is not None and inst.spec.source != "cache":
        raise APIError(f"model name={name} is not removable (not from cache)")
    if inst is not None:
        await ctx.registry.forget(inst)
        name = inst.name
    elif cancelled:
        ctx.registry.broadcast({"model": name, "event": "model_remove"})
    try:
        removed = await asyncio.to_thread(remove_cached_model, cache_dir(ctx.registry.environ), name)
    except DownloadError as exc:
        raise APIError(str(exc)) from exc
    log.info("removed model %s from the cache (%s)", name, "done" if removed else "no files left")
    return JSONResponse({"success": True})


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
