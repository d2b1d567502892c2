"""llama-server's native request models: /completion, /tokenize, /detokenize, /apply-template."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from llamaserve.protocol.common import SamplingFields
from llamaserve.protocol.openai import ChatMessage

# A prompt: text, token ids, a mix of both, an object with a prompt_string, or a list of
# such prompts. Strict: JSON true or 1.5 must not slip through as token 1.
PromptPiece = StrictStr | StrictInt
PromptObject = dict[str, Any]
Prompt = str | PromptObject | list[PromptPiece | list[PromptPiece] | PromptObject]


class NativeCompletionRequest(SamplingFields):
    prompt: Prompt = ""
    stream: bool = False
    stop: list[str] | str | None = None
    return_tokens: bool = False
    # `generation_settings/n_predict` style paths: the answer holds only these values.
    response_fields: list[str] | None = None


class InfillExtra(BaseModel):
    """A repository file for infill: `text` is required, `filename` optional (llama-server's rule)."""

    model_config = ConfigDict(extra="allow")

    filename: StrictStr = ""
    text: StrictStr


class InfillRequest(NativeCompletionRequest):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] = Field(default_factory=list, max_length=1024)
    prompt: str = ""  # text after the cursor hint, appended after FIM_MID


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
