"""Embeddings (/v1/embeddings, /embedding) and reranking (/v1/rerank and aliases)."""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np

from llamaserve.engine.backend import Embedder, EmbedError
from llamaserve.errors import APIError
from llamaserve.families.embeddings.protocol import EmbeddingRequest, NativeEmbeddingRequest, RerankRequest
from llamaserve.serving import media
from llamaserve.serving.params import prompt_tokens
from llamaserve.serving.runtime import ModelRuntime

MAX_INPUTS = 2048


def normalize(vec: np.ndarray, mode: int) -> np.ndarray:
    """llama.cpp's embd_normalize: -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean, >2 p-norm."""
    if mode < 0:
        return vec
    if mode == 0:
        peak = float(np.max(np.abs(vec))) if vec.size else 0.0
        return vec * (32760.0 / peak) if peak > 0 else vec
    if mode == 2:
        norm = float(np.linalg.norm(vec))
    else:
        norm = float(np.sum(np.abs(vec) ** mode) ** (1.0 / mode))
    return vec / norm if norm > 0 else vec


def _embedder(rt: ModelRuntime, *, rerank: bool = False) -> Embedder:
    if rt.embedder is None or (rerank and not rt.config.reranking):
        flag = "--reranking" if rerank else "--embedding"
        raise APIError(
            f"This server does not support {'reranking' if rerank else 'embeddings'}. Start it with `{flag}`",
            "not_supported_error",
        )
    return rt.embedder


def _counted(rt: ModelRuntime, embedder: Embedder, inputs: list[list[int]]) -> list[np.ndarray]:
    """Scheduler thread: embed, and count the work in /metrics as llama-server does: an
    embedding samples no token, but its prompt is processed and costs decodes."""
    stats = rt.engine.stats
    before, t0 = embedder.decodes, time.perf_counter()
    out = embedder.embed(inputs)
    stats.n_decode_total += embedder.decodes - before
    stats.prompt_tokens_total += sum(len(tokens) for tokens in inputs)
    stats.prompt_seconds_total += time.perf_counter() - t0
    return out


MEDIA_PARTS = ("image_url", "input_audio", "input_video", "video_url")


def _content_text(content: Any, marker: str | None) -> str:
    """OpenAI content parts ({"content": [{"type": "text", ...}]}) as one text, as llama-server
    joins them, each media part a media marker (``marker`` None: no projector, media refused)."""
    if not isinstance(content, list):
        raise APIError('"content" must be an array')
    text = ""
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text", ""), str):
            text += part.get("text", "")
        elif kind in MEDIA_PARTS:
            if marker is None:
                raise APIError(f"{kind}: this model does not support multimodal input (start it with --mmproj)")
            text += marker
        else:
            raise APIError(f"content: unsupported part type {kind!r}")
    return text


async def _media_entry_tokens(rt: ModelRuntime, item: dict[str, Any], where: str) -> list[int]:
    """An input with media: loaded, encoded by the projector, and tokenized with its text as
    llama-server does (special tokens parsed, as mtmd's tokenizer always does)."""
    assert rt.media is not None
    if "multimodal_data" in item:
        return await media.prompt_object_tokens(rt, item)
    content = item["content"]
    prompt = _content_text(content, rt.media.marker)
    refs = media.content_media(content, f"{where}.content")
    blobs = await media.load_all(rt, refs)
    return await media.tokenize(rt, prompt, blobs, refs, add_special=True)


def _has_media(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    if "multimodal_data" in item:
        return True
    content = item.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in MEDIA_PARTS for p in content)


def _entry_tokens(rt: ModelRuntime, item: Any) -> list[int]:
    # Text is embedded as written: special-token text is not parsed into control tokens.
    if isinstance(item, str):
        return rt.model.tokenize(item, add_special=True, parse_special=False)
    if isinstance(item, dict) and "content" in item:
        return rt.model.tokenize(_content_text(item["content"], None), add_special=True, parse_special=False)
    # token ids, a mix of ids and text, or a prompt_string object: the completion forms
    return prompt_tokens(rt.model, item)


