"""Embedding and rerank routes: llama-server's /embedding and /rerank aliases, OpenAI's
/v1/embeddings."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, note_tokens, read_json, runtime_of
from llamaserve.families.embeddings import serving as embedding
from llamaserve.families.embeddings.protocol import EmbeddingRequest, NativeEmbeddingRequest, RerankRequest
from llamaserve.serving.state import ServerState


def embedding_routes(state: ServerState) -> APIRouter:
    """The native routes first: they own the `embeddings` alias of Vertex AI's /predict."""
    router = APIRouter()

    @router.post("/embedding")
    @router.post("/embeddings")
    async def native_embeddings(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, NativeEmbeddingRequest)
        return JSONUTF8Response(await embedding.native_embeddings(rt, req))

    @router.post("/rerank")
    @router.post("/reranking")
    @router.post("/v1/rerank")
    @router.post("/v1/reranking")
    async def rerank(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, RerankRequest)
        _, body = await embedding.rerank(rt, req)
        return JSONUTF8Response(body)

    @router.post("/v1/embeddings")
    async def oai_embeddings(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, EmbeddingRequest)
        body = await embedding.openai_embeddings(rt, req)
        note_tokens(request, body["usage"]["prompt_tokens"], 0, 0)
        return JSONUTF8Response(body)

    return router
