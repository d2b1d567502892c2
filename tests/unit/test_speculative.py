"""Speculative decoding in the scheduler, with the fake runner: drafts verified in the batch give
exactly the tokens plain decoding gives, the KV keeps only accepted tokens, and sampled
speculation keeps the target's distribution."""

from __future__ import annotations

import collections
from dataclasses import replace

import pytest

from llamaserve.engine.ngram_draft import NgramMap, NgramMod, NgramSimple
from llamaserve.engine.runner import DraftRequest
from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.spec_params import NgramMapParams, SpecParams
from llamaserve.engine.speculative import Speculator
from llamaserve.engine.types import GenerationRequest

from .fake_runner import FakeRunner
from .test_scheduler import Collector, run_until_idle

SMALL = NgramMapParams(size_n=3, size_m=6, min_hits=1)
# A prompt that repeats itself, and an answer that repeats the prompt's phrase and then
# wanders off: drafts copied from the history are right for a while, then wrong.
PHRASE = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
PROMPT = [1, *PHRASE, 2, *PHRASE, 3]
ANSWER = [*PHRASE, 4, *PHRASE[:5], 30, 31, 32, *PHRASE[:7], 33, 34, 35, 36]


def _run(
    spec: SpecParams | None, prompts: list[list[int]], *, ubatch: int = 64, **req: object
) -> tuple[list[Collector], Scheduler, FakeRunner, int]:
    runner = FakeRunner(n_seq_max=4, n_batch=ubatch, n_ctx_seq=128)
    for i, p in enumerate(prompts):
        runner.scripts[tuple(p)] = [t + 100 * i if t >= 30 else t for t in ANSWER]
    runner.pieces = {t: f"<{t % 100}>".encode() for t in range(1, 500)}
    speculator = Speculator(spec) if spec is not None else None
    s = Scheduler(runner, 4, speculator=speculator)
    outs = []
    for p in prompts:
        c = Collector()
        s.submit(s.next_task_id(), GenerationRequest(prompt_tokens=p, n_predict=len(ANSWER), **req), c)  # type: ignore[arg-type]
        outs.append(c)
    steps = run_until_idle(s)
    return outs, s, runner, steps


def _tokens(c: Collector) -> list[int]:
    return [t for e in c.events for t in getattr(e, "tokens", [])]


@pytest.mark.parametrize(
    "spec",
    [
        SpecParams(types=("ngram-simple",), ngram_simple=SMALL),
        SpecParams(types=("ngram-map-k",), ngram_map_k=SMALL),
        SpecParams(types=("ngram-map-k4v",), ngram_map_k4v=SMALL),
        SpecParams(types=("ngram-mod",), ngram_mod_n_match=3, ngram_mod_n_min=2, ngram_mod_n_max=8),
        SpecParams(types=("ngram-cache",)),
    ],
    ids=lambda p: p.types[0],
)
def test_ngram_drafts_give_the_plain_tokens_in_fewer_steps(spec: SpecParams) -> None:
    plain, _, _, plain_steps = _run(None, [PROMPT])
    fast, s, runner, steps = _run(spec, [PROMPT])
    assert _tokens(fast[0]) == _tokens(plain[0]) == ANSWER
    assert fast[0].text == plain[0].text
    done = fast[0].finished
    assert done is not None and done.timings.draft_n > 0
    assert 0 < done.timings.draft_n_accepted <= done.timings.draft_n
    assert steps < plain_steps
    # The KV holds exactly the tokens the slot says it holds: rejected drafts were removed.
    assert runner.tokens(0) == s.slots[0].cache_tokens
    assert s.stats.spec_accepted_tokens_total == done.timings.draft_n_accepted


def test_four_slots_draft_and_verify_in_the_same_decodes() -> None:
    spec = SpecParams(types=("ngram-simple",), ngram_simple=SMALL)
    prompts = [[k, *PROMPT[1:]] for k in (1, 5, 6, 7)]
    plain, _, _, _ = _run(None, prompts)
    fast, s, runner, _ = _run(spec, prompts)
    for a, b in zip(plain, fast):
        assert _tokens(a) == _tokens(b)
    # Some decode carried drafts of several slots at once.
    assert any(sum(1 for row in plan if row.draft) > 1 for plan in runner.plans)
    for slot in s.slots:
        assert runner.tokens(slot.id) == slot.cache_tokens


