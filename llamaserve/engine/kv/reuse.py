"""Where a slot's cells are kept, moved or dropped, as arithmetic that needs no model: the
chunk moves of `--cache-reuse`, the cut of a context shift, and the prefill padding that
fills a CPU flash-attention tile. `prepare.py` applies them to the runner's sequences.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkMove:
    """Cells at cache positions [src, src+length) move to start at dst (dst < src)."""

    src: int
    dst: int
    length: int


def plan_chunk_reuse(cached: list[int], prompt: list[int], start: int, min_chunk: int) -> tuple[list[ChunkMove], int]:
    """Find runs of the cache beyond the common prefix that reappear, in order, in the prompt.

    ``start`` is the common prefix length. Walking cache and prompt together,
    a run of at least ``min_chunk`` equal tokens is kept and moved back to
    where the prompt needs it; shorter runs are skipped over in the cache.
    Returns the moves and the number of prompt tokens then in place.
    """
    moves: list[ChunkMove] = []
    head_c, head_p = start, start
    # The prompt's last token is always decoded again for its logits.
    limit_p = len(prompt) - 1
    while head_c < len(cached) and head_p < limit_p:
        n = 0
        while head_c + n < len(cached) and head_p + n < limit_p and cached[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= min_chunk:
            moves.append(ChunkMove(head_c, head_p, n))
            head_c += n
            head_p += n
        else:
            head_c += 1
    return moves, head_p


# ------------------------------------------------------------ --context-shift
def context_shift(n_past: int, n_keep: int, n_discard: int = 0) -> tuple[int, int]:
    """Where a full slot drops cells: (first dropped position, count).

    The first ``n_keep`` tokens stay (the system prompt, usually) and
    ``n_discard`` of the rest go, half of them when 0, as llama-server does,
    so generation can continue. At least one cell goes and at least one of
    those after ``n_keep`` stays.
    """
    keep = max(0, min(n_keep, n_past - 2))
    rest = n_past - keep
    count = n_discard if n_discard > 0 else rest // 2
    return keep, max(1, min(count, rest - 1))


# At most this many cached tokens are decoded again to fill a tile (see `pad_prefill`).
MAX_PREFILL_PAD = 12


def pad_prefill(keep: int, n_prompt: int, tile_rows: int) -> int:
    """How many prompt tokens to keep from the cache so that the new part fills a tile.

    llama.cpp's CPU flash attention computes a micro-batch of fewer than GGML_FA_TILE_Q
    (64) query rows one row at a time, and one of 64 rows or more as tiled matrix products.
    Decoding 57 new rows took longer than decoding 64 at every depth measured (367 against
    323 ms at 300 tokens of context, 542 against 517 at 1,500, 1,191 against 1,016 at
    5,000; SmolLM2-135M, 2 threads); the two costs meet at about 50 rows. So a follow-up turn
    of 52-63 new tokens (a tool result, say) also decodes up to MAX_PREFILL_PAD cached tokens
    again, which only recomputes their KV, and starts sooner.
    """
    pad = tile_rows - (n_prompt - keep)
    if tile_rows and 0 < pad <= MAX_PREFILL_PAD and keep >= pad:
        return keep - pad
    return keep
