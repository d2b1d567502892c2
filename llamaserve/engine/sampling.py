"""What a request asks of the sampler: plain data, no llama.cpp.

`SamplingParams` carries every knob llama-server accepts, with its defaults.
The engine, the config and the HTTP side speak it; `llama/sampler.py` turns
it into a llama.cpp sampler chain inside the scheduler thread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields

DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)

# Single-letter codes of --sampling-seq, as llama.cpp names them.
SAMPLER_LETTERS: dict[str, str] = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
    "i": "infill",
    "a": "adaptive_p",
}

# Accepted spellings of sampler names in the `samplers` request field.
SAMPLER_ALIASES: dict[str, str] = {
    "penalties": "penalties",
    "dry": "dry",
    "top_n_sigma": "top_n_sigma",
    "top_k": "top_k",
    "typ_p": "typ_p",
    "typical_p": "typ_p",
    "typical": "typ_p",
    "top_p": "top_p",
    "nucleus": "top_p",
    "min_p": "min_p",
    "xtc": "xtc",
    "temperature": "temperature",
    "temp": "temperature",
    "infill": "infill",
    "adaptive_p": "adaptive_p",
    "adaptive-p": "adaptive_p",
    "adaptivep": "adaptive_p",
}

# Every sampler a chain can name (the defaults plus those only asked for explicitly).
KNOWN_SAMPLERS: frozenset[str] = frozenset(SAMPLER_ALIASES.values())

DEFAULT_DRY_BREAKERS: tuple[str, ...] = ("\n", ":", '"', "*")


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling knob of one request (llama-server's defaults)."""

    temperature: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_BREAKERS
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    # adaptive-p (llama.cpp): draws tokens near this probability; it replaces the final `dist`
    # only when `adaptive_p` is in `samplers`. A negative target turns it off inside llama.cpp.
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.9
    seed: int = -1
    min_keep: int = 0
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    grammar: str | None = None
    # Lazy grammar (tool calls, llama-server's grammar_lazy): free text until a trigger pattern
    # matches the text or a trigger token is sampled; the grammar applies from the trigger on.
    grammar_triggers: tuple[str, ...] = ()
    grammar_trigger_tokens: tuple[int, ...] = ()
    n_probs: int = 0

    def picks_greedily(self) -> bool:
        """Whether the chain always yields the highest logit (after logit_bias): temperature
        <= 0 without dynamic temperature, and no stage that could drop or move that token
        (XTC, typical, penalties, DRY, infill), no grammar, mirostat or adaptive-p.
        top-k, top-p, min-p and top-n-sigma always keep the best token."""
        stages = set(self.samplers)
        if self.mirostat != 0 or self.grammar is not None or stages & {"adaptive_p", "infill"}:
            return False
        if "temperature" not in stages or self.temperature > 0.0 or self.dynatemp_range > 0.0:
            return False
        if "xtc" in stages and self.xtc_probability > 0.0:
            return False
        if "typ_p" in stages and self.typical_p < 1.0:
            return False
        return not (self.uses_history() and stages & {"penalties", "dry"})

    def uses_history(self) -> bool:
        """Whether the chain must see the prompt tokens (penalties and DRY do)."""
        penalties = self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )
        return penalties or self.dry_multiplier > 0.0


# Knobs that need translating before they reach SamplingParams (names, token ids, grammars).
_COMPOSITE_KNOBS = frozenset(
    {"dry_sequence_breakers", "logit_bias", "samplers", "grammar", "grammar_triggers", "grammar_trigger_tokens"}
)
# The knobs a request field or a server flag sets as one plain value, under the same name.
SCALAR_KNOBS: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams) if f.name not in _COMPOSITE_KNOBS)


def resolve_seed(seed: int) -> int:
    """llama.cpp treats 0xFFFFFFFF as 'random'; pick one so /slots can show it."""
    if seed is None or seed < 0 or seed == 0xFFFFFFFF:
        return random.randint(0, 0xFFFFFFFE)
    return seed & 0xFFFFFFFF


class GrammarError(ValueError):
    """llama.cpp rejected a grammar."""
