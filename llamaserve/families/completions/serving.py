"""Text completion: native /completion and OpenAI /v1/completions."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from typing import Any

from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.types import Finished, GenerationRequest, TextDelta
from llamaserve.errors import APIError
from llamaserve.families.completions.protocol import CompletionRequest, InfillRequest, NativeCompletionRequest
from llamaserve.serving import generate, logprobs, media
from llamaserve.serving.generate import progress_fields
from llamaserve.serving.info import spec_types
from llamaserve.serving.jobs import build_request, choices
from llamaserve.serving.lazy_grammar import lazy_grammar, settings_fields
from llamaserve.serving.params import prompt_tokens, split_prompts
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.serving.structured import resolve_grammar
from llamaserve.sse import DONE, data_event


def _logit_bias_json(rt: ModelRuntime, sampling: SamplingParams) -> list[dict[str, Any]]:
    """llama-server's list of {bias, token}, with the end-of-generation bans ignore_eos adds;
    a ban (-inf) is JSON null, as llama-server writes it."""
    biases = list(sampling.logit_bias)
    if sampling.ignore_eos:
        biases += [(t, -math.inf) for t in rt.model.eog_tokens()]
    return [{"bias": None if math.isinf(b) else b, "token": t} for t, b in biases]


def generation_settings(rt: ModelRuntime, request: GenerationRequest) -> dict[str, Any]:
    s = asdict(request.sampling)
    s["logit_bias"] = _logit_bias_json(rt, request.sampling)
    s["grammar"] = s.get("grammar") or ""
    for name in ("grammar_triggers", "grammar_trigger_tokens"):
        s.pop(name, None)
    s.update(settings_fields(rt.model, request))
    s["samplers"] = list(s["samplers"])
    s["dry_sequence_breakers"] = list(s["dry_sequence_breakers"])
    s.update(
        {
            "n_predict": request.n_predict,
            "max_tokens": request.n_predict,
            "n_keep": request.n_keep,
            "n_indent": request.n_indent,
            "n_discard": request.n_discard,
            "stop": list(request.stop),
            "n_ctx": rt.n_ctx_slot,
            "model": rt.alias,
            "cache_prompt": request.cache_prompt,
            "n_probs": max(request.n_probs, 0),
            "speculative.types": spec_types(rt),
        }
    )
    return s


# ------------------------------------------------------------------- native
# One prompt of a native request: its n_cmpl completions (the prompt is decoded once) and
# the prompt as text.
NativeJob = tuple[list[GenerationRequest], str]


def native_choices(rt: ModelRuntime, req: NativeCompletionRequest, job: GenerationRequest) -> list[GenerationRequest]:
    """n_cmpl (or n) completions of one prompt, as llama-server's child tasks."""
    return choices(rt, job, req.n_cmpl if req.n_cmpl is not None else req.n or 1, field="n_cmpl")


async def native_requests(rt: ModelRuntime, req: NativeCompletionRequest) -> list[NativeJob]:
    grammar = await resolve_grammar(rt.model, grammar=req.grammar, json_schema=req.json_schema)
    n_probs, limit = req.top_probs(), req.alias_limit()
    lazy = lazy_grammar(rt.model, req)
    out = []
    for prompt in split_prompts(req.prompt):
        if isinstance(prompt, dict) and "multimodal_data" in prompt and rt.media is not None:
            tokens = await media.prompt_object_tokens(rt, prompt)
            text = str(prompt.get("prompt_string", ""))
        else:
            tokens = prompt_tokens(rt.model, prompt)
            text = prompt if isinstance(prompt, str) else rt.model.detokenize(tokens, special=True)
        job = build_request(rt, req, tokens, n_predict=limit, stop=req.stop, grammar=grammar, n_probs=n_probs)
        out.append((native_choices(rt, req, lazy.apply(job)), text))
    return out


