"""Routes that manage the KV cache and adapters: slot save/restore/erase, LoRA scales.

Slot actions run on the scheduler thread once the slot is idle, so a save
never sees a half-decoded sequence.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.app import JSONUTF8Response
from llamaserve.engine.slot_files import SlotFileError
from llamaserve.errors import APIError
from llamaserve.serving.runtime import ModelRuntime, ServerState

SLOT_ACTIONS = ("save", "restore", "erase")


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise APIError(f"the body is not valid JSON: {exc}") from exc


def cache_routes(state: ServerState, runtime_fn: Callable[[], ModelRuntime]) -> APIRouter:
    router = APIRouter()

    @router.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request) -> Response:
        rt = runtime_fn()
        if not state.config.endpoint_slots:
            raise APIError(
                "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error"
            )
        action = request.query_params.get("action", "")
        if action not in SLOT_ACTIONS:
            raise APIError(f"Invalid action '{action}': use save, restore or erase")
        try:
            slot_id = int(id_slot)
        except ValueError as exc:
            raise APIError(f"Invalid slot id '{id_slot}'") from exc
        if not 0 <= slot_id < len(rt.scheduler.slots):
            raise APIError(f"Invalid slot id {slot_id}: the server has {len(rt.scheduler.slots)} slots")
        files = rt.slot_files
        if files is None:
            raise APIError(
                "This server does not support slot actions. Start it with `--slot-save-path`", "not_supported_error"
            )
        body = await _json_body(request)
        filename = body.get("filename") if isinstance(body, dict) else None
        try:
            if action == "erase":
                result = await rt.engine.call(lambda: files.erase(slot_id), idle_slot=slot_id)
            elif action == "save":
                result = await rt.engine.call(lambda: files.save(slot_id, filename), idle_slot=slot_id)
            else:
                result = await rt.engine.call(lambda: files.restore(slot_id, filename), idle_slot=slot_id)
        except SlotFileError as exc:
            raise APIError(str(exc)) from exc
        return JSONUTF8Response(result)

    @router.get("/lora-adapters")
    async def get_lora_adapters() -> Response:
        return JSONUTF8Response(runtime_fn().lora.to_json())

    @router.post("/lora-adapters")
    async def set_lora_adapters(request: Request) -> Response:
        rt = runtime_fn()
        # Requests already admitted keep the scales they were built with.
        rt.lora.scales = rt.lora.parse(await _json_body(request))
        return JSONUTF8Response({"success": True})

    return router
