"""OpenAI Batch API request bodies: `POST /v1/batches`, and the routes a batch line may name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

# The routes a batch line may run, each through the app exactly as a live request would.
# /v1/embeddings answers only on a server started with --embedding; elsewhere such a line's
# answer is that route's own refusal, and it goes to the error file.
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOW = "24h"
COMPLETION_WINDOW_S = 24 * 3600
MAX_METADATA_PAIRS = 16  # OpenAI's metadata bounds
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # output_expires_after and anything newer: refused by name

    input_file_id: StrictStr
    endpoint: StrictStr
    completion_window: StrictStr
    metadata: dict[StrictStr, StrictStr] | None = Field(None, max_length=MAX_METADATA_PAIRS)

    @field_validator("endpoint")
    @classmethod
    def _known_endpoint(cls, value: str) -> str:
        if value not in BATCH_URLS:
            raise ValueError(f"'{value}' is not supported; use one of {', '.join(BATCH_URLS)}")
        return value

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        if value != COMPLETION_WINDOW:
            raise ValueError(f"only '{COMPLETION_WINDOW}' is supported")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, item in (value or {}).items():
            if len(key) > MAX_METADATA_KEY:
                raise ValueError(f"key '{key[:20]}...' is longer than {MAX_METADATA_KEY} characters")
            if len(item) > MAX_METADATA_VALUE:
                raise ValueError(f"the value of '{key}' is longer than {MAX_METADATA_VALUE} characters")
        return value


def metadata_of(req: BatchCreateRequest) -> dict[str, Any] | None:
    return dict(req.metadata) if req.metadata is not None else None
