"""Per-request sampler chains built from llama.cpp's samplers.

The chain follows llama-server's order (``samplers`` names), so the same
request gives the same tokens on both servers. Adding a sampler is one entry
in ``_STAGES``.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import llama_cpp.llama_cpp as C
import numpy as np

from llamaserve.engine.sampling import GrammarError, SamplingParams, resolve_seed
from llamaserve.engine.types import TokenLogprob
from llamaserve.llama.grammar import grammar_sampler
from llamaserve.llama.logits import logits_row
from llamaserve.llama.model import Model

# A `struct llama_sampler *` as llama-cpp-python returns it (an untyped ctypes pointer), or None
# where a stage is off.
Handle = object


@dataclass
class _Keepalive:
    """ctypes buffers that must outlive the chain (llama.cpp copies most, not all)."""

    objects: list[object] = field(default_factory=list)


def _penalties(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    active = cfg.repeat_penalty != 1.0 or cfg.presence_penalty != 0.0 or cfg.frequency_penalty != 0.0
    if cfg.repeat_last_n == 0 or not active:
        return None
    # -1 means "the whole context", as llama-server resolves it before building the sampler.
    last_n = model.n_ctx_train if cfg.repeat_last_n == -1 else cfg.repeat_last_n
    return C.llama_sampler_init_penalties(
        model.n_vocab, last_n, cfg.repeat_penalty, cfg.frequency_penalty, cfg.presence_penalty
    )


def _dry(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    if cfg.dry_multiplier <= 0.0:
        return None
    breakers = [b.encode() for b in cfg.dry_sequence_breakers]
    arr = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
    keep.objects.append(arr)
    # llama.cpp clamps a negative window to 0 (= off); -1 means the whole context.
    last_n = model.n_ctx_train if cfg.dry_penalty_last_n == -1 else cfg.dry_penalty_last_n
    return C.llama_sampler_init_dry(
        model.vocab, cfg.dry_multiplier, cfg.dry_base, cfg.dry_allowed_length, last_n, arr, len(breakers)
    )


def _top_n_sigma(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    return C.llama_sampler_init_top_n_sigma(cfg.top_n_sigma) if cfg.top_n_sigma > 0 else None


def _top_k(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    return C.llama_sampler_init_top_k(cfg.top_k) if cfg.top_k > 0 else None


def _typical(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    return C.llama_sampler_init_typical(cfg.typical_p, cfg.min_keep) if cfg.typical_p < 1.0 else None


def _top_p(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    return C.llama_sampler_init_top_p(cfg.top_p, cfg.min_keep) if cfg.top_p < 1.0 else None


def _min_p(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    return C.llama_sampler_init_min_p(cfg.min_p, cfg.min_keep) if cfg.min_p > 0.0 else None


def _xtc(model: Model, cfg: SamplingParams, keep: _Keepalive, seed: int) -> Handle:
    if cfg.xtc_probability <= 0.0:
        return None
    return C.llama_sampler_init_xtc(cfg.xtc_probability, cfg.xtc_threshold, cfg.min_keep, seed)


def _temperature(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    return C.llama_sampler_init_temp_ext(cfg.temperature, cfg.dynatemp_range, cfg.dynatemp_exponent)


def _infill(model: Model, cfg: SamplingParams, keep: _Keepalive) -> Handle:
    # For fill-in-the-middle: merges tokens that are prefixes of one another and keeps
    # only likely ones, or the end of generation when that outweighs all text.
    return C.llama_sampler_init_infill(model.vocab)


_STAGES: dict[str, Callable[[Model, SamplingParams, _Keepalive], Handle]] = {
    "penalties": _penalties,
    "dry": _dry,
    "top_n_sigma": _top_n_sigma,
    "top_k": _top_k,
    "typ_p": _typical,
    "top_p": _top_p,
    "min_p": _min_p,
    "temperature": _temperature,
    "infill": _infill,
}


class _GreedyPick:
    """The highest logit after the logit biases, the first one on a tie (llama.cpp's greedy temp).

    Each id is biased once with its biases summed: repeated ids add up, as in llama.cpp's
    logit_bias.
    """

    def __init__(self, biases: list[tuple[int, float]]) -> None:
        summed: dict[int, float] = {}
        for token, bias in biases:
            summed[token] = summed.get(token, 0.0) + bias
        self._ids = np.fromiter(summed, dtype=np.int64, count=len(summed))
        self._values = np.array(list(summed.values()), dtype=np.float32)
        # Biases that only lower tokens (bans, ignore_eos) cannot lift any token over the
        # unbiased best one: unless that one is itself lowered, it is the pick. No biases at
        # all is the empty set here.
        self._lowered_only = frozenset(summed) if all(v <= 0.0 for v in summed.values()) else None

    def __call__(self, logits: np.ndarray) -> int:
        best = int(np.argmax(logits))
        if self._lowered_only is not None and best not in self._lowered_only:
            return best
        # Added in place and taken back after: copying the whole row cost more than the argmax.
        saved = logits[self._ids]
        logits[self._ids] += self._values
        try:
            return int(np.argmax(logits))
        finally:
            logits[self._ids] = saved


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class SamplerChain:
    """One request's sampler: logit bias, the ordered stages, the final pick; plus a grammar.

    The grammar is kept apart from the chain, as llama.cpp's own sampling
    code does: prompt tokens feed the chain (penalties see the prompt, as in
    llama-server) without advancing the grammar, and sampling first draws
    freely and asks the grammar about that single token, applying the grammar
    to the whole vocabulary only when the draw is rejected. Checking 49k
    candidates against a grammar every token would be far slower.
    """

    def __init__(self, model: Model, cfg: SamplingParams) -> None:
        self.model = model
        self.cfg = cfg
        self.seed = resolve_seed(cfg.seed)
        self._keep = _Keepalive()
        self.grammar = (
            grammar_sampler(model.vocab, cfg.grammar, cfg.grammar_triggers, cfg.grammar_trigger_tokens)
            if cfg.grammar
            else None
        )
        self.handle = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        biases = self._biases(model, cfg)
        self._add(self._logit_bias(biases))
        # Greedy requests skip the chain: one argmax (15-18 µs on SmolLM2) instead of filling
        # and filtering a 49k-entry candidate array per token (42-58 µs).
        self._greedy = _GreedyPick(biases) if cfg.picks_greedily() else None
        if cfg.mirostat == 0:
            for name in cfg.samplers:
                if name == "xtc":
                    self._add(_xtc(model, cfg, self._keep, self.seed))
                elif name != "adaptive_p":
                    self._add(_STAGES[name](model, cfg, self._keep))
            self._add(self._final_pick(cfg))
        else:
            self._add(_penalties(model, cfg, self._keep))
            self._add(C.llama_sampler_init_temp(cfg.temperature))
            if cfg.mirostat == 1:
                self._add(
                    C.llama_sampler_init_mirostat(model.n_vocab, self.seed, cfg.mirostat_tau, cfg.mirostat_eta, 100)
                )
            else:
                self._add(C.llama_sampler_init_mirostat_v2(self.seed, cfg.mirostat_tau, cfg.mirostat_eta))

    def _final_pick(self, cfg: SamplingParams) -> Handle:
        """The sampler that draws the token: adaptive-p where `samplers` names it, else dist.

        adaptive-p selects a token itself, like dist, so llama.cpp puts it last wherever it is
        listed. temp_ext with temperature <= 0 keeps only the best token, so either pick then
        acts greedily, exactly as llama.cpp does.
        """
        if "adaptive_p" in cfg.samplers:
            return C.llama_sampler_init_adaptive_p(cfg.adaptive_target, cfg.adaptive_decay, self.seed)
        return C.llama_sampler_init_dist(self.seed)

    @staticmethod
    def _biases(model: Model, cfg: SamplingParams) -> list[tuple[int, float]]:
        biases = list(cfg.logit_bias)
        if cfg.ignore_eos:
            # Ban every end-of-generation token, as llama-server does for ignore_eos.
            biases += [(t, float("-inf")) for t in model.eog_tokens()]
        return biases

    def _logit_bias(self, biases: list[tuple[int, float]]) -> Handle:
        if not biases:
            return None
        arr = (C.llama_logit_bias * len(biases))(*(C.llama_logit_bias(tok, bias) for tok, bias in biases))
        self._keep.objects.append(arr)
        return C.llama_sampler_init_logit_bias(self.model.n_vocab, len(biases), arr)

    def _add(self, sampler: Handle) -> None:
        if sampler:
            C.llama_sampler_chain_add(self.handle, sampler)

    def accept(self, token: int) -> None:
        """Feed a prompt token to the history-aware samplers (not the grammar).

        Media placeholders (negative) are skipped, as llama-server skips media positions."""
        if token >= 0:
            C.llama_sampler_accept(self.handle, token)

    def sample(self, ctx_handle: object, index: int) -> int:
        """Pick a token from the logits at batch row ``index`` and accept it."""
        if self._greedy is not None:
            # Nothing in the chain keeps state that a greedy pick reads: no accept needed.
            return self._greedy(self._logits(ctx_handle, index))
        if self.grammar is None:
            return int(C.llama_sampler_sample(self.handle, ctx_handle, index))
        logits = self._logits(ctx_handle, index)
        token = self._draw(logits, with_grammar=False)
        if not self._grammar_allows(token):
            token = self._draw(logits, with_grammar=True)
        C.llama_sampler_accept(self.grammar, token)
        C.llama_sampler_accept(self.handle, token)
        return token

    def _logits(self, ctx_handle: object, index: int) -> np.ndarray:
        return logits_row(ctx_handle, index, self.model.n_vocab)

    def _draw(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        return self._apply(logits, with_grammar=with_grammar)[0]

    def _apply(self, logits: np.ndarray, *, with_grammar: bool) -> tuple[int, np.ndarray]:
        """Run the chain over every candidate: (the drawn token, the candidates left, with p)."""
        data = np.empty(len(logits), dtype=_TOKEN_DATA)
        data["id"] = np.arange(len(logits), dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        arr = C.llama_token_data_array(data.ctypes.data_as(C.llama_token_data_p), len(data), -1, False)
        if with_grammar:
            C.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        C.llama_sampler_apply(self.handle, ctypes.byref(arr))
        if arr.selected < 0:
            raise GrammarError("the grammar allows no token here")
        # The samplers work in place: sorting, shrinking `size`, and the final one writes p.
        return int(arr.data[arr.selected].id), data[: arr.size]

    def sample_post(self, ctx_handle: object, index: int, k: int) -> tuple[int, TokenLogprob]:
        """Sample as `sample` does, and report the probabilities the chain left (post_sampling_probs)."""
        logits = self._logits(ctx_handle, index)
        # The same draws as `sample` makes (free first, the grammar only on a rejection), so a
        # seed gives the same tokens with or without the probabilities.
        token, left = self._apply(logits, with_grammar=False)
        if self.grammar is not None and not self._grammar_allows(token):
            token, left = self._apply(logits, with_grammar=True)
        if self.grammar is not None:
            C.llama_sampler_accept(self.grammar, token)
        C.llama_sampler_accept(self.handle, token)
        # Without top-k the chain may leave the whole vocabulary: stay in numpy.
        ids, probs = left["id"], left["p"]
        chosen = probs[ids == token]
        p_token = float(chosen[0]) if chosen.size else 0.0
        top: tuple[tuple[int, float], ...] = ()
        if k > 0:
            best = np.argpartition(-probs, k - 1)[:k] if k < len(probs) else np.arange(len(probs))
            order = best[np.argsort(-probs[best], kind="stable")]
            top = tuple((int(ids[i]), math.log(float(probs[i]))) for i in order if probs[i] > 0.0)
        return token, TokenLogprob(token, math.log(p_token) if p_token > 0.0 else -math.inf, top)

    def _grammar_allows(self, token: int) -> bool:
        single = (C.llama_token_data * 1)(C.llama_token_data(token, 1.0, 0.0))
        arr = C.llama_token_data_array(single, 1, -1, False)
        C.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        return bool(np.isfinite(single[0].logit))

    def close(self) -> None:
        if self.handle:
            C.llama_sampler_free(self.handle)
            self.handle = None
        if self.grammar:
            C.llama_sampler_free(self.grammar)
            self.grammar = None

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
