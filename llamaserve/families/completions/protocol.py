"""Text completion request models: llama-server's /completion and /infill, OpenAI's /v1/completions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from llamaserve.families.chat.protocol import StreamOptions
from llamaserve.protocol.common import LazyGrammarFields, SamplingFields

# A prompt: text, token ids, a mix of both, an object with a prompt_string, or a list of
# such prompts. Strict: JSON true or 1.5 must not slip through as token 1.
PromptPiece = StrictStr | StrictInt
PromptObject = dict[str, Any]
Prompt = str | PromptObject | list[PromptPiece | list[PromptPiece] | PromptObject]


class NativeCompletionRequest(SamplingFields, LazyGrammarFields):
    prompt: Prompt = ""
    stream: bool = False
    stop: list[str] | str | None = None
    return_tokens: bool = False
    # `generation_settings/n_predict` style paths: the answer holds only these values.
    response_fields: list[str] | None = None
    # llama-server's aliases on its native routes: n_predict, then max_completion_tokens, then
    # max_tokens; n_probs, then logprobs; n_cmpl, then n.
    max_completion_tokens: int | None = Field(None, ge=-1)
    max_tokens: int | None = Field(None, ge=-1)
    logprobs: int | None = Field(None, ge=0, le=100)
    n_cmpl: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)

    def alias_limit(self) -> int | None:
        """max_completion_tokens, else max_tokens: the route's limit, which `build_request` takes
        when the body has no n_predict; None: neither."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def top_probs(self) -> int:
        """n_probs (or logprobs): how many top probabilities each token reports; -1: none."""
        n_probs = self.n_probs if self.n_probs is not None else self.logprobs
        return n_probs if n_probs else -1


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


class CompletionRequest(SamplingFields, LazyGrammarFields):
    model: str | None = None
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] = ""
    max_tokens: int | None = Field(16, ge=-1)
    n: int = Field(1, ge=1, le=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    suffix: str | None = None
