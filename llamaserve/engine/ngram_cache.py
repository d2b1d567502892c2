"""ngram-cache: llama.cpp's lookup decoding, drafts from n-gram statistics (`--spec-type ngram-cache`).

Three caches map an n-gram (1 to 4 tokens) to how often each token followed it:

- the context cache, built from the sequence's own tokens (prompt and answer) as they grow;
- the dynamic cache (`-lcd`), the statistics of earlier generations: read from its file at start
  when the file exists, each finished sequence's context cache is merged into it, and it is
  written back when the server closes, so it keeps learning across runs;
- the static cache (`-lcs`), bigram statistics of a large corpus (llama.cpp's `llama-lookup-create`
  writes one), read once and never changed: it only validates the others' candidates.

Drafting follows common/ngram-cache.cpp: for each next position, the longest n-gram of the context
cache whose best continuation is frequent and dominant enough (lax thresholds), else of the dynamic
cache (strict thresholds), else the static cache's bigram; candidates are weighted by the static
cache's count. The files are llama.cpp's own format, so either side can read the other's.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

NGRAM_MIN = 1
NGRAM_MAX = 4
NGRAM_STATIC = 2
TOKEN_NULL = -1

# Per n-gram size 1..4: a draft needs at least this many samples and this share for its best token.
_MIN_SAMPLES_LAX = (2, 2, 1, 1)
_MIN_PERCENT_LAX = (66, 50, 50, 50)
_MIN_SAMPLES_STRICT = (4, 3, 2, 2)
_MIN_PERCENT_STRICT = (75, 66, 66, 66)

Ngram = tuple[int, int, int, int]  # the tokens, padded with TOKEN_NULL to NGRAM_MAX
NgramCache = dict[Ngram, dict[int, int]]  # n-gram -> {following token: count}

# The file: per n-gram its four int32 tokens, an int32 count of continuations, then (token, count)
# int32 pairs; native byte order, as llama.cpp writes its structs.
_HEAD = struct.Struct("=4ii")
_PAIR = struct.Struct("=ii")


class LookupCacheError(ValueError):
    """A lookup cache file that cannot be read."""


def _ngram(tokens: list[int], start: int, size: int) -> Ngram:
    padded = tokens[start : start + size] + [TOKEN_NULL] * (NGRAM_MAX - size)
    return (padded[0], padded[1], padded[2], padded[3])


def update(cache: NgramCache, tokens: list[int], n_new: int) -> None:
    """Count the n-grams ending in the last `n_new` tokens of `tokens` (which only ever grows)."""
    size_all = len(tokens)
    for size in range(NGRAM_MIN, NGRAM_MAX + 1):
        for i in range(max(size_all - n_new, size), size_all):
            part = cache.setdefault(_ngram(tokens, i - size, size), {})
            part[tokens[i]] = part.get(tokens[i], 0) + 1


def merge(target: NgramCache, add: NgramCache) -> None:
    for ngram, part in add.items():
        into = target.setdefault(ngram, {})
        for token, count in part.items():
            into[token] = into.get(token, 0) + count


def _try_static(static: NgramCache, ngram: Ngram) -> int:
    part = static.get(ngram)
    if not part:
        return TOKEN_NULL
    best, best_count = max(part.items(), key=lambda kv: kv[1])
    total = sum(part.values())
    if total < _MIN_SAMPLES_LAX[NGRAM_STATIC - 1] or 100 * best_count < _MIN_PERCENT_LAX[NGRAM_STATIC - 1] * total:
        return TOKEN_NULL
    return best


def _try_primary(
    primary: NgramCache,
    ngrams: list[Ngram],
    static_part: dict[int, int],
    min_samples: tuple[int, ...],
    min_percent: tuple[int, ...],
) -> int:
    """The best continuation of the longest n-gram that passes the thresholds; TOKEN_NULL if none."""
    for i in range(len(ngrams) - 1, -1, -1):
        part = primary.get(ngrams[i])
        if not part:
            continue
        best, best_primary, best_static, total = TOKEN_NULL, 0, 0, 0
        for token, count in part.items():
            weight = 100 * static_part[token] if token in static_part else 1
            if count * weight > best_primary * best_static:
                best, best_primary, best_static = token, count, weight
            total += count
        if total < min_samples[i] or 100 * best_primary < min_percent[i] * total:
            continue
        return best
    return TOKEN_NULL


def draft(tokens: list[int], n_draft: int, context: NgramCache, dynamic: NgramCache, static: NgramCache) -> list[int]:
    """Up to `n_draft` tokens to follow `tokens` (the history and the token about to be decoded)."""
    if len(tokens) < NGRAM_STATIC:
        return []
    seq = list(tokens)
    out: list[int] = []
    while len(out) < n_draft:
        n = len(seq)
        static_part = static.get(_ngram(seq, n - NGRAM_STATIC, NGRAM_STATIC), {})
        ngrams = [_ngram(seq, n - size, size) for size in range(NGRAM_MIN, NGRAM_MAX + 1) if n >= size]
        token = _try_primary(context, ngrams, static_part, _MIN_SAMPLES_LAX, _MIN_PERCENT_LAX)
        if token == TOKEN_NULL:
            token = _try_primary(dynamic, ngrams, static_part, _MIN_SAMPLES_STRICT, _MIN_PERCENT_STRICT)
        if token == TOKEN_NULL:
            token = _try_static(static, _ngram(seq, n - NGRAM_STATIC, NGRAM_STATIC))
        if token == TOKEN_NULL:
            break
        out.append(token)
        seq.append(token)
    return out


def load(path: str) -> NgramCache:
    """A cache file as llama.cpp's common_ngram_cache_save writes it."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise LookupCacheError(f"cannot read lookup cache {path}: {exc.strerror}") from exc
    cache: NgramCache = {}
    at, end = 0, len(data)
    while at < end:
        if end - at < _HEAD.size:
            raise LookupCacheError(f"{path}: not a lookup cache (cut short at byte {at})")
        *grams, n_tokens = _HEAD.unpack_from(data, at)
        at += _HEAD.size
        if n_tokens <= 0 or end - at < n_tokens * _PAIR.size:
            raise LookupCacheError(f"{path}: not a lookup cache (bad entry at byte {at - _HEAD.size})")
        part = cache.setdefault((grams[0], grams[1], grams[2], grams[3]), {})
        for token, count in _PAIR.iter_unpack(data[at : at + n_tokens * _PAIR.size]):
            if count <= 0:
                raise LookupCacheError(f"{path}: not a lookup cache (count {count} at byte {at})")
            part[token] = part.get(token, 0) + count
        at += n_tokens * _PAIR.size
    return cache


