"""Slot KV caches on disk: the save/restore/erase slot actions and --cache-persist.

Every function here runs on the scheduler thread (through `Scheduler.call`)
or while that thread is stopped, so it may touch slots and the runner freely.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from llamaserve.engine.kv.slot import Slot
from llamaserve.engine.scheduler import Scheduler

log = logging.getLogger("llamaserve.slots")

MANIFEST = "llamaserve-persist.json"
FORBIDDEN_NAMES = {".", ".."}
# The files --cache-persist owns (the manifest, its temporary, one file per slot): a slot
# action may neither overwrite nor read them under a client's name.
RESERVED_PREFIX = "llamaserve-persist"


class SlotFileError(ValueError):
    """A slot action that cannot be done (bad file name, unreadable file)."""


def validate_filename(name: object) -> str:
    """A client's file name: a plain one (`plain_filename`) that is not one of the server's own."""
    plain = plain_filename(name)
    if plain.lower().startswith(RESERVED_PREFIX):
        raise SlotFileError(f"'filename' may not start with {RESERVED_PREFIX}: the server keeps its own files so named")
    return plain


def plain_filename(name: object) -> str:
    """A bare file name inside --slot-save-path: no directories, no traversal, no control bytes."""
    if not isinstance(name, str) or not name:
        raise SlotFileError("'filename' must be a non-empty string")
    if len(name.encode()) > 255:
        raise SlotFileError("'filename' is too long")
    if name in FORBIDDEN_NAMES or "/" in name or "\\" in name or name.startswith("."):
        raise SlotFileError("'filename' must be a plain file name (no path, no leading dot)")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise SlotFileError("'filename' contains control characters")
    return name


@dataclass
class SlotFiles:
    """Moves slot KV caches between the KV cache and files in one directory."""

    scheduler: Scheduler
    directory: str
    model_id: dict[str, Any]  # what a persisted cache must match: model file, size, context

    def _slot(self, slot_id: int) -> Slot:
        if not 0 <= slot_id < len(self.scheduler.slots):
            raise SlotFileError(f"no slot with id {slot_id}")
        return self.scheduler.slots[slot_id]

    def save(self, slot_id: int, filename: str) -> dict[str, Any]:
        slot = self._slot(slot_id)
        t0 = time.perf_counter()
        path = os.path.join(self.directory, validate_filename(filename))
        tokens = list(slot.cache_tokens)
        written = self.scheduler.runner.save_seq_file(path, slot.id, tokens)
        if written == 0 and tokens:
            raise SlotFileError(f"could not write {filename}")
        return {
            "id_slot": slot.id,
            "filename": filename,
            "n_saved": len(tokens),
            "n_written": written,
            "timings": {"save_ms": round((time.perf_counter() - t0) * 1000.0, 3)},
        }

    def restore(self, slot_id: int, filename: str) -> dict[str, Any]:
        slot = self._slot(slot_id)
        t0 = time.perf_counter()
        path = os.path.join(self.directory, validate_filename(filename))
        if not os.path.isfile(path):
            raise SlotFileError(f"no saved slot file named {filename}")
        n_read, tokens = self._load(slot, path)
        if n_read == 0:
            raise SlotFileError(f"{filename} does not fit this model and context")
        return {
            "id_slot": slot.id,
            "filename": filename,
            "n_restored": len(tokens),
            "n_read": n_read,
            "timings": {"restore_ms": round((time.perf_counter() - t0) * 1000.0, 3)},
        }

    def erase(self, slot_id: int) -> dict[str, Any]:
        slot = self._slot(slot_id)
        n = len(slot.cache_tokens)
        self.scheduler.runner.seq_remove(slot.id, 0, -1)
        slot.cache_tokens.clear()
        slot.cache_hashes.clear()
        slot.cache_lora = ()
        self.scheduler.kv.sharing.cut(slot, 0)  # another sequence sharing the cells keeps them
        return {"id_slot": slot.id, "n_erased": n}

    def _load(self, slot: Slot, path: str) -> tuple[int, list[int]]:
        runner = self.scheduler.runner
        runner.seq_remove(slot.id, 0, -1)
        slot.cache_tokens.clear()
        slot.cache_hashes.clear()
        self.scheduler.kv.sharing.cut(slot, 0)  # the file's cells are the slot's own
        slot.kv_in_host_cache = False
        slot.cache_lora = ()  # files hold base-model KV: saving a slot under an adapter is on the caller
        n_read, tokens = runner.load_seq_file(path, slot.id)
        if n_read == 0:
            runner.seq_remove(slot.id, 0, -1)  # a half-read state must not linger
            return 0, []
        # Media placeholders name entries of this process's media store: in a file they may mean
        # another image than the one a later prompt carries, so the KV from the first one on
        # is dropped and only the text before it is kept.
        media_at = next((i for i, t in enumerate(tokens) if t < 0), -1)
        if media_at >= 0:
            runner.seq_remove(slot.id, media_at, -1)
            tokens = tokens[:media_at]
        slot.cache_tokens = tokens
        slot.cache_hashes = []
        self.scheduler.kv.sharing.note(slot)
        return n_read, tokens

    # ------------------------------------------------------------ --cache-persist
    def persist_all(self) -> int:
        """Write every slot's cache and a manifest; returns the number of slots written."""
        written: dict[str, dict[str, Any]] = {}
        for slot in self.scheduler.slots:
            name = f"llamaserve-persist-slot{slot.id}.bin"
            path = os.path.join(self.directory, name)
            if slot.cache_tokens and self.scheduler.runner.save_seq_file(path, slot.id, slot.cache_tokens):
                written[str(slot.id)] = {"file": name, "n_tokens": len(slot.cache_tokens)}
            elif os.path.exists(path):
                os.remove(path)  # an older cache of a slot that is empty now
        manifest = {"model": self.model_id, "slots": written}
        tmp = os.path.join(self.directory, MANIFEST + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
        os.replace(tmp, os.path.join(self.directory, MANIFEST))
        log.info("saved %d slot caches to %s", len(written), self.directory)
        return len(written)

    def load_all(self) -> int:
        """Load what persist_all wrote, if it was written for this model; returns slots loaded."""
        try:
            with open(os.path.join(self.directory, MANIFEST), encoding="utf-8") as fh:
                manifest = json.load(fh)
        except (OSError, ValueError):
            return 0
        if not isinstance(manifest, dict) or manifest.get("model") != self.model_id:
            log.info("persisted slot caches in %s are for another model or context; not loaded", self.directory)
            return 0
        loaded = 0
        for key, item in (manifest.get("slots") or {}).items():
            try:
                slot_id, name = int(key), plain_filename(item["file"])
            except (KeyError, TypeError, ValueError):
                continue
            if 0 <= slot_id < len(self.scheduler.slots) and os.path.isfile(os.path.join(self.directory, name)):
                n_read, _ = self._load(self.scheduler.slots[slot_id], os.path.join(self.directory, name))
                loaded += 1 if n_read else 0
        log.info("loaded %d persisted slot caches from %s", loaded, self.directory)
        return loaded
