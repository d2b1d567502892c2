"""The router's HTTP side: its own routes, and every other route forwarded to a model.

A POST names its model in the body's `model` (a multipart body in its `model` field), a
GET or DELETE in `?model=`; aliases resolve to their model. `?autoload=true|false`
overrides `--models-autoload` for one request. The router answers `/health`, `/props`
(without `?model=`), `/models` and `/v1/models`, `/models/load`, `/models/unload`,
`/models/sse`, `/metrics` (without `?model=`: every loaded model's, labelled) and the
web UI's files; API keys are checked here once, the children have none.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse

from llamaserve.config import ServerConfig
from llamaserve.errors import APIError
from llamaserve.router.catalog import ModelSpec
from llamaserve.router.edge import edge_app
from llamaserve.router.metrics import merge_metrics
from llamaserve.router.proxy import Upstream
from llamaserve.router.registry import FAKE_DELAY_S, LOADED, LOADING, SLEEPING, Instance, Registry
from llamaserve.router.streams import CONV_HEADER, ConversationOwners
from llamaserve.sse import data_event
from llamaserve.webui import STATIC_DIR, headers_for

log = logging.getLogger("llamaserve.router")


def _build_info() -> str:
    """The children's build_info (compose.BUILD_INFO), read without loading llama.cpp."""
    try:
        bindings = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        bindings = "unknown"
    return f"llamaserve-0.1.0 (llama-cpp-python {bindings})"


def _json(body: Any, status: int = 200) -> Response:
    return JSONResponse(body, status_code=status)


def _autoload(request: Request, default: bool) -> bool:
    value = request.query_params.get("autoload")
    if value is None or value == "":
        return default
    return value in ("true", "1")


def _model_from_json(body: bytes) -> str:
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(f"invalid JSON body: {exc}") from exc
    value = parsed.get("model") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else ""


async def _model_of(request: Request, body: bytes) -> str:
    if request.method in ("GET", "DELETE", "HEAD"):
        return request.query_params.get("model", "")
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form()
        value = form.get("model")
        return value if isinstance(value, str) else ""
    return _model_from_json(body)


def _static(root: Path, path: str) -> Response | None:
    """A file of the web UI (or of --path), when `path` names one (`/` is the page)."""
    rel = path.lstrip("/") or "index.html"
    target = (root / rel).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return None
    return FileResponse(target, headers=headers_for(str(target)))