def test_a_stop_string_inside_an_accepted_draft_ends_the_answer_there() -> None:
    spec = SpecParams(types=("ngram-simple",), ngram_simple=SMALL)
    plain, _, _, _ = _run(None, [PROMPT], stop=("<16>",))
    fast, s, runner, _ = _run(spec, [PROMPT], stop=("<16>",))
    assert fast[0].text == plain[0].text == "<11><12><13><14><15>"
    done = fast[0].finished
    assert done is not None and done.stop_type == "word"
    assert runner.tokens(0) == s.slots[0].cache_tokens


def test_n_predict_caps_the_draft() -> None:
    spec = SpecParams(types=("ngram-simple",), ngram_simple=SMALL)
    runner = FakeRunner(n_seq_max=1, n_batch=64, n_ctx_seq=128)
    runner.scripts[tuple(PROMPT)] = ANSWER
    s = Scheduler(runner, 1, speculator=Speculator(spec))
    c = Collector()
    s.submit(1, GenerationRequest(prompt_tokens=PROMPT, n_predict=13), c)
    run_until_idle(s)
    assert _tokens(c) == ANSWER[:13]
    done = c.finished
    assert done is not None and done.stop_type == "limit" and done.n_predicted == 13
    # No row ever carried more tokens than the request could still use.
    generated = 0
    for plan in runner.plans[1:]:
        row = plan[0]
        assert generated + len(row.tokens) <= 13
        generated += 1 + len(row.draft)
    assert runner.tokens(0) == s.slots[0].cache_tokens


def test_a_slot_without_a_draft_decodes_in_the_same_step() -> None:
    spec = SpecParams(types=("ngram-simple",), ngram_simple=SMALL)
    other = [40, 41, 42, 43, 44]  # nothing repeats: never drafted
    _, _, runner, _ = _run(spec, [PROMPT, other])
    mixed = [plan for plan in runner.plans if any(r.draft for r in plan) and any(not r.draft for r in plan)]
    assert mixed, "the undrafted slot waited for the drafted one"


class FakeDraftModel:
    """Drafts the script's tokens, with every third draft token wrong."""

    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner
        self.calls: list[list[int]] = []

    def draft(self, requests: list[DraftRequest], p_min: float) -> list[list[int]]:
        self.calls.append([r.seq_id for r in requests])
        out = []
        for r in requests:
            seq = [*r.history, r.last]
            d = []
            for i in range(r.n_max):
                tok = self.runner._next(seq)
                d.append(tok if i % 3 != 2 else tok + 1)
                seq.append(d[-1])
            out.append(d)
        return out

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> None:
        pass


def test_a_draft_model_drafts_for_every_slot_in_one_call() -> None:
    prompts = [[k, *PROMPT[1:]] for k in (1, 5)]
    plain, _, _, _ = _run(None, prompts)
    runner = FakeRunner(n_seq_max=4, n_batch=64, n_ctx_seq=128)
    for i, p in enumerate(prompts):
        runner.scripts[tuple(p)] = [t + 100 * i if t >= 30 else t for t in ANSWER]
    draft = FakeDraftModel(runner)
    spec = SpecParams(types=("draft-simple",), draft_model="x.gguf", draft_n_max=4)
    s = Scheduler(runner, 4, speculator=Speculator(spec, draft))
    outs = []
    for p in prompts:
        c = Collector()
        s.submit(s.next_task_id(), GenerationRequest(prompt_tokens=p, n_predict=len(ANSWER)), c)
        outs.append(c)
    run_until_idle(s)
    for a, b in zip(plain, outs):
        assert _tokens(a) == _tokens(b)
        done = b.finished
        assert done is not None
        # Two of every three draft tokens are right, and a wrong one ends its draft.
        assert done.timings.draft_n_accepted == pytest.approx(done.timings.draft_n / 2, rel=0.5)
    assert any(len(call) == 2 for call in draft.calls)


def test_synthetic_acceptance_accepts_by_the_given_rates() -> None:
    spec = SpecParams(types=("ngram-simple",), ngram_simple=SMALL)
    zero, _, _, _ = _run(replace(spec, synth_rates=(0.0,) * 6), [PROMPT])
    done = zero[0].finished
    assert done is not None and done.timings.draft_n > 0 and done.timings.draft_n_accepted == 0
    plain, _, _, _ = _run(None, [PROMPT])
    assert _tokens(zero[0]) == _tokens(plain[0])
    full, _, _, _ = _run(replace(spec, synth_rates=(1.0,) * 6), [PROMPT])
    done = full[0].finished
    assert done is not None and done.timings.draft_n_accepted == done.timings.draft_n > 0


