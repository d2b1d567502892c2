"""Operations routes: health, models, props, slots (and slot actions), metrics, LoRA scales."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, parse_json, read_body, runtime_of
from llamaserve.api.metrics import LlamaCollector, render_metrics
from llamaserve.errors import APIError
from llamaserve.serving import info
from llamaserve.serving.slot_actions import slot_action
from llamaserve.serving.state import ServerState


async def _optional_json(request: Request) -> Any:
    """A body that may be absent (then {}), else JSON."""
    raw = await read_body(request)
    if not raw.strip():
        return {}
    return parse_json(raw)


def _require(enabled: bool, message: str) -> None:
    if not enabled:
        raise APIError(message, "not_supported_error")


def ops_routes(state: ServerState) -> APIRouter:
    router = APIRouter()
    config = state.config
    collector = LlamaCollector(state)
    slots_off = "This server does not support slots endpoint. Start it with `--slots`"

    @router.get("/health")
    @router.get("/v1/health")
    async def health() -> Response:
        if state.asleep is None:  # asleep is healthy: the next task reloads the model
            runtime_of(state)
        return JSONUTF8Response({"status": "ok"})

    @router.get("/v1/models")
    @router.get("/models")
    async def list_models() -> Response:
        return JSONUTF8Response(state.asleep.models if state.asleep else info.models(runtime_of(state)))

    @router.get("/props")
    async def get_props() -> Response:
        return JSONUTF8Response(state.asleep.props if state.asleep else info.props(runtime_of(state)))

    @router.post("/props")
    async def set_props() -> Response:
        runtime_of(state)
        _require(
            config.endpoint_props, "This server does not support changing global properties. Start it with `--props`"
        )
        return JSONUTF8Response({"success": True})

    @router.get("/slots")
    async def get_slots(request: Request) -> Response:
        rt = runtime_of(state)
        _require(config.endpoint_slots, slots_off)
        if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(s.busy for s in rt.engine.slots()):
            raise APIError("no slot available", "unavailable_error")
        return JSONUTF8Response(info.slots(rt))

    @router.post("/slots/{id_slot}")
    async def post_slot_action(id_slot: str, request: Request) -> Response:
        rt = runtime_of(state)
        _require(config.endpoint_slots, slots_off)
        action = request.query_params.get("action", "")
        return JSONUTF8Response(await slot_action(rt, id_slot, action, await _optional_json(request)))

    @router.get("/metrics")
    async def metrics() -> Response:
        if state.asleep is None:
            runtime_of(state)
        _require(config.endpoint_metrics, "This server does not support metrics endpoint. Start it with `--metrics`")
        return Response(
            render_metrics(state, collector),
            media_type="text/plain; version=0.0.4",
            headers={"Process-Start-Time-Unix": str(int(state.started))},
        )

    @router.get("/lora-adapters")
    async def get_lora_adapters() -> Response:
        return JSONUTF8Response(runtime_of(state).lora.to_json())

    @router.post("/lora-adapters")
    async def set_lora_adapters(request: Request) -> Response:
        rt = runtime_of(state)
        # Requests already admitted keep the scales they were built with.
        rt.lora.scales = rt.lora.parse(await _optional_json(request))
        return JSONUTF8Response({"success": True})

    return router
