"""llama-server's lazy grammar on /completion, /infill and /v1/completions: `grammar_lazy`,
`grammar_triggers` and `preserved_tokens`, the fields its chat route fills from a template's
tool-call format and that clients building their own prompts send to the completion routes.

With `grammar_lazy`, the answer is free text until a trigger fires: a trigger token is
sampled, or the text so far matches a trigger pattern; the grammar applies from the match on.
A trigger is `{"type": t, "value": text}` with t one of llama.cpp's kinds (below); a token
trigger also names its `token` id. A word that is one token becomes a token trigger, and must
then be among `preserved_tokens` (llama-server's rule). A preserved token is a special token
whose text the answer shows even without -sp. Without `grammar_lazy` the grammar applies from
the first token and the triggers are not used, as in llama-server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from llamaserve.engine.backend import Vocabulary
from llamaserve.engine.types import GenerationRequest
from llamaserve.errors import APIError
from llamaserve.grammar.patterns import trigger_pattern_problem
from llamaserve.protocol.common import LazyGrammarFields

# llama.cpp's common_grammar_trigger_type.
TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL = range(4)
# llama.cpp's regex_escape: what a word trigger escapes before it becomes a pattern.
_REGEX_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


def _single_token(model: Vocabulary, text: str) -> int | None:
    ids = model.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


def preserved_tokens(model: Vocabulary, texts: list[str]) -> frozenset[int]:
    """The texts that are one token each; llama-server skips the others."""
    return frozenset(t for text in texts if (t := _single_token(model, text)) is not None)


def _text(trigger: dict[str, Any], where: str) -> str:
    value = trigger.get("value")
    if not isinstance(value, str):
        raise APIError(f"{where}.value: a string is required")
    if "\x00" in value:  # the text goes to llama.cpp as a C string
        raise APIError(f"{where}.value: NUL characters are not allowed")
    return value


def _anchored(pattern: str) -> str:
    """A full-match pattern as llama.cpp anchors it."""
    if not pattern:
        return "^$"
    return ("" if pattern.startswith("^") else "^") + pattern + ("" if pattern.endswith("$") else "$")


def triggers(model: Vocabulary, raw: list[Any], preserved: frozenset[int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """`grammar_triggers` as (patterns, token ids); APIError naming the bad entry."""
    patterns: list[str] = []
    tokens: list[int] = []
    for i, trigger in enumerate(raw):
        where = f"grammar_triggers[{i}]"
        if not isinstance(trigger, dict):
            raise APIError(f'{where}: an object {{"type": …, "value": …}} is required')
        kind = trigger.get("type")
        if not isinstance(kind, int) or isinstance(kind, bool) or kind not in range(4):
            raise APIError(f"{where}.type: one of 0 (token), 1 (word), 2 (pattern), 3 (full pattern)")
        value = _text(trigger, where)
        if kind == TRIGGER_TOKEN:
            token = trigger.get("token")
            if not isinstance(token, int) or isinstance(token, bool) or not model.valid_token(token):
                raise APIError(f"{where}.token: a token id of this model is required")
            tokens.append(token)
        elif kind == TRIGGER_WORD:
            token = _single_token(model, value)
            if token is None:
                patterns.append(_REGEX_SPECIAL.sub(lambda m: "\\" + m.group(0), value))
            elif token in preserved:
                tokens.append(token)
            else:  # llama-server's rule and message
                raise APIError(f"Grammar trigger word should be marked as preserved token: {value}")
        else:
            pattern = value if kind == TRIGGER_PATTERN else _anchored(value)
            problem = trigger_pattern_problem(pattern, f"{where}.value")
            if problem is not None:
                raise APIError(problem)
            patterns.append(pattern)
    return tuple(patterns), tuple(tokens)


@dataclass(frozen=True)
class LazyGrammar:
    """A request's three fields, read once and applied to each of its prompts' jobs."""

    preserved: frozenset[int] = frozenset()
    lazy: bool = False
    patterns: tuple[str, ...] = ()
    tokens: tuple[int, ...] = ()

    def apply(self, job: GenerationRequest) -> GenerationRequest:
        """The job with the preserved tokens and, under `grammar_lazy`, the triggers."""
        if self.preserved:
            job = replace(job, preserved_tokens=self.preserved)
        if not self.lazy or job.sampling.grammar is None:
            return job  # strict, or no grammar: the answer is free text whatever triggers
        if not self.patterns and not self.tokens:
            raise APIError("grammar_triggers: a lazy grammar needs at least one trigger")
        sampling = replace(job.sampling, grammar_triggers=self.patterns, grammar_trigger_tokens=self.tokens)
        return replace(job, sampling=sampling)


def lazy_grammar(model: Vocabulary, req: LazyGrammarFields) -> LazyGrammar:
    """The request's fields checked (a bad trigger is a 400 even when `grammar_lazy` is off)."""
    preserved = preserved_tokens(model, req.preserved_tokens or [])
    patterns, tokens = triggers(model, req.grammar_triggers or [], preserved)
    return LazyGrammar(preserved, req.grammar_lazy, patterns, tokens)


def settings_fields(model: Vocabulary, job: GenerationRequest) -> dict[str, Any]:
    """What `generation_settings` reports of them, in llama-server's shape."""
    sampling = job.sampling
    reported = [
        {"type": TRIGGER_TOKEN, "value": model.detokenize([t], special=True), "token": t}
        for t in sampling.grammar_trigger_tokens
    ]
    reported += [{"type": TRIGGER_PATTERN, "value": p} for p in sampling.grammar_triggers]
    return {
        "grammar_lazy": bool(reported),
        "grammar_triggers": reported,
        "preserved_tokens": sorted(job.preserved_tokens),
    }
