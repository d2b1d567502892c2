"""Text completion: native /completion and OpenAI /v1/completions."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from llamaserve.api.errors import APIError
from llamaserve.api.sse import DONE, data_event
from llamaserve.engine.types import Finished, GenerationRequest, TextDelta
from llamaserve.protocol.native import NativeCompletionRequest
from llamaserve.protocol.openai import CompletionRequest
from llamaserve.protocol.common import SamplingFields
from llamaserve.serving import generate
from llamaserve.serving.params import prompt_tokens, sampling_config, split_prompts, stop_strings
from llamaserve.serving.runtime import BUILD_INFO, ModelRuntime


def build_request(rt: ModelRuntime, req: SamplingFields, tokens: list[int], *, n_predict: int | None,
                  stop: str | list[str] | None) -> GenerationRequest:
    """Engine request from the shared fields; checks the prompt fits a slot."""
    if not tokens:
        raise APIError("the prompt is empty")
    if len(tokens) >= rt.n_ctx_slot:
        raise APIError(
            f"the request exceeds the available context size ({len(tokens)} tokens, context is "
            f"{rt.n_ctx_slot}); try increasing it", "exceed_context_size_error",
            extra={"n_prompt_tokens": len(tokens), "n_ctx": rt.n_ctx_slot})
    if req.id_slot is not None and req.id_slot >= len(rt.scheduler.slots):
        raise APIError(f"id_slot: there is no slot {req.id_slot}")
    limit = n_predict if n_predict is not None else req.n_predict
    if limit is None:
        limit = rt.config.n_predict
    return GenerationRequest(
        prompt_tokens=tokens,
        sampling=sampling_config(req, rt.config.sampling, rt.model),
        n_predict=limit,
        stop=stop_strings(stop),
        cache_prompt=rt.config.cache_prompt if req.cache_prompt is None else req.cache_prompt,
        id_slot=-1 if req.id_slot is None else req.id_slot,
        t_max_predict_ms=req.t_max_predict_ms or 0,
        n_keep=req.n_keep or 0,
    )


def generation_settings(rt: ModelRuntime, request: GenerationRequest) -> dict[str, Any]:
    s = asdict(request.sampling)
    s.pop("logit_bias", None)
    s.pop("grammar", None)
    s["samplers"] = list(s["samplers"])
    s["dry_sequence_breakers"] = list(s["dry_sequence_breakers"])
    s.update({"n_predict": request.n_predict, "max_tokens": request.n_predict, "n_keep": request.n_keep,
              "stop": list(request.stop), "n_ctx": rt.n_ctx_slot, "model": rt.alias,
              "cache_prompt": request.cache_prompt})
    return s


# ------------------------------------------------------------------- native
def _native_final(rt: ModelRuntime, request: GenerationRequest, index: int, text: str,
                  tokens: list[int], fin: Finished, prompt: str, return_tokens: bool) -> dict[str, Any]:
    return {
        "index": index,
        "content": text,
        "tokens": tokens if return_tokens else [],
        "id_slot": fin.id_slot,
        "stop": True,
        "model": rt.alias,
        "tokens_predicted": fin.n_predicted,
        "tokens_evaluated": fin.n_prompt_tokens,
        "generation_settings": generation_settings(rt, request),
        "prompt": prompt,
        "has_new_line": "\n" in text,
        "truncated": fin.truncated,
        "stop_type": fin.stop_type if fin.stop_type != "abort" else "none",
        "stopping_word": fin.stopping_word,
        "tokens_cached": fin.n_prompt_tokens + fin.n_predicted,
        "timings": fin.timings.to_json(),
    }


def native_requests(rt: ModelRuntime, req: NativeCompletionRequest) -> list[tuple[GenerationRequest, str]]:
    out = []
    for prompt in split_prompts(req.prompt):
        tokens = prompt_tokens(rt.model, prompt)
        text = prompt if isinstance(prompt, str) else rt.model.detokenize(tokens, special=True)
        out.append((build_request(rt, req, tokens, n_predict=None, stop=req.stop), text))
    return out


async def native_complete(rt: ModelRuntime, req: NativeCompletionRequest,
                          jobs: list[tuple[GenerationRequest, str]]) -> dict[str, Any] | list[dict[str, Any]]:
    import asyncio

    results = await asyncio.gather(*(generate.complete(rt.engine, job) for job, _ in jobs))
    bodies = [
        _native_final(rt, job, i, res.text, res.tokens, res.finished, text, req.return_tokens)  # type: ignore[arg-type]
        for i, ((job, text), res) in enumerate(zip(jobs, results))
    ]
    return bodies[0] if len(bodies) == 1 else bodies


async def native_stream(rt: ModelRuntime, req: NativeCompletionRequest, job: GenerationRequest, prompt: str,
                        events: AsyncIterator[TextDelta | Finished]) -> AsyncIterator[bytes]:
    parts: list[str] = []
    n = 0
    async for event in events:
        if isinstance(event, TextDelta):
            parts.append(event.text)
            n += len(event.tokens)
            yield data_event({"index": 0, "content": event.text, "tokens": event.tokens, "stop": False,
                              "id_slot": -1, "tokens_predicted": n,
                              "tokens_evaluated": len(job.prompt_tokens)})
        else:
            yield data_event(_native_final(rt, job, 0, "", [], event, prompt, req.return_tokens))


# ------------------------------------------------------------------- OpenAI
def oai_requests(rt: ModelRuntime, req: CompletionRequest) -> list[GenerationRequest]:
    if req.echo:
        raise APIError("echo is not supported yet")
    jobs = []
    for prompt in split_prompts(req.prompt):
        tokens = prompt_tokens(rt.model, prompt)
        jobs.append(build_request(rt, req, tokens, n_predict=req.max_tokens, stop=req.stop))
    return jobs


def _oai_envelope(rt: ModelRuntime, cid: str, created: int) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created, "model": rt.alias,
            "system_fingerprint": BUILD_INFO}


async def oai_complete(rt: ModelRuntime, jobs: list[GenerationRequest]) -> dict[str, Any]:
    import asyncio

    results = await asyncio.gather(*(generate.complete(rt.engine, job) for job in jobs))
    body = _oai_envelope(rt, f"cmpl-{uuid.uuid4().hex}", int(time.time()))
    body["choices"] = [
        {"text": r.text, "index": i, "logprobs": None, "finish_reason": generate.finish_reason(r.finished)}  # type: ignore[arg-type]
        for i, r in enumerate(results)
    ]
    total = {"completion_tokens": 0, "prompt_tokens": 0, "total_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}}
    for r in results:
        u = generate.usage(r.finished)  # type: ignore[arg-type]
        for k in ("completion_tokens", "prompt_tokens", "total_tokens"):
            total[k] += u[k]  # type: ignore[operator]
        total["prompt_tokens_details"]["cached_tokens"] += r.finished.n_cached  # type: ignore[union-attr,index]
    body["usage"] = total
    body["timings"] = results[0].finished.timings.to_json()  # type: ignore[union-attr]
    return body


async def oai_stream(rt: ModelRuntime, req: CompletionRequest,
                     events: AsyncIterator[TextDelta | Finished]) -> AsyncIterator[bytes]:
    envelope = _oai_envelope(rt, f"cmpl-{uuid.uuid4().hex}", int(time.time()))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    async for event in events:
        if isinstance(event, TextDelta):
            yield data_event({**envelope, "choices": [
                {"text": event.text, "index": 0, "logprobs": None, "finish_reason": None}]})
        else:
            yield data_event({**envelope, "choices": [
                {"text": "", "index": 0, "logprobs": None, "finish_reason": generate.finish_reason(event)}],
                "timings": event.timings.to_json()})
            if include_usage:
                yield data_event({**envelope, "choices": [], "usage": generate.usage(event)})
    yield DONE