# ------------------------------------------------------------------ sampled speculation
def _distribution(seq: list[int]) -> list[float]:
    """The target's known next-token distribution: after the prompt, token 3 is likely but not sure."""
    weights = [0.0] * 8
    if seq[-1] == 3:
        weights[3], weights[4], weights[5] = 0.6, 0.3, 0.1
    else:
        weights[3], weights[4], weights[5] = 0.5, 0.25, 0.25
    return weights


def test_sampled_speculation_keeps_the_target_distribution() -> None:
    """Over many seeds, the tokens after an n-gram draft follow the same distribution as plain sampling.

    The drafter always proposes token 3 (the prompt repeats it), which the target draws 50-60% of
    the time. Per generated position, each token's frequency over 600 seeds must be within
    0.06 of plain sampling's (about 3 standard errors of a difference of two frequencies)."""
    prompt = [1, 3, 3, 3, 3, 3, 3, 3, 3, 3]
    spec = SpecParams(types=("ngram-simple",), ngram_simple=NgramMapParams(size_n=1, size_m=4, min_hits=1))
    counts: dict[bool, list[collections.Counter[int]]] = {}
    drafted = 0
    for speculate in (False, True):
        per_pos = [collections.Counter[int]() for _ in range(4)]
        for seed in range(600):
            runner = FakeRunner(n_seq_max=1, n_batch=64, n_ctx_seq=64)
            runner.dist = _distribution
            s = Scheduler(runner, 1, speculator=Speculator(spec) if speculate else None)
            c = Collector()
            sampling = replace(SamplingParams(), seed=seed + 1000 * speculate, temperature=0.8)
            s.submit(1, GenerationRequest(prompt_tokens=prompt, n_predict=4, sampling=sampling), c)
            run_until_idle(s)
            for i, tok in enumerate(_tokens(c)):
                per_pos[i][tok] += 1
            done = c.finished
            assert done is not None
            drafted += done.timings.draft_n
        counts[speculate] = per_pos
    assert drafted > 0
    for pos in range(4):
        for tok in (3, 4, 5):
            plain, spec_f = counts[False][pos][tok] / 600, counts[True][pos][tok] / 600
            assert abs(plain - spec_f) < 0.06, (pos, tok, plain, spec_f)


# ------------------------------------------------------------------ the drafters alone
def test_ngram_simple_copies_what_followed_the_latest_match() -> None:
    d = NgramSimple(NgramMapParams(size_n=2, size_m=3, min_hits=1))
    history = [9, 1, 2, 5, 6, 7, 8, 1, 2, 3, 4, 0, 0, 0, 0, 1]
    # last two tokens would be (1, 2): the latest earlier (1, 2) is at 7, followed by 3, 4, 0
    assert d.draft(0, history, 2, 10) == [3, 4, 0]
    assert d.draft(0, history, 9, 10) == []  # (1, 9) never occurred


def test_ngram_map_k4v_drafts_only_a_dominant_continuation() -> None:
    params = NgramMapParams(size_n=2, size_m=2, min_hits=1)
    d = NgramMap(params, with_values=True)
    d.begin(0, [])
    split = [1, 2, 3, 3, 1, 2, 4, 4, 1, 2, 5, 5, 9, 9, 9, 1]
    assert d.draft(0, split, 2, 8) == []  # three different continuations of (1, 2)
    d = NgramMap(params, with_values=True)
    d.begin(0, [])
    agreed = [1, 2, 3, 3, 1, 2, 3, 3, 1, 2, 3, 3, 9, 9, 9, 1]
    assert d.draft(0, agreed, 2, 8) == [3, 3]


def test_ngram_mod_walks_its_table_and_drops_short_drafts() -> None:
    d = NgramMod(n_match=2, n_min=3, n_max=5)
    d.begin(0, [1, 2, 3, 4, 5, 6, 9])
    assert d.draft(0, [1, 2, 3, 4, 5, 6, 9, 1], 2, 16) == [3, 4, 5, 6, 9]
    assert d.draft(0, [1, 2, 3, 4, 5, 6, 9, 4], 5, 16) == []  # 6, 9 then unknown: under n_min
