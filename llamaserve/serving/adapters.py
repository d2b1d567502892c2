"""Helpers shared by the API adapters that run over the chat pipeline (Anthropic Messages,
OpenAI Responses): each builds an OpenAI chat request from its own and forwards the llama.cpp
knobs the client set."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ValidationError

from llamaserve.errors import APIError, validation_message
from llamaserve.families.chat.protocol import ChatCompletionRequest
from llamaserve.protocol.common import SamplingFields


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


def copy_set_fields(data: dict[str, Any], req: BaseModel, names: tuple[str, ...]) -> None:
    """The fields of req that the client set (not None) go into the chat request under the same name."""
    for name in names:
        value = getattr(req, name)
        if value is not None:
            data[name] = value


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"