async def _inputs(rt: ModelRuntime, raw: Any) -> list[list[int]]:
    """llama-server's prompt shapes (text, token ids, mixes, prompt_string objects, or a list of
    them) plus OpenAI content objects."""
    if isinstance(raw, list) and not any(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        items: list[Any] = raw
    elif isinstance(raw, (str, list, dict)):
        items = [raw]
    else:
        raise APIError("input: expected a string, token ids, an object, or a list of those")
    if not items:
        raise APIError('"input" must not be empty')
    if len(items) > MAX_INPUTS:
        raise APIError(f"input: at most {MAX_INPUTS} items")
    out = []
    for i, item in enumerate(items):
        if rt.media is not None and _has_media(item):
            tokens = await _media_entry_tokens(rt, item, f"input.{i}")
        else:
            tokens = _entry_tokens(rt, item)
        if not tokens:
            raise APIError("Input content cannot be empty")
        out.append(tokens)
    return out


async def _embed(rt: ModelRuntime, inputs: list[list[int]]) -> list[np.ndarray]:
    embedder = _embedder(rt)
    try:
        for tokens in inputs:
            embedder.check(tokens)
        return await rt.engine.call(lambda: _counted(rt, embedder, inputs))
    except EmbedError as exc:
        raise APIError(str(exc)) from None


def _floats(vec: np.ndarray) -> list[float]:
    """float32 values with the digits float32 has (9 significant), not float64's 17:
    the JSON is about half the size and parses that much faster on the client."""
    return [float(f"{x:.9g}") for x in vec.tolist()]


def _usage(inputs: list[list[int]]) -> dict[str, int]:
    n = sum(len(t) for t in inputs)
    return {"prompt_tokens": n, "total_tokens": n}


def _normalize_mode(rt: ModelRuntime, asked: int | None) -> int:
    """A request's embd_normalize, else the server's --embd-normalize (llama-server's rule)."""
    return rt.config.embd_normalize if asked is None else asked


async def openai_embeddings(rt: ModelRuntime, req: EmbeddingRequest) -> dict[str, Any]:
    if not _embedder(rt).pooled:
        raise APIError("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    if req.dimensions is not None and req.dimensions != rt.info.n_embd:
        # Shortening is only meaningful for models trained for it (Matryoshka); refuse rather
        # than hand back a vector that is not what the client asked for.
        raise APIError(f"dimensions: this model's embeddings have {rt.info.n_embd} dimensions and cannot be shortened")
    inputs = await _inputs(rt, req.input)
    vectors = await _embed(rt, inputs)
    data = []
    mode = _normalize_mode(rt, req.embd_normalize)
    for i, vec in enumerate(vectors):
        unit = normalize(vec, mode)
        if req.encoding_format == "base64":
            value: Any = base64.b64encode(unit.astype("<f4").tobytes()).decode()
        else:
            value = _floats(unit)
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": req.model or rt.alias, "usage": _usage(inputs)}


async def native_embeddings(rt: ModelRuntime, req: NativeEmbeddingRequest) -> list[dict[str, Any]]:
    raw = req.content if req.content is not None else req.input
    if raw is None:
        raise APIError("content: required")
    inputs = await _inputs(rt, raw)
    vectors = await _embed(rt, inputs)
    mode = _normalize_mode(rt, req.embd_normalize)
    out = []
    for i, vec in enumerate(vectors):
        if vec.ndim == 1:
            rows = [_floats(normalize(vec, mode))]
        else:
            rows = [_floats(normalize(row, mode)) for row in vec]
        out.append({"index": i, "embedding": rows})
    return out


def _pair_tokens(rt: ModelRuntime, query: str, doc: str) -> list[int]:
    """[CLS] query [SEP] doc [SEP]: the cross-encoder input llama.cpp's rerankers expect."""
    model = rt.model
    q = model.tokenize(query, add_special=True, parse_special=False)
    d = model.tokenize(doc, add_special=False, parse_special=False)
    sep = model.sep if model.sep >= 0 else model.eos
    return q + d + ([sep] if sep >= 0 else [])


async def rerank(rt: ModelRuntime, req: RerankRequest) -> tuple[bool, Any]:
    """(TEI form?, body). The TEI form (request with `texts`) answers a bare array."""
    embedder = _embedder(rt, rerank=True)
    documents = req.documents if req.documents is not None else req.texts
    if documents is None:
        raise APIError("documents: required")
    if not documents:
        raise APIError("documents: must not be empty")
    if len(documents) > MAX_INPUTS:
        raise APIError(f"documents: at most {MAX_INPUTS}")
    texts = [d if isinstance(d, str) else str(d.get("text", "")) for d in documents]
    inputs = [_pair_tokens(rt, req.query, t) for t in texts]
    try:
        for tokens in inputs:
            embedder.check(tokens)
        scores = await rt.engine.call(lambda: _counted(rt, embedder, inputs))
    except EmbedError as exc:
        raise APIError(str(exc)) from None
    ranked = sorted(((float(s[0]), i) for i, s in enumerate(scores)), key=lambda p: -p[0])
    top = ranked[: req.top_n] if req.top_n is not None else ranked
    if req.texts is not None and req.documents is None:
        return True, [{"index": i, "score": s, **({"text": texts[i]} if req.return_text else {})} for s, i in top]
    results = [
        {"index": i, "relevance_score": s, **({"document": {"text": texts[i]}} if req.return_text else {})}
        for s, i in top
    ]
    return False, {"model": req.model or rt.alias, "object": "list", "usage": _usage(inputs), "results": results}
