"""OpenAI Responses request model: /v1/responses.

Input items stay plain dicts: the adapter walks them in order (messages,
function calls and their outputs, reasoning) and names the item it cannot
honour. Unknown top-level fields are accepted and ignored (include,
truncation, user, …). `store` defaults to true, as in OpenAI's API.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llamaserve.protocol.common import SamplingFields

Item = dict[str, Any]


class ResponsesRequest(SamplingFields):
    model: str | None = None
    input: str | list[Item] = Field(...)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool = True
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    metadata: dict[str, Any] | None = None
