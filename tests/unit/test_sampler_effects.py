"""Each sampler changes the distribution in its documented direction, at temperature > 0.

One SmolLM2 decode gives one logits row; every test then draws many tokens
from that same row with different seeds through our `SamplerChain` (the
chain the server builds for a request) and compares the draws with the
model's own distribution (the softmax of the row). A sampler that was built
but not applied, or applied in the wrong direction, fails here, where a
request that is merely accepted would not.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

import llama_cpp.llama_cpp as C
import numpy as np
import numpy.typing as npt
import pytest

from llamaserve.engine.sampling import SamplingParams
from llamaserve.llama.context import Context, ContextSettings
from llamaserve.llama.logits import logits_row
from llamaserve.llama.model import Model
from llamaserve.llama.sampler import SamplerChain
from tests.llama_logs import silenced_llama_logs

DRAWS = 300
# Every sampler off, plain softmax sampling at temperature 1: the reference.
NEUTRAL = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
PROMPT = "Once upon a time, in a small village, there lived a"


@dataclass
class Row:
    model: Model
    context: Context
    index: int  # the batch row whose logits we sample
    probs: npt.NDArray[np.float64]  # the model's distribution at that row
    logits: npt.NDArray[np.float32]

    @property
    def ranked(self) -> list[int]:
        return [int(t) for t in np.argsort(-self.probs, kind="stable")]

    def draws(self, params: SamplingParams, history: tuple[int, ...] = ()) -> Counter[int]:
        """DRAWS tokens, one fresh chain (and seed) each, after `history` was accepted."""
        out: Counter[int] = Counter()
        for seed in range(DRAWS):
            chain = SamplerChain(self.model, replace(params, seed=seed))
            try:
                for token in history:
                    chain.accept(token)
                out[chain.sample(self.context.handle, self.index)] += 1
            finally:
                chain.close()
        return out


@pytest.fixture(scope="module")
def row(model: Model) -> Iterator[Row]:
    with silenced_llama_logs():
        settings = ContextSettings(
            n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=1, n_threads=2, n_threads_batch=2, kv_unified=True
        )
        context = Context(model, settings)
    tokens = model.tokenize(PROMPT)
    assert context.decode([(t, i, 0, i == len(tokens) - 1) for i, t in enumerate(tokens)]) == 0
    index = len(tokens) - 1
    logits = logits_row(context.handle, index, model.n_vocab).copy()
    shifted = logits.astype(np.float64) - logits.max()
    probs = np.exp(shifted) / np.exp(shifted).sum()
    yield Row(model, context, index, probs, logits)
    context.close()


def entropy(counts: Counter[int]) -> float:
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values())


def test_the_reference_draws_follow_the_models_distribution(row: Row) -> None:
    counts = row.draws(NEUTRAL)
    top = row.ranked[0]
    # The prompt leaves the next word open: several tokens, none certain.
    assert 0.05 < row.probs[top] < 0.9 and len(counts) >= 5, (row.probs[top], len(counts))
    # The top token's frequency matches its probability within 5 standard errors.
    p = row.probs[top]
    assert abs(counts[top] / DRAWS - p) < 5 * math.sqrt(p * (1 - p) / DRAWS)


def test_greedy_at_temperature_zero(row: Row) -> None:
    assert set(row.draws(replace(NEUTRAL, temperature=0.0))) == {row.ranked[0]}


def test_the_greedy_shortcut_picks_what_llama_cpps_chain_picks(row: Row) -> None:
    """At temperature 0 `sample` takes an argmax instead of running the chain; the chain
    (still built) must agree, with the default stages on and with biases that move the pick."""
    top = row.ranked[:3]
    cases = [
        SamplingParams(temperature=0.0),  # every default stage on: top-k, top-p, min-p, ...
        SamplingParams(temperature=0.0, logit_bias=((top[0], float("-inf")), (top[1], float("-inf")))),
        SamplingParams(temperature=-1.0, logit_bias=((top[2], 4.0), (top[2], 4.0))),  # repeats add up
        SamplingParams(temperature=0.0, ignore_eos=True, top_k=1),
        SamplingParams(temperature=0.0, logit_bias=((top[0], -0.5), (top[1], 0.25), (top[1], 0.25))),
    ]
    picks = []
    for params in cases:
        assert params.picks_greedily()
        chain = SamplerChain(row.model, params)
        try:
            fast = chain.sample(row.context.handle, row.index)
            # The shortcut biases llama.cpp's row in place: it must be left as it was found.
            assert np.array_equal(logits_row(row.context.handle, row.index, row.model.n_vocab), row.logits)
            full = int(C.llama_sampler_sample(chain.handle, row.context.handle, row.index))
        finally:
            chain.close()
        assert fast == full, (params, fast, full)
        picks.append(fast)
    assert picks[0] == top[0] and picks[1] == top[2] and picks[2] == top[2]


def test_a_logits_row_is_llama_cpps_row_and_one_decoded_without_logits_is_refused(row: Row) -> None:
    view = logits_row(row.context.handle, row.index, row.model.n_vocab)
    assert np.array_equal(view, row.logits)
    assert logits_row(row.context.handle, row.index, row.model.n_vocab) is view  # made once per address
    with silenced_llama_logs(), pytest.raises(ValueError, match="no logits at batch row 0"):
        logits_row(row.context.handle, 0, row.model.n_vocab)  # only the prompt's last row has logits


def test_only_choices_that_cannot_move_the_best_token_count_as_greedy() -> None:
    greedy = SamplingParams(temperature=0.0)
    assert greedy.picks_greedily() and not SamplingParams().picks_greedily()
    for knob in (
        {"dynatemp_range": 0.5},
        {"xtc_probability": 0.5},
        {"typical_p": 0.5},
        {"repeat_penalty": 1.1},
        {"dry_multiplier": 0.8},
        {"mirostat": 2},
        {"grammar": "root ::= [a-z]+"},
        {"samplers": ("top_k", "min_p")},  # no temperature stage: dist draws at random
        {"samplers": ("temperature", "adaptive_p")},
    ):
        assert not replace(greedy, **knob).picks_greedily(), knob  # type: ignore[arg-type]
    # Penalties that are off, or stages left out of the order, do not matter.
    assert replace(greedy, repeat_penalty=1.1, samplers=("top_k", "temperature")).picks_greedily()


def test_lower_temperature_concentrates_higher_spreads(row: Row) -> None:
    cold, warm, hot = (row.draws(replace(NEUTRAL, temperature=t)) for t in (0.4, 1.0, 1.8))
    assert entropy(cold) < entropy(warm) < entropy(hot)
    top = row.ranked[0]
    assert cold[top] > warm[top] > hot[top]


def test_top_k_keeps_only_the_k_most_likely(row: Row) -> None:
    counts = row.draws(replace(NEUTRAL, top_k=3))
    assert set(counts) <= set(row.ranked[:3]) and len(counts) >= 2


def test_top_p_keeps_the_smallest_nucleus(row: Row) -> None:
    p = 0.5
    cumulative = np.cumsum(row.probs[row.ranked])
    nucleus = set(row.ranked[: int(np.searchsorted(cumulative, p)) + 1])
    counts = row.draws(replace(NEUTRAL, top_p=p))
    assert set(counts) <= nucleus, (sorted(counts), sorted(nucleus))


def test_min_p_drops_tokens_far_below_the_best(row: Row) -> None:
    m = 0.2
    floor = m * row.probs.max()
    counts = row.draws(replace(NEUTRAL, min_p=m))
    assert all(row.probs[t] >= floor * 0.999 for t in counts)
    assert len(counts) < len(row.draws(NEUTRAL))


def test_typical_p_narrows_the_choice(row: Row) -> None:
    assert len(row.draws(replace(NEUTRAL, typical_p=0.3))) < len(row.draws(NEUTRAL))


def test_top_n_sigma_keeps_logits_near_the_maximum(row: Row) -> None:
    n = 1.0
    # llama.cpp takes the standard deviation over every finite logit.
    threshold = row.logits.max() - n * float(np.std(row.logits))
    counts = row.draws(replace(NEUTRAL, top_n_sigma=n))
    assert all(row.logits[t] >= threshold - 1e-4 for t in counts)


def test_xtc_removes_the_most_likely_choices(row: Row) -> None:
    threshold = 0.05
    above = [t for t in row.ranked if row.probs[t] >= threshold]
    assert len(above) >= 2, "the prompt should leave several likely tokens"
    counts = row.draws(replace(NEUTRAL, xtc_probability=1.0, xtc_threshold=threshold))
    # Every token above the threshold but the least likely of them is excluded.
    assert not set(counts) & set(above[:-1]), (counts, above)


def test_repeat_and_presence_penalties_lower_a_seen_token(row: Row) -> None:
    top = row.ranked[0]
    base = row.draws(NEUTRAL, history=(top,))[top]
    for penalty in (
        replace(NEUTRAL, repeat_penalty=2.0),
        replace(NEUTRAL, presence_penalty=2.0),
        replace(NEUTRAL, frequency_penalty=1.0),
    ):
        assert row.draws(penalty, history=(top, top))[top] < base / 2, penalty


def test_dry_penalises_the_token_that_would_extend_a_repeat(row: Row) -> None:
    top = row.ranked[0]
    a, b = row.ranked[50], row.ranked[60]
    history = (a, b, top, a, b)  # `top` next would repeat "a b top"
    base = row.draws(NEUTRAL, history=history)[top]
    dry = row.draws(replace(NEUTRAL, dry_multiplier=3.0, dry_allowed_length=2), history=history)[top]
    assert dry < base / 2, (dry, base)


def test_logit_bias_bans_and_boosts(row: Row) -> None:
    top, rare = row.ranked[0], row.ranked[500]
    banned = row.draws(replace(NEUTRAL, logit_bias=((top, float("-inf")),)))
    assert top not in banned
    boosted = row.draws(replace(NEUTRAL, logit_bias=((rare, 30.0),)))
    assert boosted[rare] > DRAWS * 0.9


def test_mirostat_v2_keeps_surprise_below_its_bound(row: Row) -> None:
    tau = 1.0
    counts = row.draws(replace(NEUTRAL, mirostat=2, mirostat_tau=tau, mirostat_eta=0.1))
    # On the first draw mu = 2 tau: tokens more surprising than mu bits are cut.
    assert all(-math.log2(row.probs[t]) <= 2 * tau + 1e-6 for t in counts if counts[t])
    assert len(counts) < len(row.draws(NEUTRAL))


def test_sampler_order_changes_the_result(row: Row) -> None:
    """`samplers` is honoured: top_k after a hot temperature is not top_k alone."""
    order_a = replace(NEUTRAL, top_k=2, temperature=3.0, samplers=("top_k", "temperature"))
    assert set(row.draws(order_a)) <= set(row.ranked[:2])
    without_top_k = replace(NEUTRAL, top_k=2, temperature=3.0, samplers=("temperature",))
    assert len(row.draws(without_top_k)) > 2


def test_infill_keeps_few_merged_choices(row: Row) -> None:
    """llama.cpp's infill sampler merges prefix tokens and drops those below 20% (or keeps
    only end-of-generation), so a handful of choices at most remain."""
    counts = row.draws(replace(NEUTRAL, top_k=40, samplers=("top_k", "infill", "temperature")))
    assert len(counts) <= 5 < len(row.draws(replace(NEUTRAL, top_k=40, samplers=("top_k", "temperature")))), counts


def test_adaptive_p_replaces_dist_only_when_listed(row: Row) -> None:
    """adaptive-p draws tokens near its target probability; without `adaptive_p` in the
    order its target changes nothing (llama.cpp then ends the chain with dist)."""
    base = replace(NEUTRAL, top_k=40, samplers=("top_k", "temperature"))
    low = replace(base, adaptive_target=0.02)
    assert row.draws(low) == row.draws(base)
    adaptive = row.draws(replace(low, samplers=("top_k", "temperature", "adaptive_p")))
    top = row.ranked[0]
    assert adaptive[top] < row.draws(base)[top] / 2, (adaptive.most_common(3), row.probs[top])