def create_router_app(
    config: ServerConfig,
    registry: Registry,
    upstream: Upstream,
    reload_catalog: Callable[[], dict[str, ModelSpec]],
) -> FastAPI:
    app = edge_app("llamaserve router", config)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _json(APIError(str(exc.detail), kind, status=exc.status_code).openai_body(), exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return _json(APIError(f"internal error: {type(exc).__name__}", "server_error").openai_body(), 500)

    owners = ConversationOwners()
    static_root = Path(config.static_path).resolve() if config.static_path else STATIC_DIR

    def validate(name: str, autoload: bool) -> Instance:
        if not name:
            raise APIError("model name is missing from the request")
        inst = registry.resolve(name)
        if inst is None:
            raise APIError(f"model '{name}' not found")
        if not autoload and not inst.running:
            raise APIError("model is not loaded")
        return inst

    async def forward(
        request: Request,
        inst: Instance,
        body: bytes,
        *,
        touch: bool,
        gone: Callable[[], Awaitable[bool]],
        conv: tuple[str, int] | None = None,
    ) -> Response:
        await registry.acquire(inst, gone, touch=touch)
        leased = inst.child  # the lease belongs to this process, not to a later one of the model
        try:
            if registry.fake_timing:
                await asyncio.sleep(FAKE_DELAY_S)
            if conv is not None and not owners.alive(*conv):
                raise APIError("request cancelled by a stop while the model was loading")
            child = inst.child
            if child is None or child is not leased:
                raise APIError(f"model '{inst.name}' stopped", "unavailable_error")
        except BaseException:
            registry.release(inst, leased)
            raise
        return await upstream.forward(
            child.base_url,
            request.method,
            request.url.path,
            request.url.query,
            request.headers.items(),
            body,
            on_done=lambda: registry.release(inst, child),
        )

    async def routed(request: Request, *, touch: bool) -> Response:
        body = await request.body()
        inst = validate(await _model_of(request, body), _autoload(request, config.models_autoload))
        conv_id = request.headers.get(CONV_HEADER, "") if request.method == "POST" else ""
        ticket = owners.remember(conv_id, inst.name)
        if not ticket:
            return await forward(request, inst, body, touch=touch, gone=request.is_disconnected)

        # A session request keeps waiting for its model when its client drops (a later resume
        # reads the session); only a stop of the conversation cancels it.
        async def stopped() -> bool:
            return not owners.alive(conv_id, ticket)

        try:
            return await forward(request, inst, body, touch=touch, gone=stopped, conv=(conv_id, ticket))
        except APIError as exc:
            if exc.status == 499 and not owners.alive(conv_id, ticket):
                raise APIError("request cancelled by a stop while the model was loading") from exc
            raise

    def owner_of(conv_id: str) -> Instance | None:
        """The loaded model serving a conversation's stream; 503 while it is still loading."""
        if not conv_id:
            raise APIError("Missing conversation id in path")
        name = owners.model_of(conv_id)
        inst = registry.resolve(name) if name else None
        if inst is None:
            return None
        if inst.status in (LOADED, SLEEPING) and inst.child is not None:
            return inst
        if inst.status == LOADING:
            raise APIError("Stream owner model is loading, retry later", "unavailable_error")
        return None

    @app.get("/v1/stream")
    async def stream_get(request: Request) -> Response:
        inst = owner_of(request.query_params.get("conv_id", ""))
        if inst is None:
            raise APIError("Stream not found or expired", "not_found_error")
        return await forward(request, inst, b"", touch=False, gone=request.is_disconnected)

    @app.delete("/v1/stream")
    async def stream_delete(request: Request) -> Response:
        conv_id = request.query_params.get("conv_id", "")
        try:
            inst = owner_of(conv_id)
        except APIError as exc:
            if exc.status != 503:
                raise
            inst = None  # still loading: forgetting the entry below cancels the parked request
        if inst is not None and inst.child is not None:
            with contextlib.suppress(httpx.HTTPError):
                await upstream.client.delete(inst.child.base_url + "/v1/stream", params={"conv_id": conv_id}, timeout=5)
        owners.forget(conv_id)
        return Response(status_code=204)

    @app.post("/v1/streams/lookup")
    async def streams_lookup(request: Request) -> Response:
        try:
            parsed = json.loads(await request.body() or b"{}")
        except ValueError:
            return _json([])
        ids = parsed.get("conversation_ids") if isinstance(parsed, dict) else None
        per_child: dict[str, list[str]] = {}
        for conv_id in ids if isinstance(ids, list) else []:
            if not isinstance(conv_id, str) or not conv_id:
                continue
            with contextlib.suppress(APIError):
                inst = owner_of(conv_id)
                if inst is not None and inst.child is not None:
                    per_child.setdefault(inst.child.base_url, []).append(conv_id)
        found: list[Any] = []
        for base_url, wanted in per_child.items():
            with contextlib.suppress(httpx.HTTPError, ValueError):
                answer = await upstream.client.post(
                    base_url + "/v1/streams/lookup", json={"conversation_ids": wanted}, timeout=5
                )
                if answer.status_code == 200 and isinstance(answer.json(), list):
                    found += [e for e in answer.json() if isinstance(e, dict)]
        return _json(found)

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> Response:
        return _json({"status": "ok"})

    @app.get("/props")
    async def props(request: Request) -> Response:
        if request.query_params.get("model"):
            return await routed(request, touch=False)
        return _json(
            {
                "role": "router",
                "max_instances": config.models_max,
                "models_autoload": config.models_autoload,
                "model_alias": "llama-server",
                "model_path": "none",
                "default_generation_settings": {"params": {}, "n_ctx": 0},
                "ui_settings": json.loads(config.webui_config) if config.webui_config else {},
                "build_info": _build_info(),
                "cors_proxy_enabled": False,
            }
        )

    def listing() -> dict[str, Any]:
        now = int(time.time())
        data: list[dict[str, Any]] = []
        for inst in sorted(registry.models.values(), key=lambda i: i.name):
            spec = inst.spec
            if spec.hidden:
                continue
            status: dict[str, Any] = {"value": inst.status, "args": inst.args}
            status["preset"] = spec.preset.ini_text(spec.name)
            if inst.failed:
                status["failed"] = True
                status["exit_code"] = inst.exit_code
                status["log_tail"] = inst.log_tail
            entry: dict[str, Any] = {
                "id": spec.name,
                "aliases": list(spec.aliases),
                "tags": list(spec.tags),
                "object": "model",
                "owned_by": "llamacpp",
                "created": now,
                "status": status,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "source": spec.source,
                "can_remove": False,
            }
            if inst.running:
                for key, value in inst.loaded_info.items():
                    entry.setdefault(key, value)
            data.append(entry)
        return {"data": data, "object": "list"}

    @app.get("/models")
    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        if request.query_params.get("reload"):
            await registry.reload(reload_catalog())
        return _json(listing())

    async def _named(request: Request) -> tuple[str, Instance | None]:
        name = _model_from_json(await request.body())
        return name, registry.resolve(name) if name else None

    @app.post("/models/load")
    async def load(request: Request) -> Response:
        _, inst = await _named(request)
        if inst is None:
            raise APIError("model is not found", "not_found_error")
        if inst.running:
            raise APIError("model is already running")
        await registry.load(inst)
        return _json({"success": True})

    @app.post("/models/unload")
    async def unload(request: Request) -> Response:
        _, inst = await _named(request)
        if inst is None:
            raise APIError("model is not found")
        if not inst.running:
            raise APIError("model is not running")
        registry.unload(inst)
        return _json({"success": True})

    @app.post("/models")
    @app.delete("/models")
    async def manage(request: Request) -> Response:
        raise APIError("downloading and removing models through the router is not supported", "not_supported_error")

    @app.get("/models/sse")
    async def models_sse(request: Request) -> Response:
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

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if request.query_params.get("model"):
            return await routed(request, touch=False)
        if not config.endpoint_metrics:
            raise APIError(
                "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error"
            )
        texts: dict[str, str] = {}
        for inst in list(registry.models.values()):
            child = inst.child
            if inst.status not in (LOADED, SLEEPING) or child is None:
                continue
            try:
                answer = await upstream.client.get(child.base_url + "/metrics", timeout=5.0)
            except httpx.HTTPError:
                continue
            if answer.status_code == 200:
                texts[inst.name] = answer.text
        loaded = sum(1 for i in registry.models.values() if i.status in (LOADED, SLEEPING))
        own = [
            ("llamaserve:router_models_loaded", "Models loaded by the router.", "gauge", float(loaded)),
            ("llamaserve:router_models_queued", "Models requests wait for.", "gauge", float(len(registry.queue))),
        ]
        return Response(merge_metrics(texts, own), media_type="text/plain; version=0.0.4")

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def any_route(request: Request, path: str) -> Response:
        if request.method == "GET" and not request.query_params.get("model") and (config.webui or config.static_path):
            page = _static(static_root, request.url.path)
            if page is not None:
                return page
        return await routed(request, touch=request.method == "POST")

    return app
