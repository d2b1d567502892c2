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

# What llama.cpp's own drafters of these kinds need and llamaserve lacks: the target's hidden states
# after every target decode (prompt chunks and verification rows alike) handed to the drafter.
# llama.cpp reads them through its staging API (src/llama-ext.h), whose functions our libllama
# exports only with C++ linkage (mangled names), absent from llama.h and from llama-cpp-python.
_HIDDEN_STATES = (
    "llamaserve's runner does not read the target's hidden states back: llama.cpp exposes them only "
    "through its C++ staging API (src/llama-ext.h: llama_set_embeddings_layer_inp, "
    "llama_get_embeddings_layer_inp, llama_get_embeddings_nextn_ith, llama_model_target_layer_ids), which "
    "is not part of llama.h nor of llama-cpp-python; llamaserve runs standalone draft models only (draft-simple)"
)

# Types that need a draft head or architecture this build cannot run, with the reason given at start.
UNSUPPORTED_TYPES = {
    "draft-eagle3": "it needs an EAGLE-3 draft head trained for the target model, fed with the hidden states "
    "of three of the target's layers after every target decode; " + _HIDDEN_STATES,
    "draft-mtp": "it needs a model with multi-token-prediction (next-n) layers run in an MTP context on the "
    "target's weights and hidden states; " + _HIDDEN_STATES,
    "draft-dflash": "it needs a DFlash block-diffusion draft model fed with the target's hidden states; "
    + _HIDDEN_STATES,
    "draft-dspark": "it needs a DSpark (DFlash with a Markov head) draft model fed with the target's hidden "
    "states; " + _HIDDEN_STATES,
}

# ngram-cache drafts at most this many tokens: llama.cpp fixes it (common/speculative.cpp's
# create_state_ngram_cache), whatever --spec-draft-n-max says.
NGRAM_CACHE_N_DRAFT = 8

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
    # the draft model's own placement (llama-server's -hfd, -devd, -otd, -cmoed, -ncmoed)
    draft_hf_repo: str | None = None  # <user>/<model>[:quant]: resolved to draft_model before loading
    draft_hf_file: str | None = None  # the file of draft_hf_repo (the -spec presets name it)
    draft_devices: str | None = None  # None: the target's --device
    draft_override_tensor: tuple[str, ...] = ()  # PATTERN=BUFFER_TYPE items
    draft_cpu_moe: bool = False
    draft_n_cpu_moe: int = 0
    # --spec-draft-backend-sampling: llama.cpp samples drafts inside the graph only in the drafters
    # that read the target's hidden states (EAGLE-3, MTP, DFlash), which llamaserve does not run;
    # its draft-simple samples on the host, as ours does. So only off is accepted.
    draft_backend_sampling: bool = False
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
            "ngram-cache": NGRAM_CACHE_N_DRAFT,
        }
        return max((max(0, sizes[t]) for t in self.active_types), default=0)

    def problems(self) -> list[str]:
        """What keeps the server from starting with these settings (empty: they are usable)."""
        out = [f"speculative type '{t}' is not supported: {why}" for t, why in UNSUPPORTED_TYPES.items()]
        out = [line for t, line in zip(UNSUPPORTED_TYPES, out) if t in self.types]
        if "draft-simple" in self.types and not (self.draft_model or self.draft_hf_repo):
            out.append("speculative type 'draft-simple' needs a draft model (-md/--spec-draft-model or -hfd)")
        if self.draft_backend_sampling:
            out.append(
                "--spec-draft-backend-sampling is not supported: llama.cpp samples drafts inside the graph only "
                "in the draft-eagle3/draft-mtp/draft-dflash drafters, which llamaserve does not run; draft-simple "
                "picks its tokens on the host, as llama-server's does (drop the flag or pass "
                "--no-spec-draft-backend-sampling)"
            )
        if self.draft_n_cpu_moe < 0:
            out.append("--spec-draft-n-cpu-moe must be >= 0")
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
