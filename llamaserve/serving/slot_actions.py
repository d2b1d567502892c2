"""Slot save/restore/erase (`POST /slots/{id}?action=…`), run on the scheduler thread.

Each action waits until the slot is idle, so a save never sees a
half-decoded sequence.
"""

from __future__ import annotations

from typing import Any

from llamaserve.engine.kv.files import SlotFileError, validate_filename
from llamaserve.errors import APIError
from llamaserve.serving.runtime import ModelRuntime

SLOT_ACTIONS = ("save", "restore", "erase")


def _slot_index(rt: ModelRuntime, id_slot: str) -> int:
    try:
        slot_id = int(id_slot)
    except ValueError as exc:
        raise APIError(f"Invalid slot id '{id_slot}'") from exc
    n_slots = len(rt.scheduler.slots)
    if not 0 <= slot_id < n_slots:
        raise APIError(f"Invalid slot id {slot_id}: the server has {n_slots} slots")
    return slot_id


async def slot_action(rt: ModelRuntime, id_slot: str, action: str, body: Any) -> dict[str, Any]:
    """llama-server's answer for one action; every bad input is a 400 naming it."""
    if action not in SLOT_ACTIONS:
        raise APIError(f"Invalid action '{action}': use save, restore or erase")
    slot_id = _slot_index(rt, id_slot)
    files = rt.slot_files
    if files is None:
        raise APIError(
            "This server does not support slot actions. Start it with `--slot-save-path`", "not_supported_error"
        )
    try:
        if action == "erase":
            return await rt.engine.call(lambda: files.erase(slot_id), idle_slot=slot_id)
        # Checked before waiting for the slot: a bad name is answered at once.
        filename = validate_filename(body.get("filename") if isinstance(body, dict) else None)
        if action == "save":
            return await rt.engine.call(lambda: files.save(slot_id, filename), idle_slot=slot_id)
        return await rt.engine.call(lambda: files.restore(slot_id, filename), idle_slot=slot_id)
    except SlotFileError as exc:
        raise APIError(str(exc)) from exc
