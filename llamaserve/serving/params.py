"""Request fields → engine parameters: sampling, stops, prompt tokens.

Shared by every generating endpoint so that each knob means the same thing
on /completion, /v1/completions and /v1/chat/completions.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from llamaserve.engine.backend import Vocabulary
from llamaserve.engine.sampling import SAMPLER_ALIASES, SAMPLER_LETTERS, SCALAR_KNOBS, SamplingParams
from llamaserve.errors import APIError
from llamaserve.protocol.common import SamplingFields

MAX_PROMPT_CHARS = 64 * 1024 * 1024


def _samplers(value: list[str] | str) -> tuple[str, ...]:
    # A list names samplers; a string is the one-letter form of --sampling-seq.
    names = list(value)
    out: list[str] = []
    for name in names:
        key = name.strip().lower()
        canonical = SAMPLER_ALIASES.get(key) if isinstance(value, list) else SAMPLER_LETTERS.get(key)
        if canonical is None:
            raise APIError(f"samplers: unknown sampler '{name}'")
        out.append(canonical)
    return tuple(out)


def _bias_value(raw: Any, where: str) -> float:
    if raw is False:
        return -math.inf  # `false` bans the token, as in llama-server
    if raw is True or not isinstance(raw, (int, float)):
        raise APIError(f"{where}: bias must be a number or false")
    value = float(raw)
    if math.isnan(value):
        raise APIError(f"{where}: bias must be a number")
    return value


def _bias_targets(model: Vocabulary, key: Any, where: str) -> list[int]:
    if isinstance(key, bool):
        raise APIError(f"{where}: expected a token id or a string")
    if isinstance(key, int):
        token = key
    elif isinstance(key, str) and key.lstrip("-").isdigit():
        token = int(key)
    elif isinstance(key, str):
        return model.tokenize(key, add_special=False, parse_special=False)
    else:
        raise APIError(f"{where}: expected a token id or a string")
    if not model.valid_token(token):
        raise APIError(f"{where}: token id {token} is out of range [0, {model.n_vocab})")
    return [token]


def logit_bias(model: Vocabulary, raw: dict[str, Any] | list[Any]) -> tuple[tuple[int, float], ...]:
    """Both llama-server forms: {"id": bias} and [[id_or_text, bias_or_false], …]."""
    out: list[tuple[int, float]] = []
    items = list(raw.items()) if isinstance(raw, dict) else raw
    for i, item in enumerate(items):
        where = f"logit_bias[{i}]"
        if isinstance(item, tuple) or (isinstance(item, list) and len(item) == 2):
            key, value = item
        else:
            raise APIError(f"{where}: expected [token, bias]")
        bias = _bias_value(value, where)
        out += [(tok, bias) for tok in _bias_targets(model, key, where)]
    if len(out) > 4096:
        raise APIError("logit_bias: too many entries (at most 4096)")
    return tuple(out)


def sampling_config(req: SamplingFields, defaults: SamplingParams, model: Vocabulary) -> SamplingParams:
    changes: dict[str, Any] = {}
    for name in SCALAR_KNOBS:
        value = getattr(req, name, None)
        if value is not None:
            changes[name] = value
    if req.dry_sequence_breakers is not None:
        changes["dry_sequence_breakers"] = tuple(req.dry_sequence_breakers)
    if req.samplers is not None:
        changes["samplers"] = _samplers(req.samplers)
    if req.logit_bias is not None:
        # A request's own list replaces -l/--logit-bias (an empty one clears it), as in llama-server.
        changes["logit_bias"] = logit_bias(model, req.logit_bias)
    params = replace(defaults, **changes) if changes else defaults
    _check_infill_order(params)
    return params


# llama.cpp's infill sampler compares every pair of candidates: over a whole vocabulary
# (49k tokens) one draw takes seconds, stalling every slot. It must follow a top_k this small.
INFILL_MAX_CANDIDATES = 1000


def _check_infill_order(params: SamplingParams) -> None:
    if "infill" not in params.samplers or params.mirostat:
        return
    before = params.samplers[: params.samplers.index("infill")]
    if "top_k" not in before or not 0 < params.top_k <= INFILL_MAX_CANDIDATES:
        raise APIError(
            f"samplers: 'infill' must come after 'top_k' with top_k between 1 and {INFILL_MAX_CANDIDATES} "
            "(over the whole vocabulary it takes seconds per token)"
        )


def stop_strings(stop: str | list[str] | None, defaults: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A request's stop strings; ``defaults`` (-r/--reverse-prompt) when it names none that count.

    llama-server falls back to its antiprompts whenever the effective list is empty: no `stop`,
    `stop: []` or only empty strings.
    """
    if stop is None:
        words: tuple[str, ...] = ()
    else:
        words = (stop,) if isinstance(stop, str) else tuple(s for s in stop if s)
    return words or defaults


def check_tokens(model: Vocabulary, tokens: list[int]) -> list[int]:
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or not model.valid_token(t):
            raise APIError(f"the prompt contains an invalid token id: {t!r} (vocabulary size {model.n_vocab})")
    return tokens


MULTIMODAL_UNSUPPORTED = "Multimodal data provided, but model does not support multimodal requests."
PROMPT_SHAPES = (
    "the prompt must be a string, token ids, a mix of both, or an object with a prompt_string (or a list of those)"
)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _prompt_object(model: Vocabulary, prompt: dict[str, Any], add_special: bool) -> list[int]:
    """llama-server's {"prompt_string": ..., "multimodal_data": [...]} form."""
    if "multimodal_data" in prompt:
        # Until multimodal models load, media can only be refused (llama-server does the same
        # for a text-only model).
        raise APIError(MULTIMODAL_UNSUPPORTED)
    text = prompt.get("prompt_string")
    if not isinstance(text, (str, list)):
        raise APIError(PROMPT_SHAPES)
    return prompt_tokens(model, text, add_special=add_special)


def prompt_tokens(model: Vocabulary, prompt: Any, *, add_special: bool = True) -> list[int]:
    """One prompt as text, token ids, a mix of both, or a prompt_string object (llama-server's forms).

    In a mix only a leading string gets the BOS token, as in llama-server's tokenize_mixed.
    """
    if isinstance(prompt, str):
        if len(prompt) > MAX_PROMPT_CHARS:
            raise APIError("the prompt is too long")
        return model.tokenize(prompt, add_special=add_special, parse_special=True)
    if isinstance(prompt, dict):
        return _prompt_object(model, prompt, add_special)
    if isinstance(prompt, list):
        out: list[int] = []
        for i, piece in enumerate(prompt):
            if isinstance(piece, str):
                out += model.tokenize(piece, add_special=add_special and i == 0, parse_special=True)
            elif _is_token(piece):
                out.append(piece)
            else:
                raise APIError(PROMPT_SHAPES)
        return check_tokens(model, out)
    raise APIError(PROMPT_SHAPES)


def split_prompts(prompt: Any) -> list[Any]:
    """llama-server's rule: a list without a bare token id is several prompts (strings, token
    lists, mixes, objects); a list holding token ids (possibly mixed with strings) is one prompt."""
    if isinstance(prompt, list) and not any(_is_token(p) for p in prompt):
        if not prompt:
            raise APIError('"prompt" must not be empty')
        return list(prompt)
    return [prompt]
