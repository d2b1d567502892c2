"""The block-hash prefix index (engine/kv/blocks.py): chains extended and cut in place index
exactly what a chain built from scratch does, and a lookup through it never trusts a hash alone."""

from __future__ import annotations

import random

from llamaserve.engine.kv.blocks import BLOCK, PrefixIndex, block_hashes, more_block_hashes
from llamaserve.engine.kv.host_cache import PromptCache


def contents(index: PrefixIndex) -> tuple[object, ...]:
    return (index._by_hash, index._by_last, index._blockless, index._hashes)


def test_a_chain_hashed_in_pieces_equals_one_hashed_whole() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(1, 500) for _ in range(5 * BLOCK + 17)]
    whole = block_hashes(tokens, (0.5,))
    assert len(whole) == 5
    head = block_hashes(tokens[: 2 * BLOCK + 3], (0.5,))
    assert head == whole[:2]
    assert head + more_block_hashes(tokens, (0.5,), head) == whole
    assert block_hashes(tokens, (0.5,), known=whole[:3]) == whole
    assert block_hashes(tokens, ()) != whole  # another seed: another chain


def test_extending_and_truncating_a_key_indexes_what_adding_it_afresh_does() -> None:
    rng = random.Random(7)
    seqs = {k: [rng.randrange(1, 50) for _ in range(6 * BLOCK)] for k in range(4)}
    seqs[1][: 3 * BLOCK] = seqs[0][: 3 * BLOCK]  # two keys share three blocks
    live = PrefixIndex()
    lengths = dict.fromkeys(seqs, 0)
    for k in seqs:
        live.add(k, [])
    for _ in range(200):
        k = rng.randrange(4)
        chain = live.chain(k)
        if rng.random() < 0.7:
            lengths[k] = min(lengths[k] + rng.randrange(1, 2 * BLOCK), len(seqs[k]))
            live.extend(k, more_block_hashes(seqs[k][: lengths[k]], (), chain))
        else:
            lengths[k] = rng.randrange(0, lengths[k] + 1)
            live.truncate(k, lengths[k] // BLOCK)
        fresh = PrefixIndex()
        for key, seq in seqs.items():
            fresh.add(key, block_hashes(seq[: lengths[key]]))
        assert contents(live) == contents(fresh)
    live.remove(0)
    assert 0 not in live._hashes and all(0 not in keys for keys in live._by_hash.values())


def test_a_cached_entry_whose_blocks_only_hash_like_the_prompts_is_never_restored() -> None:
    """Entries are compared past their shared blocks and the one chosen over those blocks too:
    an entry indexed under another sequence's chain (as a hash collision would) is passed over."""
    real = list(range(1, 3 * BLOCK + 50))
    impostor = [7] * (2 * BLOCK) + real[2 * BLOCK :]  # the same tokens from the third block on
    cache = PromptCache(-1)
    cache.put(impostor, b"impostor", (), hashes=block_hashes(real))
    assert cache.best(real + [1, 2, 3]) == (None, 0)
    cache.put(real[: BLOCK + 10], b"real")
    entry, n = cache.best(real + [1, 2, 3])
    assert entry is not None and entry.state == b"real" and n == BLOCK + 10
    # Nothing longer than what the caller has already: nothing is looked up.
    assert cache.best(real + [1, 2, 3], beat=BLOCK + 10) == (None, 0)
