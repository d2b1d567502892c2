"""The server's KV-cache flags, as the scheduler and `prepare.py` read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CachePolicy:
    """The server's KV-cache flags, as the scheduler needs them."""

    cache_reuse: int = 0  # --cache-reuse: smallest chunk moved by KV shifting; 0 = off
    context_shift: bool = False  # --context-shift
    cache_ram_bytes: int = 0  # --cache-ram in bytes; 0 = off, < 0 = no limit
    # --cache-idle-slots: when a task starts, idle slots are copied to the host-memory cache and,
    # with a unified KV, cleared; attention then spans only the active slots' cells.
    cache_idle_slots: bool = False
    kv_unified: bool = False
    # Requests sharing a prompt prefix share its KV cells (engine/kv/sharing.py), where the
    # KV is unified and the runner can share cells; off only to compare against.
    prefix_sharing: bool = True
    # The CPU flash-attention tile (llama/context.cpu_flash_attention_tile) that a prompt's
    # new part is topped up to when it falls just short of one (`pad_prefill`); 0: never.
    prefill_tile_rows: int = 0
