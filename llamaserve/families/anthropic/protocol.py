"""Anthropic Messages request models: /v1/messages and /v1/messages/count_tokens.

Lenient on purpose: unknown fields are accepted and ignored (clients such as
Claude Code add fields between releases), and content blocks stay plain dicts
so a replayed or new block type reaches the adapter, which decides whether it
can be honoured and says so clearly when it cannot.

The requests inherit llama.cpp's sampling fields, as llama-server accepts its
native knobs (min_p, repeat_penalty, …) on every generating route.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llamaserve.protocol.common import SamplingFields

Block = dict[str, Any]


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[Block]

    @field_validator("content")
    @classmethod
    def _blocks_have_types(cls, v: str | list[Block]) -> str | list[Block]:
        if isinstance(v, list):
            for i, block in enumerate(v):
                if not isinstance(block.get("type"), str):
                    raise ValueError(f"content block {i} needs a string 'type'")
        return v


class AnthropicTool(BaseModel):
    """A client tool. Server tools (web_search_…, bash_…) carry a `type` and are refused later."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(..., min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str  # enabled, disabled, adaptive, between_tools, …: anything but "disabled" turns reasoning on
    budget_tokens: int | None = Field(None, ge=0)


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    effort: str | None = None
    format: dict[str, Any] | None = None  # {"type": "json_schema", "schema": {...}}


class CountTokensRequest(SamplingFields):
    """Everything that shapes the prompt; max_tokens is optional here."""

    model: str | None = None
    messages: list[AnthropicMessage] = Field(..., min_length=1)
    system: str | list[Block] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=16)
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stream: bool = False


class MessagesRequest(CountTokensRequest):
    # Required by the Anthropic API; a request without it is a 400 naming the field.
    max_tokens: int = Field(..., ge=1)