async def infill_request(rt: ModelRuntime, req: InfillRequest) -> NativeJob:
    """Fill-in-the-middle with the model's FIM tokens (Qwen2.5-Coder / StarCoder layout).

    Repository files from input_extra come first, each opened by FIM_SEP (or
    FIM_REP for the first when the model has it) and its file name; then
    FIM_PRE prefix FIM_SUF suffix FIM_MID, then `prompt` (with --spm-infill
    FIM_SUF suffix FIM_PRE prefix FIM_MID).
    """
    fim = rt.model.fim_tokens()
    if min(fim["pre"], fim["suf"], fim["mid"]) < 0:
        raise APIError("the model has no fill-in-the-middle tokens (FIM_PRE, FIM_SUF, FIM_MID)")
    model = rt.model

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False)

    tokens: list[int] = []
    if req.input_extra:
        if fim["rep"] >= 0:
            tokens += [fim["rep"]] + tok("project\n")
        for chunk in req.input_extra:
            tokens += ([fim["sep"]] if fim["sep"] >= 0 else []) + tok(f"{chunk.filename}\n{chunk.text}")
        if fim["sep"] >= 0:
            tokens += [fim["sep"]] + tok("current\n")
    prefix = [fim["pre"]] + tok(req.input_prefix)
    suffix = [fim["suf"]] + tok(req.input_suffix)
    # --spm-infill: suffix first (Suffix/Prefix/Middle), the order some models were trained on.
    tokens += suffix + prefix if rt.config.spm_infill else prefix + suffix
    tokens += [fim["mid"]] + tok(req.prompt)
    grammar = await resolve_grammar(rt.model, grammar=req.grammar, json_schema=req.json_schema)
    job = build_request(
        rt, req, tokens, n_predict=req.alias_limit(), stop=req.stop, grammar=grammar, n_probs=req.top_probs()
    )
    return native_choices(rt, req, lazy_grammar(model, req).apply(job)), model.detokenize(tokens, special=True)


def _native_final(
    rt: ModelRuntime, job: GenerationRequest, index: int, result: generate.Completion, prompt: str, return_tokens: bool
) -> dict[str, Any]:
    fin = result.done
    body: dict[str, Any] = {
        "index": index,
        "content": result.text,
        "tokens": result.tokens if return_tokens else [],
        "id_slot": fin.id_slot,
        "stop": True,
        "model": rt.alias,
        "tokens_predicted": fin.n_predicted,
        "tokens_evaluated": fin.n_prompt_tokens,
        "generation_settings": generation_settings(rt, job),
        "prompt": prompt,
        "has_new_line": "\n" in result.text,
        "truncated": fin.truncated,
        "stop_type": fin.stop_type if fin.stop_type != "abort" else "none",
        "stopping_word": fin.stopping_word,
        "tokens_cached": fin.n_prompt_tokens + fin.n_predicted,
        "timings": fin.timings.to_json(),
    }
    if job.n_probs >= 0:
        body["completion_probabilities"] = logprobs.native(
            rt.model, result.logprobs, post=job.post_sampling_probs, special=rt.config.special
        )
    return body


def pick_fields(body: dict[str, Any], paths: list[str] | None) -> dict[str, Any]:
    """llama-server's response_fields: only the values at these `a/b` paths, keyed by the path;
    a path that leads nowhere is left out."""
    if not paths:
        return body
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def verbose_body(rt: ModelRuntime, job: GenerationRequest, result: generate.Completion) -> dict[str, Any]:
    """The native answer of one choice, for `__verbose`: the prompt as the model saw it."""
    prompt = rt.model.detokenize(job.prompt_tokens, special=True)
    return _native_final(rt, job, 0, result, prompt, False)


async def native_complete(
    rt: ModelRuntime, req: NativeCompletionRequest, jobs: list[NativeJob]
) -> dict[str, Any] | list[dict[str, Any]]:
    """One answer, or a list of them numbered prompt by prompt and completion by completion."""
    results = await asyncio.gather(*(generate.complete(rt.engine, group) for group, _ in jobs))
    bodies: list[dict[str, Any]] = []
    for (group, text), completions in zip(jobs, results):
        for job, result in zip(group, completions):
            final = _native_final(rt, job, len(bodies), result, text, req.return_tokens)
            bodies.append(pick_fields(final, req.response_fields))
    return bodies[0] if len(bodies) == 1 else bodies


async def native_stream(
    rt: ModelRuntime,
    req: NativeCompletionRequest,
    jobs: list[GenerationRequest],
    prompt: str,
    events: AsyncIterator[tuple[int, TextDelta | Finished]],
) -> AsyncIterator[bytes]:
    """One prompt's n_cmpl completions, each chunk tagged with its completion's index."""
    predicted = [0] * len(jobs)
    async for index, event in events:
        job = jobs[index]
        if isinstance(event, TextDelta):
            predicted[index] += len(event.tokens)
            chunk: dict[str, Any] = {
                "index": index,
                "content": event.text,
                "tokens": event.tokens,
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": predicted[index],
                "tokens_evaluated": len(job.prompt_tokens),
                **progress_fields(event),
            }
            if job.n_probs >= 0 and event.progress is None:
                chunk["completion_probabilities"] = logprobs.native(
                    rt.model, event.logprobs, post=job.post_sampling_probs, special=rt.config.special
                )
            yield data_event(chunk)
        else:
            final = _native_final(rt, job, index, generate.Completion(finished=event), prompt, req.return_tokens)
            yield data_event(pick_fields(final, req.response_fields))


