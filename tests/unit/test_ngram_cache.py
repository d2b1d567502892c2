"""ngram-cache (llama.cpp's lookup decoding): its files in llama.cpp's byte layout, its drafting
thresholds, and the dynamic cache learning from generations and written back at close."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from llamaserve.engine import ngram_cache as nc
from llamaserve.engine.ngram_cache import LookupCacheError, NgramCacheDrafter

NULL = -1


def _cpp_file(entries: list[tuple[tuple[int, ...], list[tuple[int, int]]]]) -> bytes:
    """Bytes as common_ngram_cache_save writes them: common_ngram (4 x int32 tokens, unused ones
    LLAMA_TOKEN_NULL), int32 count of continuations, then (int32 token, int32 count) pairs."""
    out = b""
    for gram, pairs in entries:
        padded = list(gram) + [NULL] * (4 - len(gram))
        out += struct.pack("<4i", *padded) + struct.pack("<i", len(pairs))
        out += b"".join(struct.pack("<ii", t, c) for t, c in pairs)
    return out


def test_a_file_in_llama_cpps_layout_loads_and_saves_byte_for_byte(tmp_path: Path) -> None:
    entries = [((5, 6), [(7, 3), (8, 1)]), ((9,), [(10, 2)]), ((1, 2, 3, 4), [(5, 1)])]
    path = tmp_path / "static.bin"
    path.write_bytes(_cpp_file(entries))
    cache = nc.load(str(path))
    assert cache == {(5, 6, NULL, NULL): {7: 3, 8: 1}, (9, NULL, NULL, NULL): {10: 2}, (1, 2, 3, 4): {5: 1}}
    again = tmp_path / "again.bin"
    nc.save(cache, str(again))
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("cut", [3, 18, 27])
def test_a_cut_or_foreign_file_is_refused_naming_it(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "broken.bin"
    path.write_bytes(_cpp_file([((5, 6), [(7, 3), (8, 1)])])[:cut])
    with pytest.raises(LookupCacheError, match=r"broken\.bin"):
        nc.load(str(path))


def test_the_context_cache_drafts_what_followed_the_same_ngram() -> None:
    context: nc.NgramCache = {}
    tokens = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 6, 9, 1, 2]
    nc.update(context, tokens, len(tokens))
    assert nc.draft(tokens, 4, context, {}, {}) == [3, 4, 5, 6]
    assert nc.draft(tokens, 2, context, {}, {}) == [3, 4]


def test_the_dynamic_cache_needs_more_evidence_than_the_context() -> None:
    """A 4-gram seen once drafts from the context (lax) but not from the dynamic cache (strict)."""
    once: nc.NgramCache = {}
    nc.update(once, [1, 2, 3, 4, 5], 5)
    tokens = [7, 1, 2, 3, 4]
    assert nc.draft(tokens, 1, once, {}, {}) == [5]
    assert nc.draft(tokens, 1, {}, once, {}) == []
    twice: nc.NgramCache = {}
    nc.update(twice, [1, 2, 3, 4, 5, 1, 2, 3, 4, 5], 10)
    assert nc.draft(tokens, 1, {}, twice, {}) == [5]


def test_the_static_cache_drafts_alone_and_weighs_the_others_candidates() -> None:
    static = {(3, 4, NULL, NULL): {5: 2, 6: 1}}
    assert nc.draft([1, 3, 4], 1, {}, {}, static) == [5]
    # The context has seen 1 2 3 4 followed once by 8 and once by 6: a tie it breaks by its order,
    # unless the static cache knows one of them after 3 4.
    context: nc.NgramCache = {(1, 2, 3, 4): {8: 1, 6: 1}}
    assert nc.draft([1, 2, 3, 4], 1, context, {}, {}) == [8]
    assert nc.draft([1, 2, 3, 4], 1, context, {}, {(3, 4, NULL, NULL): {6: 1}}) == [6]


def test_a_generation_teaches_the_dynamic_cache_which_is_written_at_close(tmp_path: Path) -> None:
    path = tmp_path / "dynamic.bin"
    drafter = NgramCacheDrafter(8, None, str(path))
    drafter.begin(0, [1, 2, 3])
    assert drafter.draft(0, [1, 2, 3, 4, 5], 6, 8) == []
    drafter.draft(0, [1, 2, 3, 4, 5, 6], 1, 8)  # the answer went on: 6 then 1
    drafter.close()
    learned = nc.load(str(path))
    assert learned[(5, 6, NULL, NULL)] == {1: 1} and learned[(1, NULL, NULL, NULL)] == {2: 1}
    # The next server reads it back. Once the same text has been generated again, its 4-grams have
    # been seen twice: enough for the dynamic cache's strict thresholds, and new prompts draft them.
    drafter = NgramCacheDrafter(8, None, str(path))
    drafter.begin(0, [9])
    assert drafter.draft(0, [8, 2, 3, 4], 5, 3) == []
    drafter.draft(0, [9, 1, 2, 3, 4, 5, 6], 1, 8)
    drafter.begin(0, [8])  # that answer is done: merged into the dynamic cache
    assert drafter.draft(0, [8, 2, 3, 4], 5, 3) == [6, 1]
