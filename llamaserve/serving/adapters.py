"""Helpers shared by the API adapters that run over the chat pipeline (Anthropic Messages,
OpenAI Responses): each builds an OpenAI chat request from its own and forwards the llama.cpp
knobs the client set."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ValidationError

from llamaserve.errors import APIError, validation_message
from llamaserve.protocol.common import SamplingFields
from llamaserve.protocol.openai import ChatCompletionRequest
from llamaserve.serving import chat
from llamaserve.serving.runtime import ModelRuntime


def forwarded_fields(req: BaseModel, own: set[str]) -> dict[str, Any]:
    """llama.cpp knobs and unknown extras the client set, minus the fields this API defines itself."""
    sampling = set(SamplingFields.model_fields)
    out = {k: v for k, v in req.model_dump(exclude_unset=True).items() if k in sampling and k not in own}
    for k, v in (req.model_extra or {}).items():
        if k not in own:
            out[k] = v
    return out


def build_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise APIError(validation_message(exc)) from None


def count_prompt_tokens(rt: ModelRuntime, req: ChatCompletionRequest) -> int:
    """The prompt a chat request would run, rendered and tokenized (no context-size check)."""
    return chat.count_prompt_tokens(rt, req)


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"
