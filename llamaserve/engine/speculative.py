"""Speculative decoding on the scheduler's side: who drafts, how much, and what a verified
row does to its slot.

Each step, every generating slot may get a draft: the drafters are tried in llama.cpp's order
(the n-gram ones, then the draft model) and the first that proposes tokens wins. The slot's
row then carries its pending token plus the draft; the runner verifies it (`verify_draft`) in
the same decode as every other row, and `apply_verified` feeds the accepted tokens through the
scheduler's per-token path one by one, exactly as plain decoding would have, then cuts the
rejected tokens out of the KV.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from llamaserve.engine.kv.slot import Slot
from llamaserve.engine.ngram_cache import NgramCacheDrafter
from llamaserve.engine.ngram_draft import NgramMap, NgramMod, NgramSimple
from llamaserve.engine.runner import DraftRequest, DraftRunner, PlanRow, Runner, Sample
from llamaserve.engine.spec_params import NGRAM_CACHE_N_DRAFT, SpecParams
from llamaserve.engine.stats import SchedulerStats


class NgramDrafter(Protocol):
    name: str

    def begin(self, seq: int, prompt: list[int]) -> None: ...

    def draft(self, seq: int, history: list[int], last: int, n_max: int) -> list[int]: ...

    def accept(self, seq: int, n_accepted: int) -> None: ...


DRAFT_MODEL = "draft-simple"


class Speculator:
    """The drafters of one server and the per-slot bookkeeping between draft and verification."""

    def __init__(self, params: SpecParams, draft_model: DraftRunner | None = None) -> None:
        self.params = params
        self.types = params.active_types
        self.drafters: list[NgramDrafter] = []
        self.lookup: NgramCacheDrafter | None = None  # ngram-cache, whose dynamic cache is saved at close
        for name in self.types:
            if name == "ngram-simple":
                self.drafters.append(NgramSimple(params.ngram_simple))
            elif name == "ngram-map-k":
                self.drafters.append(NgramMap(params.ngram_map_k, with_values=False))
            elif name == "ngram-map-k4v":
                self.drafters.append(NgramMap(params.ngram_map_k4v, with_values=True))
            elif name == "ngram-mod":
                self.drafters.append(NgramMod(params.ngram_mod_n_match, params.ngram_mod_n_min, params.ngram_mod_n_max))
            elif name == "ngram-cache":
                self.lookup = NgramCacheDrafter(
                    NGRAM_CACHE_N_DRAFT, params.lookup_cache_static, params.lookup_cache_dynamic
                )
                self.drafters.append(self.lookup)
        self.draft_model = draft_model if DRAFT_MODEL in self.types else None
        self._task_of: dict[int, int] = {}  # slot -> the task its drafters were begun for
        self._made_by: dict[int, NgramDrafter | None] = {}  # slot -> who drafted its last draft
        self._synth = params.synth_probs()
        self._rngs: dict[int, random.Random] = {}  # per slot, synthetic acceptance's dice

    def close(self) -> None:
        """The server is closing (the scheduler has stopped): write what must outlive it."""
        if self.lookup is not None:
            self.lookup.close()

    @property
    def type_names(self) -> str:
        """`speculative.types` as /slots and /props show it."""
        return ",".join(self.types) if self.types else "none"

    def limit(self, slot: Slot, budget: int) -> int:
        """The most draft tokens this slot may verify now (llama-server's rule, and the step's room)."""
        task = slot.task
        if task is None or slot.reasoning is not None:
            return 0  # a forced reasoning end replaces sampled tokens: drafts would not line up
        n = slot.n_ctx - slot.n_past - 2  # room for the token and one more for a context shift
        req = task.request
        if req.n_predict >= 0:
            n = min(n, req.n_predict - len(slot.generated) - 1)
        return max(0, min(n, budget - 1))

    def drafts(self, wanted: list[tuple[Slot, int]]) -> dict[int, list[int]]:
        """Drafts for (slot, n_max) pairs: slot id -> draft (absent when none)."""
        out: dict[int, list[int]] = {}
        model_asks: list[tuple[Slot, DraftRequest]] = []
        for slot, n_max in wanted:
            if n_max <= 0 or slot.task is None or slot.next_token is None:
                continue
            self._begin_if_new(slot)
            self._made_by[slot.id] = None
            for drafter in self.drafters:
                draft = drafter.draft(slot.id, slot.cache_tokens, slot.next_token, n_max)[:n_max]
                if draft:
                    out[slot.id] = draft
                    self._made_by[slot.id] = drafter
                    break
            else:
                if self.draft_model is not None:
                    n_model = min(n_max, self.params.draft_n_max)
                    model_asks.append((slot, DraftRequest(slot.id, slot.cache_tokens, slot.next_token, n_model)))
        if model_asks and self.draft_model is not None:
            results = self.draft_model.draft([r for _, r in model_asks], self.params.draft_p_min)
            for (slot, _), draft in zip(model_asks, results):
                if len(draft) >= max(self.params.draft_n_min, 1):
                    out[slot.id] = draft
        return out

    def _begin_if_new(self, slot: Slot) -> None:
        task = slot.task
        assert task is not None
        if self._task_of.get(slot.id) != task.id:
            self._task_of[slot.id] = task.id
            # As llama-server: the dice start from the request's seed, so a seeded request repeats.
            seed = task.request.sampling.seed
            self._rngs[slot.id] = random.Random(seed if 0 <= seed < 0xFFFFFFFF else None)
            for drafter in self.drafters:
                drafter.begin(slot.id, slot.cache_tokens)

    def synth_for(self, slot_id: int) -> Callable[[int], bool] | None:
        """Synthetic acceptance for the slot's row (--spec-synth-*), else None."""
        if not self._synth:
            return None
        probs, rng = self._synth, self._rngs.setdefault(slot_id, random.Random())
        return lambda i: rng.random() < probs[i] if i < len(probs) else False

    def accepted(self, slot_id: int, n_accepted: int) -> None:
        drafter = self._made_by.pop(slot_id, None)
        if drafter is not None:
            drafter.accept(slot_id, n_accepted)


def apply_verified(
    slot: Slot,
    row: PlanRow,
    samples: list[Sample],
    runner: Runner,
    stats: SchedulerStats,
    on_token: Callable[[Sample], None],
) -> int:
    """Take a verified row into its slot; returns how many draft tokens the target accepted.

    The KV holds the row's tokens at row.start_pos...; the ones after the accepted draft go
    first, so the slot's cache and its KV agree before any token is looked at (a context shift
    on the last one then moves only valid cells).
    """
    n_accepted = len(samples) - 1
    runner.seq_remove(slot.id, row.start_pos + 1 + n_accepted, -1)
    stats.spec_drafts_total += 1
    stats.spec_draft_tokens_total += len(row.draft)
    stats.spec_accepted_tokens_total += n_accepted
    slot.n_draft += len(row.draft)
    slot.n_draft_accepted += n_accepted
    task = slot.task
    slot.cache_tokens.append(row.tokens[0])
    for i, sample in enumerate(samples):
        on_token(sample)
        if slot.task is not task:
            break  # the answer ended on this token: the later ones were never produced
        if i < n_accepted:
            # Decoded in this row: in the KV already, as plain decoding would have put it there.
            slot.cache_tokens.append(row.draft[i])
    if slot.task is not task and len(slot.cache_tokens) < row.start_pos + 1 + n_accepted:
        runner.seq_remove(slot.id, slot.n_past, -1)
    return n_accepted
