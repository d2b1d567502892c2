"""Slot save/restore/erase (`POST /slots/{id}?action=…`), run on the scheduler thread.

Each action waits until the slot is idle, so a save never sees a
half-decoded sequence; the engine's front does the waiting and the file work.
"""

from __future__ import annotations

from typing import Any

from llamaserve.engine.client import SlotFileError
from llamaserve.errors import APIError
from llamaserve.serving.runtime import ModelRuntime

SLOT_ACTIONS = ("save", "restore", "erase")


def _slot_index(rt: ModelRuntime, id_slot: str) -> int:
    try:
        slot_id = int(id_slot)
    except ValueError as exc:
        raise APIError(f"Invalid slot id '{id_slot}'") from exc
    n_slots = rt.engine.n_slots
    if not 0 <= slot_id < n_slots:
        raise APIError(f"Invalid slot id {slot_id}: the server has {n_slots} slots")
    return slot_id


async def slot_action(rt: ModelRuntime, id_slot: str, action: str, body: Any) -> dict[str, Any]:
    """llama-server's answer for one action; every bad input is a 400 naming it."""
    if action not in SLOT_ACTIONS:
        raise APIError(f"Invalid action '{action}': use save, restore or erase")
    slot_id = _slot_index(rt, id_slot)
    engine = rt.engine
    if not engine.has_slot_files:
        raise APIError(
            "This server does not support slot actions. Start it with `--slot-save-path`", "not_supported_error"
        )
    try:
        if action == "erase":
            return await engine.erase_slot(slot_id)
        # The front checks the name before waiting for the slot: a bad one is answered at once.
        filename = body.get("filename") if isinstance(body, dict) else None
        if action == "save":
            return await engine.save_slot(slot_id, filename)
        return await engine.restore_slot(slot_id, filename)
    except SlotFileError as exc:
        raise APIError(str(exc)) from exc
