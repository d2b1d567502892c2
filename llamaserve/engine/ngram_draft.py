"""Drafts from the slot's own tokens, no second model: llama.cpp's n-gram drafters.

Each drafter sees a sequence's history (the tokens in its KV, prompt and generated) and the
token about to be decoded, and proposes the tokens that followed the same n-gram before:

- `NgramSimple` (ngram-simple): the latest earlier occurrence of the last n tokens, and the
  m tokens after it.
- `NgramMap` (ngram-map-k, ngram-map-k4v): the same lookup through a per-sequence index of
  n-grams; k drafts as many tokens as were accepted the last time the key was used, k4v
  keeps up to four different continuations per key and drafts only a dominant one.
- `NgramMod` (ngram-mod): one table shared by every sequence, n-gram -> next token, walked
  token by token; a draft shorter than n_min is dropped.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from llamaserve.engine.spec_params import NgramMapParams


def _find_last(history: list[int], pattern: list[int], end: int) -> int:
    """The latest start j in [1, end] where ``pattern`` occurs in ``history``; 0 when none.

    bytes.rfind does the scan in C; a hit not on a token boundary is skipped.
    """
    if end < 1:
        return 0
    hay = array("i", history[: end + len(pattern)]).tobytes()
    needle = array("i", pattern).tobytes()
    width = array("i").itemsize
    stop = len(hay)
    while True:
        at = hay.rfind(needle, width, stop)
        if at < 0:
            return 0
        if at % width == 0:
            return at // width
        stop = at + len(needle) - 1


class NgramSimple:
    """ngram-simple: copy what followed the latest earlier occurrence of the last n tokens."""

    name = "ngram-simple"

    def __init__(self, params: NgramMapParams) -> None:
        self.n = params.size_n
        self.m = params.size_m

    def begin(self, seq: int, prompt: list[int]) -> None:
        pass

    def draft(self, seq: int, history: list[int], last: int, n_max: int) -> list[int]:
        n, cur = self.n, len(history)
        if cur <= n + self.m + 1:
            return []
        pattern = history[cur - n + 1 :] + [last]
        pos = _find_last(history, pattern, cur - n - 1)
        if pos == 0:
            return []
        take = min(self.m, cur - (pos + n), n_max)
        if take < n:  # llama.cpp drafts at least n tokens or none
            return []
        return history[pos + n : pos + n + take]

    def accept(self, seq: int, n_accepted: int) -> None:
        pass


@dataclass
class _Value:
    start: int  # where this continuation begins in the history
    count: int = 0
    n_accepted: int = 0  # tokens accepted the last time it was drafted


@dataclass
class _Key:
    count: int = 0
    scanned: int = 0  # occurrences before this position are already counted in `values`
    values: list[_Value] = field(default_factory=list)


@dataclass
class _MapState:
    index: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> latest start
    indexed: int = 0  # starts below this are in `index`
    keys: dict[tuple[int, ...], _Key] = field(default_factory=dict)
    last: tuple[tuple[int, ...], int] | None = None  # the key and value of the last draft


MAX_VALUES = 4


class NgramMap:
    """ngram-map-k (``with_values=False``) and ngram-map-k4v (``with_values=True``)."""

    def __init__(self, params: NgramMapParams, *, with_values: bool) -> None:
        self.n = params.size_n
        self.m = params.size_m
        self.min_hits = params.min_hits
        self.with_values = with_values
        self.name = "ngram-map-k4v" if with_values else "ngram-map-k"
        self._seqs: dict[int, _MapState] = {}

    def begin(self, seq: int, prompt: list[int]) -> None:
        self._seqs[seq] = _MapState()  # a new task: the history may have changed anywhere

    def _index(self, st: _MapState, history: list[int], upto: int) -> None:
        """Index every n-gram starting below ``upto`` (those followed by a full m-gram)."""
        n = self.n
        for j in range(max(st.indexed, 1), upto):
            st.index[tuple(history[j : j + n])] = j
        st.indexed = max(st.indexed, upto)

    def draft(self, seq: int, history: list[int], last: int, n_max: int) -> list[int]:
        st = self._seqs.setdefault(seq, _MapState())
        st.last = None
        n, m, cur = self.n, self.m, len(history)
        if cur < 2 * n + m:
            return []
        if st.indexed > cur - n - m:  # the history shrank (a new prompt, a context shift)
            st.index.clear()
            st.keys.clear()
            st.indexed = 0
        self._index(st, history, cur - n - m)
        key = tuple(history[cur - n + 1 :] + [last])
        pos = st.index.get(key, 0)
        if pos == 0:
            return []
        entry = st.keys.setdefault(key, _Key(values=[]))
        entry.count += 1
        if not self.with_values:
            if not entry.values:
                entry.values.append(_Value(pos + n, n_accepted=m))
            take = min(m, entry.values[0].n_accepted, n_max)
            st.last = (key, 0)
            return history[pos + n : pos + n + take]
        if entry.count < self.min_hits:
            return []
        self._count_values(entry, history, key, pos)
        counts = [v.count for v in entry.values]
        best = max(range(len(counts)), key=lambda i: counts[i])
        others = sum(counts) - counts[best]
        if others > 0 and counts[best] < 2 * others:
            return []  # no continuation dominates: drafting would mostly be rejected
        value = entry.values[best]
        take = min(m, value.n_accepted, n_max)
        st.last = (key, best)
        return history[pos + n : pos + n + take]

    def _count_values(self, entry: _Key, history: list[int], key: tuple[int, ...], pos: int) -> None:
        """Count the continuations after each occurrence of ``key`` up to ``pos``."""
        n, m = self.n, self.m
        for i in range(entry.scanned, pos + 1):
            if tuple(history[i : i + n]) != key:
                continue
            start = i + n
            gram = history[start : start + m]
            for value in entry.values:
                if history[value.start : value.start + m] == gram:
                    value.count += 1
                    break
            else:
                if len(entry.values) < MAX_VALUES:
                    entry.values.append(_Value(start, 1, m))
        entry.scanned = pos + 1

    def accept(self, seq: int, n_accepted: int) -> None:
        st = self._seqs.get(seq)
        if st is None or st.last is None:
            return
        key, value = st.last
        entry = st.keys.get(key)
        if entry is not None and value < len(entry.values):
            entry.values[value].n_accepted = n_accepted


@dataclass
class _ModSeq:
    added: int = 0  # n-grams starting below this are in the table
    n_drafted: int = 0
    n_low: int = 0  # consecutive drafts with under a quarter accepted


class NgramMod:
    """ngram-mod: one n-gram -> next-token table over every sequence's history."""

    name = "ngram-mod"
    MAX_ENTRIES = 1 << 20  # llama.cpp resets its table past a quarter of its 4M cells

    def __init__(self, n_match: int, n_min: int, n_max: int) -> None:
        self.n = n_match
        self.n_min = n_min
        self.n_max = n_max
        self.table: dict[tuple[int, ...], int] = {}
        self._seqs: dict[int, _ModSeq] = {}

    def _add(self, tokens: list[int], lo: int, hi: int) -> None:
        n = self.n
        table = self.table
        for i in range(lo, hi):
            table[tuple(tokens[i : i + n])] = tokens[i + n]

    def begin(self, seq: int, prompt: list[int]) -> None:
        st = self._seqs[seq] = _ModSeq()
        if len(prompt) < self.n:
            return
        self._add(prompt, 0, len(prompt) - self.n)
        st.added = len(prompt) - self.n
        if len(self.table) > self.MAX_ENTRIES:
            self.table.clear()

    def draft(self, seq: int, history: list[int], last: int, n_max: int) -> list[int]:
        st = self._seqs.setdefault(seq, _ModSeq())
        st.n_drafted = 0
        n, cur = self.n, len(history)
        if cur < n:
            return []
        if st.added > cur - n:
            st.added = 0
        if st.added + 32 < cur:  # new n-grams go in by chunks, as llama.cpp adds them
            self._add(history, st.added, cur - n)
            st.added = cur - n
        window = history[cur - n + 1 :] + [last]
        out: list[int] = []
        limit = min(self.n_max, n_max)
        while len(out) < limit:
            token = self.table.get(tuple(window))
            if token is None:
                break
            out.append(token)
            window = window[1:] + [token]
        if len(out) < min(self.n_min, limit) or not out:
            return []
        st.n_drafted = len(out)
        return out

    def accept(self, seq: int, n_accepted: int) -> None:
        st = self._seqs.get(seq)
        if st is None or st.n_drafted == 0:
            return
        if n_accepted / st.n_drafted < 0.25:
            st.n_low += 1
            if st.n_low >= 5:  # the table keeps predicting wrong: start it over
                self.table.clear()
                st.n_low = 0
                st.added = 0
        else:
            st.n_low = 0
