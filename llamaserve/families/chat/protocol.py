"""OpenAI chat request models: /v1/chat/completions (and what audio transcriptions and the
Anthropic and Responses adapters turn their requests into)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llamaserve.protocol.common import SamplingFields

Role = Literal["system", "user", "assistant", "tool", "developer", "function"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=-1)
    max_completion_tokens: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    reasoning_format: str | None = None
    # llama-server's per-request --reasoning-budget (-1: unrestricted); Anthropic's
    # thinking.budget_tokens arrives here too.
    reasoning_budget_tokens: int | None = Field(None, ge=-1)
    # vLLM/transformers' explicit prefill: True, "content" or "reasoning_content" continue the
    # final message; refused together with add_generation_prompt: true.
    add_generation_prompt: bool | None = None
    continue_final_message: bool | str | None = None
    # llama-server's reasoning control: arm the running answer so that
    # POST /v1/chat/completions/control {"action": "reasoning_end"} can close its reasoning.
    reasoning_control: bool = False
    # The text the template put after the conversation for the answer to continue (llama-server:
    # "prepended to model output before parsing"); set, it replaces the rendered one where the
    # answer's parse and reasoning budget look: whether the answer starts inside a reasoning block.
    generation_prompt: str | None = None
    # false: the tools still shape the answer (template, grammar) but no tool call is parsed out
    # of it; the raw text is the content.
    parse_tool_calls: bool = True

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return v


class ChatControlRequest(BaseModel):
    """`POST /v1/chat/completions/control` (families/chat/control.py)."""

    model_config = ConfigDict(extra="allow")

    id: str = ""  # the running answer's `chatcmpl-…` id; empty is llama-server's 400
    action: str = ""  # only "reasoning_end"
    model: str | None = None  # names the model for a router; a single-model server ignores it
