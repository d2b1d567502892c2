"""The scheduler's fast paths give the answers of the plain algorithms they replaced.

benchmarks/sched_overhead.py measures why they exist; these check, on random inputs,
that the block-hash index, the galloping prefix comparison and the stop-string hold-back
never change a result.
"""

from __future__ import annotations

import random

from llamaserve.engine.kv.blocks import BLOCK, block_hashes
from llamaserve.engine.kv.host_cache import PromptCache
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.kv.slot import common_prefix_length
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.textstream import TextStream

from .fake_runner import FakeRunner
from .test_scheduler import run_until_idle, submit


def plain_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_length_matches_a_plain_scan() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 3 * BLOCK))]
        cut = rng.randrange(0, len(a) + 1)
        b = a[:cut] + [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        assert common_prefix_length(a, b) == plain_prefix(a, b)


def test_prompt_cache_best_and_covers_match_a_scan_over_every_entry() -> None:
    rng = random.Random(11)
    cache = PromptCache(limit_bytes=-1)
    stored: list[tuple[list[int], tuple[float, ...]]] = []
    trunk = [rng.randrange(50) for _ in range(4 * BLOCK)]
    for i in range(200):
        # Branches off a shared trunk at every kind of offset, block-aligned or not, two adapters.
        tokens = trunk[: rng.randrange(0, len(trunk))] + [rng.randrange(50) for _ in range(rng.randrange(1, 2 * BLOCK))]
        lora: tuple[float, ...] = () if i % 3 else (0.5,)
        cache.put(tokens, b"s", lora)
        stored.append((tokens, lora))
        probe = trunk[: rng.randrange(0, len(trunk))] + [rng.randrange(50) for _ in range(rng.randrange(0, BLOCK))]
        live = [(e.tokens, e.lora) for e in cache.entries()]
        # The longest prefix among entries the probe keeps at least a quarter of (MIN_KEEP_SHARE).
        prefixes = [(plain_prefix(t, probe), len(t)) for t, lo in live if lo == lora]
        expected = max((n for n, size in prefixes if 4 * n >= size), default=0)
        entry, n = cache.best(probe, lora)
        assert n == expected
        assert (entry is None) == (expected == 0)
        if entry is not None:
            assert plain_prefix(entry.tokens, probe) == n
        part = tokens[: rng.randrange(1, len(tokens) + 1)]
        assert cache.covers(part, lora)
        assert cache.covers(part, lora) == any(lo == lora and t[: len(part)] == part for t, lo in live)
    # Entries that a later one extends were dropped, none other was.
    live = [(e.tokens, e.lora) for e in cache.entries()]
    for tokens, lora in stored:
        assert any(lo == lora and t[: len(tokens)] == tokens for t, lo in live)


def held_back_plainly(text: str, stops: tuple[str, ...]) -> int:
    """The longest tail of text that begins some stop string, trying every length."""
    for length in range(min(len(text), max(len(s) for s in stops) - 1), 0, -1):
        if any(s.startswith(text[-length:]) for s in stops):
            return length
    return 0


def test_stop_strings_are_held_back_exactly_as_long_as_they_could_still_match() -> None:
    rng = random.Random(3)
    alphabet = "ab<>/\n x"
    for _ in range(2000):
        stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6))) for _ in range(2))
        stream = TextStream(stops)
        emitted = ""
        source = ""
        while not stream.stopped and len(source) < 40:
            piece = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 4)))
            source += piece
            emitted += stream.push(piece.encode())
        if stream.stopped:
            first = min(source.find(s) for s in stops if s in source)
            assert emitted == source[:first]
            assert stream.stopping_word in stops and source[first:].startswith(stream.stopping_word)
        else:
            assert emitted == source[: len(source) - held_back_plainly(source, stops)]
            assert emitted + stream.flush() == source
        assert stream.text == emitted if stream.stopped else stream.text == source


def test_block_hashes_kept_for_slots_and_cache_entries_match_a_fresh_hash() -> None:
    # Conversations come back longer and take turns on few slots, so KV is parked, restored,
    # extended, truncated and shifted; every hash the scheduler kept must still be right.
    runner = FakeRunner(n_seq_max=3, n_batch=64, n_ctx_seq=4 * BLOCK)
    policy = CachePolicy(cache_ram_bytes=-1, cache_idle_slots=True, kv_unified=True, context_shift=True)
    s = Scheduler(runner, 3, cache=policy)
    rng = random.Random(5)
    conversations = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 2 * BLOCK))] for _ in range(5)]
    for _ in range(40):
        convo = rng.choice(conversations)
        convo += [rng.randrange(1, 50) for _ in range(rng.randrange(1, BLOCK))]
        del convo[: max(0, len(convo) - 3 * BLOCK)]
        submit(s, list(convo), n_predict=rng.randrange(1, 2 * BLOCK))
        run_until_idle(s)
        cache = s.kv.prompt_cache
        assert cache is not None
        for key, entry in cache._entries.items():
            assert cache._index._hashes[key] == block_hashes(entry.tokens, entry.lora)
        for slot in s.slots:
            fresh = block_hashes(slot.cache_tokens, slot.cache_lora)
            assert slot.cache_hashes == fresh[: len(slot.cache_hashes)]