# ------------------------------------------------------------------- OpenAI
async def oai_requests(rt: ModelRuntime, req: CompletionRequest) -> list[list[GenerationRequest]]:
    """One list of n choices per prompt."""
    if req.echo and req.stream:
        raise APIError("echo is not supported with stream")
    if req.suffix:
        raise APIError("suffix is not supported on /v1/completions; use /infill")
    grammar = await resolve_grammar(
        rt.model, grammar=req.grammar, json_schema=req.json_schema, response_format=req.response_format
    )
    n_probs = req.logprobs if req.logprobs is not None else -1
    prompts = split_prompts(req.prompt)
    if len(prompts) * req.n > rt.engine.n_slots and req.n > 1:
        raise APIError(f"n: at most {rt.engine.n_slots} choices in all (the number of slots)")
    lazy = lazy_grammar(rt.model, req)
    groups = []
    for prompt in prompts:
        tokens = prompt_tokens(rt.model, prompt)
        job = build_request(rt, req, tokens, n_predict=req.max_tokens, stop=req.stop, grammar=grammar, n_probs=n_probs)
        job = lazy.apply(job)
        if req.echo:
            # Evaluation harnesses score prompts this way: echo + logprobs (often max_tokens 0).
            job = replace(job, prompt_logprobs=n_probs >= 0, echo_text=rt.model.detokenize(tokens, special=True))
        groups.append(choices(rt, job, req.n))
    return groups


def _oai_envelope(rt: ModelRuntime) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": rt.alias,
        "system_fingerprint": rt.build_info,
    }


def _legacy_logprobs(rt: ModelRuntime, job: GenerationRequest, result: generate.Completion) -> Any:
    if job.n_probs < 0:
        return None
    if job.prompt_logprobs:
        scored: list[Any] = [job.prompt_tokens[0], *result.done.prompt_logprobs, *result.logprobs]
        return logprobs.legacy(rt.model, scored, special=rt.config.special)
    return logprobs.legacy(rt.model, result.logprobs, special=rt.config.special)


async def oai_complete(
    rt: ModelRuntime, groups: list[list[GenerationRequest]], *, verbose: bool = False
) -> dict[str, Any]:
    results = await asyncio.gather(*(generate.complete(rt.engine, group) for group in groups))
    body = _oai_envelope(rt)
    body["choices"] = []
    finished = []
    for group, res in zip(groups, results):
        for job, r in zip(group, res):
            body["choices"].append(
                {
                    "text": job.echo_text + r.text,
                    "index": len(body["choices"]),
                    "logprobs": _legacy_logprobs(rt, job, r),
                    "finish_reason": generate.finish_reason(r.done),
                }
            )
        finished.append([r.done for r in res])
    usages = [generate.usage(f) for f in finished]
    body["usage"] = {
        "completion_tokens": sum(u["completion_tokens"] for u in usages),
        "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
        "total_tokens": sum(u["total_tokens"] for u in usages),
        "prompt_tokens_details": {"cached_tokens": sum(f[0].n_cached for f in finished)},
    }
    if verbose:
        body["__verbose"] = verbose_body(rt, groups[0][0], results[0][0])
    body["timings"] = finished[0][0].timings.to_json()
    return body


async def oai_stream(
    rt: ModelRuntime,
    req: CompletionRequest,
    group: list[GenerationRequest],
    events: AsyncIterator[tuple[int, TextDelta | Finished]],
) -> AsyncIterator[bytes]:
    envelope = _oai_envelope(rt)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    finished: dict[int, Finished] = {}
    offsets = [0] * len(group)
    async for index, event in events:
        if isinstance(event, TextDelta):
            lp = (
                logprobs.legacy(rt.model, event.logprobs, offsets[index], special=rt.config.special)
                if group[index].n_probs >= 0
                else None
            )
            offsets[index] += len(event.text)
            yield data_event(
                {**envelope, "choices": [{"text": event.text, "index": index, "logprobs": lp, "finish_reason": None}]}
            )
        else:
            finished[index] = event
            yield data_event(
                {
                    **envelope,
                    "choices": [
                        {"text": "", "index": index, "logprobs": None, "finish_reason": generate.finish_reason(event)}
                    ],
                    "timings": event.timings.to_json(),
                }
            )
    if include_usage and finished:
        yield data_event({**envelope, "choices": [], "usage": generate.usage([finished[i] for i in sorted(finished)])})
    yield DONE
