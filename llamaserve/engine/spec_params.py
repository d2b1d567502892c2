"""Speculative decoding settings (llama-server's `--spec-*` flags), as plain data.

`ServerConfig.spec` holds one; the composition root builds the drafters from it. The defaults are
llama-server's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

# llama-server's names, in the order its `--help` lists them.
SPEC_TYPES = (
    "none",
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)

# Types that need a draft head or architecture this build cannot run, with the reason given at start.
UNSUPPORTED_TYPES = {
    "draft-eagle3": "it needs an EAGLE-3 draft head trained for the target model, fed with the target's "
    "hidden states; llamaserve runs standalone draft models only (draft-simple)",
    "draft-mtp": "it needs a model with multi-token-prediction (next-n) layers; llamaserve runs "
    "standalone draft models only (draft-simple)",
    "draft-dflash": "it needs a DFlash block-diffusion draft model fed with the target's hidden states; "
    "llamaserve runs standalone draft models only (draft-simple)",
    "draft-dspark": "it needs a DSpark (DFlash with a Markov head) draft model fed with the target's hidden "
    "states; llamaserve runs standalone draft models only (draft-simple)",
}

# The order llama.cpp tries drafters in: the first that drafts anything wins the step.
PRIORITY = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache", "draft-simple")


def parse_types(text: str) -> tuple[str, ...]:
    """`--spec-type a,b`: llama-server's names; `none` anywhere means none at all."""
    out: list[str] = []
    for name in (p.strip() for p in text.split(",")):
        if name not in SPEC_TYPES:
            raise ValueError(f"unknown speculative type: {name}")
        if name == "none":
            return ()
        if name not in out:
            out.append(name)
    return tuple(out)


@dataclass(frozen=True)
class NgramMapParams:
    size_n: int = 12  # the n-gram looked up
    size_m: int = 48  # the m-gram drafted after it
    min_hits: int = 1


@dataclass(frozen=True)
class SpecParams:
    types: tuple[str, ...] = ()  # empty: no speculative decoding
    default_preset: bool = False  # --spec-default: ngram-mod with its defaults
    # draft model (draft-simple)
    draft_model: str | None = None
    draft_n_max: int = 3
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    draft_p_split: float = 0.1  # parsed only: llama.cpp reads it nowhere either
    draft_ngl: int = -1
    draft_cache_type_k: str = "f16"
    draft_cache_type_v: str = "f16"
    draft_threads: int = -1  # -1: the target's
    draft_threads_batch: int = -1
    # n-gram drafters
    ngram_simple: NgramMapParams = NgramMapParams()
    ngram_map_k: NgramMapParams = NgramMapParams()
    ngram_map_k4v: NgramMapParams = NgramMapParams()
    ngram_mod_n_match: int = 24
    ngram_mod_n_min: int = 48
    ngram_mod_n_max: int = 64
    lookup_cache_static: str | None = None
    lookup_cache_dynamic: str | None = None
    # synthetic acceptance (benchmarking only: the output is not valid)
    synth_len: float = -1.0
    synth_rates: tuple[float, ...] = ()

    @property
    def active_types(self) -> tuple[str, ...]:
        """The drafters to run, in llama.cpp's priority order."""
        chosen = set(self.types)
        if self.default_preset:
            chosen.add("ngram-mod")
        return tuple(t for t in PRIORITY if t in chosen)

    @property
    def enabled(self) -> bool:
        return bool(self.active_types)

    def n_max(self) -> int:
        """The most tokens any active drafter proposes in one step."""
        sizes = {
            "draft-simple": self.draft_n_max,
            "ngram-simple": self.ngram_simple.size_m,
            "ngram-map-k": self.ngram_map_k.size_m,
            "ngram-map-k4v": self.ngram_map_k4v.size_m,
            "ngram-mod": self.ngram_mod_n_max,
            "ngram-cache": self.draft_n_max,
        }
        return max((max(0, sizes[t]) for t in self.active_types), default=0)

    def problems(self) -> list[str]:
        """What keeps the server from starting with these settings (empty: they are usable)."""
        out = [f"speculative type '{t}' is not supported: {why}" for t, why in UNSUPPORTED_TYPES.items()]
        out = [line for t, line in zip(UNSUPPORTED_TYPES, out) if t in self.types]
        if "ngram-cache" in self.types:
            out.append("speculative type 'ngram-cache' (the -lcs/-lcd lookup caches) is not supported by llamaserve")
        if "draft-simple" in self.types and not self.draft_model:
            out.append("speculative type 'draft-simple' needs a draft model (-md/--spec-draft-model)")
        if self.draft_n_max < 0:
            out.append("--spec-draft-n-max must be >= 0")
        out += self._synth_problems()
        return out

    def _synth_problems(self) -> list[str]:
        has_len, has_rates = self.synth_len != -1.0, bool(self.synth_rates)
        if not (has_len or has_rates):
            return []
        if has_len and has_rates:
            return ["synthetic acceptance length and rates are mutually exclusive"]
        n_max = self.n_max()
        if not self.enabled or n_max <= 0:
            return ["synthetic acceptance requires at least one speculative token"]
        if has_rates:
            if len(self.synth_rates) != n_max:
                return [f"synthetic acceptance rates must contain {n_max} values, got {len(self.synth_rates)}"]
            rates = self.synth_rates
            if any(not math.isfinite(r) or not 0.0 <= r <= 1.0 for r in rates):
                return ["synthetic acceptance rates must be finite and within [0, 1]"]
            if any(b > a for a, b in itertools.pairwise(rates)):
                return ["synthetic acceptance rates must be monotonically non-increasing"]
        elif not math.isfinite(self.synth_len) or not 1.0 <= self.synth_len <= n_max + 1:
            return [f"synthetic acceptance length must be finite and within [1, {n_max + 1}]"]
        return []

    def synth_probs(self) -> tuple[float, ...]:
        """Per draft position, the chance a token is accepted given the one before it was."""
        rates = self.synth_rates or self._rates_for_length()
        out: list[float] = []
        prev = 1.0
        for rate in rates:
            out.append(rate / prev if prev > 0.0 else 0.0)
            prev = rate
        return tuple(out)

    def _rates_for_length(self) -> tuple[float, ...]:
        """Geometric rates p, p^2, ... whose mean accepted length (plus the target's token) is synth_len."""
        if self.synth_len == -1.0:
            return ()
        n_max = self.n_max()
        if self.synth_len >= n_max + 1:
            p = 1.0
        elif self.synth_len <= 1.0:
            p = 0.0
        else:
            lo, hi = 0.0, 1.0
            for _ in range(40):  # bisection: sum of p^1..p^n_max against synth_len - 1
                mid = (lo + hi) / 2
                if sum(mid**j for j in range(1, n_max + 1)) < self.synth_len - 1.0:
                    lo = mid
                else:
                    hi = mid
            p = (lo + hi) / 2
        return tuple(p ** (i + 1) for i in range(n_max))
