"""OpenAI chat completions: messages → template → engine → chat JSON or chunks."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from llamaserve.api.errors import APIError
from llamaserve.api.sse import DONE, data_event
from llamaserve.chat.template import TemplateError
from llamaserve.engine.types import Finished, GenerationRequest, TextDelta
from llamaserve.protocol.openai import ChatCompletionRequest, ChatMessage
from llamaserve.serving import generate
from llamaserve.serving.completion import build_request
from llamaserve.serving.params import prompt_tokens
from llamaserve.serving.runtime import BUILD_INFO, ModelRuntime


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


def chat_request(rt: ModelRuntime, req: ChatCompletionRequest) -> GenerationRequest:
    if req.tools and req.tool_choice not in (None, "none", "auto"):
        raise APIError("tool_choice other than 'auto' and 'none' is not supported yet")
    if req.response_format and req.response_format.get("type") not in (None, "text"):
        raise APIError("response_format other than 'text' is not supported yet")
    prompt = render_prompt(rt, req.messages, tools=req.tools, template_kwargs=req.chat_template_kwargs)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    return build_request(rt, req, chat_tokens(rt, prompt), n_predict=limit, stop=req.stop)


def _envelope(rt: ModelRuntime, cid: str, created: int, obj: str) -> dict[str, Any]:
    return {"id": cid, "object": obj, "created": created, "model": rt.alias, "system_fingerprint": BUILD_INFO}


async def chat_complete(rt: ModelRuntime, job: GenerationRequest) -> dict[str, Any]:
    result = await generate.complete(rt.engine, job)
    fin = result.finished
    assert fin is not None
    body = _envelope(rt, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), "chat.completion")
    body["choices"] = [{
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "logprobs": None,
        "finish_reason": generate.finish_reason(fin),
    }]
    body["usage"] = generate.usage(fin)
    body["timings"] = fin.timings.to_json()
    return body


async def chat_stream(rt: ModelRuntime, req: ChatCompletionRequest,
                      events: AsyncIterator[TextDelta | Finished]) -> AsyncIterator[bytes]:
    envelope = _envelope(rt, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), "chat.completion.chunk")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    yield data_event({**envelope, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": None}, "logprobs": None, "finish_reason": None}]})
    async for event in events:
        if isinstance(event, TextDelta):
            if event.text:
                yield data_event({**envelope, "choices": [
                    {"index": 0, "delta": {"content": event.text}, "logprobs": None, "finish_reason": None}]})
        else:
            yield data_event({**envelope, "choices": [
                {"index": 0, "delta": {}, "logprobs": None, "finish_reason": generate.finish_reason(event)}],
                "timings": event.timings.to_json()})
            if include_usage:
                yield data_event({**envelope, "choices": [], "usage": generate.usage(event)})
    yield DONE