def _write(fh: BinaryIO, cache: NgramCache) -> None:
    for ngram, part in cache.items():
        if not part:
            continue
        fh.write(_HEAD.pack(*ngram, len(part)))
        fh.write(b"".join(_PAIR.pack(token, count) for token, count in part.items()))


def save(cache: NgramCache, path: str) -> None:
    """Write `cache` in llama.cpp's format; a crash mid-write leaves the old file whole."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as fh:
        _write(fh, cache)
    os.replace(tmp, path)


class NgramCacheDrafter:
    """The ngram-cache drafter of one server: a context cache per sequence, shared dynamic and static ones."""

    name = "ngram-cache"

    def __init__(self, n_draft: int, static_path: str | None, dynamic_path: str | None) -> None:
        self.n_draft = n_draft
        self.static: NgramCache = load(static_path) if static_path else {}
        self.dynamic_path = dynamic_path
        self.dynamic: NgramCache = load(dynamic_path) if dynamic_path and os.path.exists(dynamic_path) else {}
        self._context: dict[int, NgramCache] = {}
        self._seen: dict[int, list[int]] = {}  # per sequence, the tokens its context cache counts

    def begin(self, seq: int, prompt: list[int]) -> None:
        self._retire(seq)
        self._context[seq] = {}
        self._seen[seq] = []

    def _retire(self, seq: int) -> None:
        """A sequence's answer is done: what it saw becomes part of the dynamic statistics."""
        context = self._context.pop(seq, None)
        self._seen.pop(seq, None)
        if context and self.dynamic_path:
            merge(self.dynamic, context)

    def draft(self, seq: int, history: list[int], last: int, n_max: int) -> list[int]:
        tokens = [*history, last]
        seen = self._seen.setdefault(seq, [])
        context = self._context.setdefault(seq, {})
        if tokens[: len(seen)] != seen:  # the history was cut (a context shift): count it afresh
            context.clear()
            seen.clear()
        n_new = len(tokens) - len(seen)
        seen.extend(tokens[len(seen) :])
        update(context, seen, n_new)
        return draft(tokens, min(n_max, self.n_draft), context, self.dynamic, self.static)

    def accept(self, seq: int, n_accepted: int) -> None:
        pass

    def close(self) -> None:
        """Merge the running sequences and write the dynamic cache (when -lcd names one)."""
        for seq in list(self._context):
            self._retire(seq)
        if self.dynamic_path:
            save(self.dynamic, self.dynamic_path)
