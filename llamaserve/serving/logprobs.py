"""Log-probabilities in each API family's JSON shape."""

from __future__ import annotations

from typing import Any

from llamaserve.llama.logprobs import TokenLogprob
from llamaserve.llama.model import Model


def _text(model: Model, token: int) -> tuple[str, list[int]]:
    raw = model.piece(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def openai_chat(model: Model, items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """`choices[].logprobs.content[]` of the chat API."""
    out = []
    for lp in items:
        text, raw = _text(model, lp.token)
        top = []
        for tok, value in lp.top:
            t_text, t_raw = _text(model, tok)
            top.append({"token": t_text, "logprob": value, "bytes": t_raw})
        out.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return out


def native(model: Model, items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """`completion_probabilities` of /completion."""
    out = []
    for lp in items:
        text, raw = _text(model, lp.token)
        top = []
        for tok, value in lp.top:
            t_text, t_raw = _text(model, tok)
            top.append({"id": tok, "token": t_text, "bytes": t_raw, "logprob": value})
        out.append({"id": lp.token, "token": text, "bytes": raw, "logprob": lp.logprob, "top_logprobs": top})
    return out


def legacy(model: Model, items: list[TokenLogprob | int], offset: int = 0) -> dict[str, Any]:
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
            text, _ = _text(model, lp)
            values.append(None)
            tops.append(None)
        else:
            text, _ = _text(model, lp.token)
            values.append(lp.logprob)
            tops.append({_text(model, t)[0]: v for t, v in lp.top})
        tokens.append(text)
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
