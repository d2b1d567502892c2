"""OpenAI chat completions: messages → template → engine → chat JSON or chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from llamaserve.api.errors import APIError
from llamaserve.api.sse import DONE, data_event
from llamaserve.chat.template import TemplateError
from llamaserve.engine.types import Finished, GenerationRequest, TextDelta
from llamaserve.protocol.openai import ChatCompletionRequest, ChatMessage
from llamaserve.serving import generate, logprobs
from llamaserve.serving.completion import build_request, choices
from llamaserve.serving.params import prompt_tokens
from llamaserve.serving.runtime import BUILD_INFO, ModelRuntime
from llamaserve.serving.structured import resolve_grammar


def render_prompt(rt: ModelRuntime, messages: list[ChatMessage], *, tools: list[dict[str, Any]] | None,
                  template_kwargs: dict[str, Any] | None) -> str:
    """The model's own chat template applied to the conversation."""
    kwargs = {**rt.chat_template_kwargs, **(template_kwargs or {})}
    # These are ours to set; a client's copy would collide with the arguments below.
    for reserved in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"):
        kwargs.pop(reserved, None)
    dicts = [m.model_dump(exclude_none=True) for m in messages]
    for d, m in zip(dicts, messages):
        if m.content is None and "content" not in d:
            d["content"] = None
    try:
        return rt.template.render(dicts, add_generation_prompt=True, tools=tools or None, **kwargs)
    except TemplateError as exc:
        raise APIError(str(exc)) from exc


def chat_tokens(rt: ModelRuntime, prompt: str) -> list[int]:
    # Templates usually write the BOS token themselves; adding another would
    # change the prompt the model was trained on.
    bos = rt.model.token_text(rt.model.bos) if rt.model.bos >= 0 else ""
    add_special = not (bos and prompt.startswith(bos))
    return prompt_tokens(rt.model, prompt, add_special=add_special)


async def chat_request(rt: ModelRuntime, req: ChatCompletionRequest) -> list[GenerationRequest]:
    """The n choices of one chat request, ready for the engine."""
    if req.tools and req.tool_choice not in (None, "none", "auto"):
        raise APIError("tool_choice other than 'auto' and 'none' is not supported yet")
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs requires logprobs: true")
    grammar = await resolve_grammar(rt.model, grammar=req.grammar, json_schema=req.json_schema,
                                    response_format=req.response_format)
    prompt = render_prompt(rt, req.messages, tools=req.tools, template_kwargs=req.chat_template_kwargs)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    n_probs = (req.top_logprobs or 0) if req.logprobs else (req.n_probs if req.n_probs else -1)
    job = build_request(rt, req, chat_tokens(rt, prompt), n_predict=limit, stop=req.stop, grammar=grammar,
                        n_probs=n_probs)
    return choices(rt, job, req.n)


def _envelope(rt: ModelRuntime, obj: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": rt.alias,
            "system_fingerprint": BUILD_INFO}


def _logprobs(rt: ModelRuntime, job: GenerationRequest, items: list[Any]) -> dict[str, Any] | None:
    return {"content": logprobs.openai_chat(rt.model, items)} if job.n_probs >= 0 else None


async def chat_complete(rt: ModelRuntime, jobs: list[GenerationRequest]) -> dict[str, Any]:
    results = await generate.complete(rt.engine, jobs)
    body = _envelope(rt, "chat.completion")
    body["choices"] = [{
        "index": i,
        "message": {"role": "assistant", "content": r.text},
        "logprobs": _logprobs(rt, job, r.logprobs),
        "finish_reason": generate.finish_reason(r.done),
    } for i, (job, r) in enumerate(zip(jobs, results))]
    body["usage"] = generate.usage([r.done for r in results])
    body["timings"] = results[0].done.timings.to_json()
    return body


@dataclass
class ChatChunk:
    """One step of a streamed chat answer, in OpenAI's delta vocabulary.

    delta keys: role, content, reasoning_content, tool_calls (OpenAI's shape).
    The final chunk of a choice has finish_reason and timings; after all
    choices finish, one chunk with usage and index -1 closes the stream.
    Other API families (Anthropic Messages, Responses) re-shape these.
    """

    index: int
    delta: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None


async def chat_chunks(rt: ModelRuntime, jobs: list[GenerationRequest],
                      events: AsyncIterator[tuple[int, TextDelta | Finished]]) -> AsyncIterator[ChatChunk]:
    for i in range(len(jobs)):
        yield ChatChunk(i, {"role": "assistant", "content": None})
    finished: dict[int, Finished] = {}
    async for index, event in events:
        if isinstance(event, TextDelta):
            if event.text or event.logprobs:
                yield ChatChunk(index, {"content": event.text}, _logprobs(rt, jobs[index], event.logprobs))
        else:
            finished[index] = event
            yield ChatChunk(index, {}, None, generate.finish_reason(event), event.timings.to_json())
    if finished:
        yield ChatChunk(-1, usage=generate.usage([finished[i] for i in sorted(finished)]))


async def chat_stream(rt: ModelRuntime, req: ChatCompletionRequest, jobs: list[GenerationRequest],
                      events: AsyncIterator[tuple[int, TextDelta | Finished]]) -> AsyncIterator[bytes]:
    envelope = _envelope(rt, "chat.completion.chunk")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    async for chunk in chat_chunks(rt, jobs, events):
        if chunk.index < 0:
            if include_usage:
                yield data_event({**envelope, "choices": [], "usage": chunk.usage})
            continue
        body = {**envelope, "choices": [{"index": chunk.index, "delta": chunk.delta, "logprobs": chunk.logprobs,
                                         "finish_reason": chunk.finish_reason}]}
        if chunk.timings is not None:
            body["timings"] = chunk.timings
        yield data_event(body)
    yield DONE
