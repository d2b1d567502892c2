"""The host-memory prompt cache (`--cache-ram`): sequences' serialised KV cells kept in RAM,
LRU by bytes, found by the longest shared prefix of 256-token blocks (`blocks.py`).

`prepare.py` parks idle slots here and restores an entry into a slot.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from llamaserve.engine.kv.blocks import BLOCK, PrefixIndex, block_hashes
from llamaserve.engine.kv.slot import common_prefix_length
from llamaserve.engine.runner import SeqState


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
        self, prompt: list[int], lora: tuple[float, ...] = (), hashes: list[int] | None = None, beat: int = 0
    ) -> tuple[CachedPrompt | None, int]:
        """The entry sharing the longest prefix with prompt, and that length (marked recently used);
        only one sharing more than ``beat`` tokens (what the caller has without it).

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
            start = n_blocks * BLOCK
            if start + BLOCK - 1 <= beat:
                break  # an entry first found here shares less than a block more than this level
            found: list[tuple[int, int]] = []
            for key in self._index.sharing(hashes, n_blocks) if n_blocks else self._entries:
                if key in compared:
                    continue
                compared.add(key)
                entry = self._entries[key]
                if entry.lora != lora:
                    continue
                # Its first n_blocks blocks hash like the prompt's, so only the rest is compared
                # for each entry; those blocks only for the entry chosen, below.
                n = common_prefix_length(entry.tokens, prompt, start)
                if n > beat and n >= MIN_KEEP_SHARE * len(entry.tokens):
                    found.append((n, key))
            found.sort(key=lambda f: (-f[0], f[1]))
            for n, key in found:
                entry = self._entries[key]
                if not start or entry.tokens[:start] == prompt[:start]:  # a hash collision fails here
                    self._entries.move_to_end(key)
                    return entry, n
        return None, 0

    def _drop(self, key: int) -> None:
        self.bytes_used -= self._entries.pop(key).size
        self._index.remove(key)
