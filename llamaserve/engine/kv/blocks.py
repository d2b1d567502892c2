"""Token sequences indexed by hashes of their leading blocks.

Comparing a 20k-token prompt against every entry of the host-memory cache by
list slices costs a full scan per entry; with hundreds of entries that was
most of a scheduler step (benchmarks/sched_overhead.py). Instead each sequence
gets a chain of hashes, one per whole block of `BLOCK` tokens, where hash i
covers tokens [0, (i+1)·BLOCK). Two sequences share their first k blocks
exactly when (hash collisions aside) their k-th chain hashes are equal, so the
longest block-aligned common prefix over all entries is a binary search over
one dict. Candidates found that way are still compared token by token, so a
collision can cost time but never give a wrong answer.
"""

from __future__ import annotations

from collections.abc import Iterable

BLOCK = 256


def block_hashes(tokens: list[int], seed: object = (), known: list[int] | None = None) -> list[int]:
    """The chain hash of every whole leading block of ``tokens``.

    ``seed`` starts the chain: sequences under different seeds (KV computed with other LoRA
    scales, say) never share a hash. ``known``: the chain of a run of whole blocks these
    tokens are known to begin with, under the same seed; hashing resumes after it.
    """
    hashes = list(known[: len(tokens) // BLOCK]) if known else []
    hashes += more_block_hashes(tokens, seed, hashes)
    return hashes


def more_block_hashes(tokens: list[int], seed: object, known: list[int]) -> list[int]:
    """The chain hashes of the whole blocks of ``tokens`` after the ``len(known)`` leading ones
    whose chain ``known`` is (under ``seed``)."""
    more: list[int] = []
    h = known[-1] if known else hash(seed)
    for start in range(len(known) * BLOCK, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tuple(tokens[start : start + BLOCK])))
        more.append(h)
    return more


class PrefixIndex:
    """Which keys' sequences begin with a given run of whole blocks."""

    def __init__(self) -> None:
        self._by_hash: dict[int, set[int]] = {}  # chain hash -> keys whose chain passes through it
        self._by_last: dict[int, set[int]] = {}  # last chain hash -> keys whose chain ends there
        self._blockless: set[int] = set()  # keys of sequences shorter than one block
        self._hashes: dict[int, list[int]] = {}

    def add(self, key: int, hashes: list[int]) -> None:
        self.remove(key)
        self._hashes[key] = list(hashes)  # the index's own copy: extend and truncate edit it
        for h in hashes:
            self._by_hash.setdefault(h, set()).add(key)
        self._mark_end(key, hashes)

    def remove(self, key: int) -> None:
        hashes = self._hashes.pop(key, [])
        for h in hashes:
            _discard(self._by_hash, h, key)
        self._unmark_end(key, hashes)

    def chain(self, key: int) -> list[int]:
        """The chain indexed for ``key`` (not to be edited); empty when none is."""
        return self._hashes.get(key, [])

    def extend(self, key: int, more: list[int]) -> None:
        """Blocks appended to ``key``'s sequence: only they are indexed, not the whole chain
        again (a sequence that grows a block at a time would otherwise cost its length each time)."""
        hashes = self._hashes.get(key)
        if hashes is None:
            self.add(key, more)
            return
        if not more:
            return
        self._unmark_end(key, hashes)
        for h in more:
            self._by_hash.setdefault(h, set()).add(key)
        hashes.extend(more)
        self._mark_end(key, hashes)

    def truncate(self, key: int, n_blocks: int) -> None:
        """``key``'s sequence keeps only its first ``n_blocks`` blocks: only the others leave."""
        hashes = self._hashes.get(key)
        if hashes is None or len(hashes) <= n_blocks:
            return
        self._unmark_end(key, hashes)
        for h in hashes[n_blocks:]:
            _discard(self._by_hash, h, key)
        del hashes[n_blocks:]
        self._mark_end(key, hashes)

    def _mark_end(self, key: int, hashes: list[int]) -> None:
        if hashes:
            self._by_last.setdefault(hashes[-1], set()).add(key)
        else:
            self._blockless.add(key)

    def _unmark_end(self, key: int, hashes: list[int]) -> None:
        if hashes:
            _discard(self._by_last, hashes[-1], key)
        else:
            self._blockless.discard(key)

    def chains_within(self, hashes: list[int]) -> list[int]:
        """Keys whose whole-block chain is a leading part of ``hashes`` (shorter sequences too)."""
        found = list(self._blockless)
        for h in hashes:
            found.extend(self._by_last.get(h, ()))
        return found

    def sharing(self, hashes: list[int], n_blocks: int) -> Iterable[int]:
        """Keys whose first ``n_blocks`` blocks equal those behind ``hashes`` (n_blocks >= 1)."""
        return self._by_hash.get(hashes[n_blocks - 1], ())

    def longest_shared(self, hashes: list[int]) -> int:
        """The most leading blocks of ``hashes`` that some indexed sequence also begins with.

        Sharing k blocks implies sharing every shorter run, so a binary search finds it.
        """
        lo, hi = 0, len(hashes)  # lo blocks are shared by some key; more than hi are not
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in self._by_hash:
                lo = mid
            else:
                hi = mid - 1
        return lo


def _discard(index: dict[int, set[int]], h: int, key: int) -> None:
    keys = index.get(h)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[h]
