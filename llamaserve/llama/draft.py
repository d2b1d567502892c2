"""`DraftModel`: a second, smaller model in a context of its own that drafts for the target.

It implements the engine's `DraftRunner` seam. Its KV mirrors each target sequence lazily: at
every draft it keeps the longest prefix it shares with the target's tokens, drops the rest
(rejected draft tokens, a new prompt, a context shift) and decodes what is missing, all
sequences in the same decodes. Drafting is greedy, one decode per drafted position for every
drafting sequence together.
"""

from __future__ import annotations

import numpy as np

from llamaserve.engine.runner import DraftRequest
from llamaserve.llama.context import Context
from llamaserve.llama.logits import logits_row
from llamaserve.llama.model import Model


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class DraftModel:
    def __init__(self, model: Model, context: Context) -> None:
        self.model = model
        self.context = context
        self._cached: dict[int, list[int]] = {}  # per sequence, the tokens whose KV it holds
        self._p_min = 0.0

    def close(self) -> None:
        self.context.close()
        self.model.close()

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None:
        self.context.seq_remove(seq_id, p0, p1)
        cached = self._cached.get(seq_id, [])
        if p1 < 0:
            del cached[p0:]
        else:
            self._cached[seq_id] = []  # a hole: start this sequence over next time
            self.context.seq_remove(seq_id, 0, -1)

    def _best(self, index: int) -> tuple[int, float]:
        """The most likely token at batch row ``index`` and its probability (1.0 unless p_min asks)."""
        logits = logits_row(self.context.handle, index, self.model.n_vocab)
        best = int(np.argmax(logits))
        if self._p_min <= 0.0:
            return best, 1.0
        top = float(logits[best])
        return best, 1.0 / float(np.sum(np.exp(logits - top)))

    def _catch_up(self, requests: list[DraftRequest]) -> dict[int, tuple[int, float]]:
        """Bring each sequence's KV to its history plus `last`; the best next token of each."""
        pending: list[tuple[int, int, int]] = []  # (token, pos, seq)
        last_of: dict[int, int] = {}
        for req in requests:
            want = req.history + [req.last]
            cached = self._cached.setdefault(req.seq_id, [])
            # Keep at most all but the last token: its logits are needed again.
            keep = min(_shared_prefix(cached, want), len(want) - 1)
            if keep < len(cached):
                self.context.seq_remove(req.seq_id, keep, -1)
                del cached[keep:]
            pending += [(want[p], p, req.seq_id) for p in range(keep, len(want))]
            last_of[req.seq_id] = len(want) - 1
            cached.extend(want[keep:])
        best: dict[int, tuple[int, float]] = {}
        n_batch = self.context.n_batch
        for lo in range(0, len(pending), n_batch):
            chunk = pending[lo : lo + n_batch]
            rows = [(tok, pos, seq, pos == last_of[seq]) for tok, pos, seq in chunk]
            if self.context.decode(rows) != 0:
                self._forget([req.seq_id for req in requests])
                return {}
            for i, (_, _, seq, want_logits) in enumerate(rows):
                if want_logits:
                    best[seq] = self._best(i)
        return best

    def _forget(self, seqs: list[int]) -> None:
        for seq in seqs:
            self.context.seq_remove(seq, 0, -1)
            self._cached[seq] = []

    def draft(self, requests: list[DraftRequest], p_min: float) -> list[list[int]]:
        asked = requests
        self._p_min = p_min
        requests = [r for r in requests if r.n_max > 0]
        drafts: dict[int, list[int]] = {r.seq_id: [] for r in asked}
        if not requests:
            return [[] for _ in asked]
        best = self._catch_up(requests)
        limits = {r.seq_id: r.n_max for r in requests}
        active = [r.seq_id for r in requests if r.seq_id in best]
        while active:
            rows: list[tuple[int, int, int, bool]] = []
            for seq in active:
                token, p = best[seq]
                if p < p_min:  # only confident tokens are worth verifying
                    continue
                drafts[seq].append(token)
                if len(drafts[seq]) >= limits[seq] or self.model.is_eog(token):
                    continue
                rows.append((token, len(self._cached[seq]), seq, True))
            if not rows:
                break
            if self.context.decode(rows) != 0:
                self._forget([seq for _, _, seq, _ in rows])
                break
            active = []
            for i, (token, _, seq, _) in enumerate(rows):
                self._cached[seq].append(token)
                best[seq] = self._best(i)
                active.append(seq)
        return [drafts[r.seq_id] for r in asked]
