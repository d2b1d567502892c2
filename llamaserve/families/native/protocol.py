"""Request bodies of llama-server's /tokenize, /detokenize and /apply-template."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from llamaserve.families.chat.protocol import ChatMessage


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    content: str = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    tokens: list[int] = Field(default_factory=list)


class ApplyTemplateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # False: the prompt ends after the last message, without the assistant header.
    add_generation_prompt: bool = True
