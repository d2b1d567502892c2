"""KV-cache bookkeeping that needs no model: the host-memory prompt cache, the
chunk moves of `--cache-reuse` and the arithmetic of a context shift.

engine/slot_kv.py applies what these compute to the runner's KV sequences.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from llamaserve.engine.runner import SeqState
from llamaserve.engine.slots import common_prefix_length
from llamaserve.engine.token_blocks import BLOCK, PrefixIndex, block_hashes


# ------------------------------------------------------------ host-RAM cache
@dataclass
class CachedPrompt:
    """A sequence's serialised KV cells and the tokens they hold."""

    tokens: list[int]
    state: SeqState
    lora: tuple[float, ...] = ()  # the adapter scales the KV was computed with

    @property
    def size(self) -> int:
        return len(self.state) + 4 * len(self.tokens)


# A cached prompt is restored only when the new prompt keeps at least this share of it
# (llama-server skips entries under the same share, "don't trash large prompts").
MIN_KEEP_SHARE = 0.25


class PromptCache:
    """Prompt KV states kept in host memory, least recently used out first.

    A slot that is about to be overwritten by an unrelated prompt parks its KV
    here; a later request sharing that prefix gets it back instead of
    recomputing it. The limit counts serialised bytes.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes  # < 0: no limit
        self._entries: OrderedDict[int, CachedPrompt] = OrderedDict()
        # Entries by their leading blocks: lookups touch only entries that share a prefix.
        self._index = PrefixIndex()
        self._next_key = 0
        self.bytes_used = 0

    def entries(self) -> list[CachedPrompt]:
        return list(self._entries.values())

    def covers(self, tokens: list[int], lora: tuple[float, ...] = (), hashes: list[int] | None = None) -> bool:
        """True when some entry already holds these tokens (or a longer run starting with them).

        ``hashes``: the tokens' `block_hashes` under ``lora``, when the caller has them already.
        """
        n_blocks = len(tokens) // BLOCK
        if n_blocks and hashes is None:
            hashes = block_hashes(tokens, lora)
        keys = self._index.sharing(hashes, n_blocks) if hashes and n_blocks else self._entries.keys()
        for key in keys:
            e = self._entries[key]
            if e.lora == lora and len(e.tokens) >= len(tokens) and e.tokens[: len(tokens)] == tokens:
                return True
        return False

    def put(
        self, tokens: list[int], state: SeqState, lora: tuple[float, ...] = (), hashes: list[int] | None = None
    ) -> bool:
        """Keep a state; entries it extends are dropped. False when it can never fit."""
        entry = CachedPrompt(list(tokens), state, lora)
        if 0 <= self.limit_bytes < entry.size:
            return False
        if hashes is None:
            hashes = block_hashes(entry.tokens, lora)
        for key in self._index.chains_within(hashes):
            old = self._entries[key]
            # Its whole blocks hash like ours, so only the part after them is compared: a hash
            # collision here could only drop an entry early, never serve the wrong KV.
            whole = len(old.tokens) // BLOCK * BLOCK
            if (
                old.lora == lora
                and len(old.tokens) <= len(tokens)
                and tokens[whole : len(old.tokens)] == old.tokens[whole:]
            ):
                self._drop(key)  # the new entry holds everything the old one did
        key = self._next_key
        self._next_key += 1
        self._entries[key] = entry
        self._index.add(key, hashes)
        self.bytes_used += entry.size
        while 0 <= self.limit_bytes < self.bytes_used:
            self._drop(next(iter(self._entries)))
        return True

    def best(
        self, prompt: list[int], lora: tuple[float, ...] = (), hashes: list[int] | None = None
    ) -> tuple[CachedPrompt | None, int]:
        """The entry sharing the longest prefix with prompt, and that length (marked recently used).

        Only entries the prompt would keep at least MIN_KEEP_SHARE of count, as in llama-server:
        a restore copies the whole state into the KV cache, so taking a few tokens of a long one
        costs more than it saves (the benchmark's long prompts share 2-3 leading tokens, and
        each restored the previous 124 MB conversation only to truncate it again).
        """
        if hashes is None:
            hashes = block_hashes(prompt, lora)
        # Entries sharing more whole blocks share a longer prefix: the first level down from the
        # longest shared run that holds an eligible entry holds the best one. At level 0 any
        # entry may still share a part of the first block. A lower level lists the entries of
        # the higher ones again; those were found ineligible already and are not compared twice.
        compared: set[int] = set()
        for n_blocks in range(self._index.longest_shared(hashes), -1, -1):
            best_key, best_len = -1, 0
            for key in self._index.sharing(hashes, n_blocks) if n_blocks else self._entries:
                if key in compared:
                    continue
                compared.add(key)
                entry = self._entries[key]
                n = common_prefix_length(entry.tokens, prompt) if entry.lora == lora else 0
                if n > best_len and n >= MIN_KEEP_SHARE * len(entry.tokens):
                    best_key, best_len = key, n
            if best_key >= 0:
                self._entries.move_to_end(best_key)
                return self._entries[best_key], best_len
        return None, 0

    def _drop(self, key: int) -> None:
        self.bytes_used -= self._entries.pop(key).size
        self._index.remove(key)


# ------------------------------------------------------------ --cache-reuse
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
    # The CPU flash-attention tile (llama/context.cpu_flash_attention_tile) that a prompt's
    # new part is topped up to when it falls just short of one (`pad_prefill`); 0: never.
    prefill_tile_rows: int = 0


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
