"""Request models for embeddings and reranking."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    # Text, token ids, a mix, a {"prompt_string"} or {"content": [parts]} object, or a list of
    # those: checked in families/embeddings/serving.py, which knows every shape llama-server accepts.
    input: str | dict[str, Any] | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    # llama-server reads it on the OpenAI route too; None: --embd-normalize (default 2, Euclidean).
    embd_normalize: int | None = Field(None, ge=-1, le=100)


class NativeEmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    content: str | list[Any] | None = None
    input: str | list[Any] | None = None
    embd_normalize: int | None = Field(None, ge=-1, le=100)  # None: --embd-normalize


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    query: str
    documents: list[str | dict[str, Any]] | None = None
    texts: list[str] | None = None  # the TEI form
    top_n: int | None = Field(None, ge=1)
    return_text: bool = False
    model: str | None = None
