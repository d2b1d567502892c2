"""Log-probabilities in each API family's JSON shape."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from llamaserve.engine.backend import Vocabulary
from llamaserve.engine.types import TokenLogprob


def _text(model: Vocabulary, token: int, special: bool) -> tuple[str, list[int]]:
    # -sp: special tokens are shown by their text here too, as in the generated text.
    raw = model.piece(token, special=special)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _entry(model: Vocabulary, token: int, logprob: float, with_id: bool, post: bool, special: bool) -> dict[str, Any]:
    text, raw = _text(model, token, special)
    entry: dict[str, Any] = {"id": token} if with_id else {}
    entry.update({"token": text, "bytes": raw})
    # post_sampling_probs: llama-server reports probabilities, not their logs.
    entry["prob" if post else "logprob"] = math.exp(logprob) if post else logprob
    return entry


def _entries(
    model: Vocabulary, items: list[TokenLogprob], with_id: bool, post: bool, special: bool
) -> list[dict[str, Any]]:
    return [
        {
            **_entry(model, lp.token, lp.logprob, with_id, post, special),
            "top_probs" if post else "top_logprobs": [_entry(model, t, v, with_id, post, special) for t, v in lp.top],
        }
        for lp in items
    ]


def openai_chat(
    model: Vocabulary, items: list[TokenLogprob], *, post: bool = False, special: bool = False
) -> list[dict[str, Any]]:
    """`choices[].logprobs.content[]` of the chat API."""
    return _entries(model, items, with_id=False, post=post, special=special)


def native(
    model: Vocabulary, items: list[TokenLogprob], *, post: bool = False, special: bool = False
) -> list[dict[str, Any]]:
    """`completion_probabilities` of /completion (the same entries, with token ids)."""
    return _entries(model, items, with_id=True, post=post, special=special)


def legacy(
    model: Vocabulary, items: Sequence[TokenLogprob | int], offset: int = 0, *, special: bool = False
) -> dict[str, Any]:
    """`choices[].logprobs` of /v1/completions: parallel arrays plus text offsets.

    A bare token id (the first prompt token when echoing) has no log-probability: null.
    """
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    pos = offset
    for lp in items:
        if isinstance(lp, int):
            text, _ = _text(model, lp, special)
            values.append(None)
            tops.append(None)
        else:
            text, _ = _text(model, lp.token, special)
            values.append(lp.logprob)
            tops.append({_text(model, t, special)[0]: v for t, v in lp.top})
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
