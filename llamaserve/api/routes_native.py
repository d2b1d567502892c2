"""llama-server's native routes: /completion, /infill, /tokenize, /detokenize,
/apply-template, /embedding and the rerank aliases."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, note_tokens, read_json, runtime_of, stream_events
from llamaserve.api.sse import until_disconnect
from llamaserve.errors import APIError
from llamaserve.protocol.embedding import NativeEmbeddingRequest, RerankRequest
from llamaserve.protocol.native import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    InfillRequest,
    NativeCompletionRequest,
    TokenizeRequest,
)
from llamaserve.serving import chat, completion, embedding, generate
from llamaserve.serving.state import ServerState


def native_routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, TokenizeRequest)
        tokens = rt.model.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
        if not req.with_pieces:
            return JSONUTF8Response({"tokens": tokens})
        out = []
        for t in tokens:
            raw = rt.model.piece(t, special=True)
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            out.append({"id": t, "piece": piece})
        return JSONUTF8Response({"tokens": out})

    @router.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, DetokenizeRequest)
        bad = [t for t in req.tokens if not rt.model.valid_token(t)]
        if bad:
            raise APIError(f"invalid token id {bad[0]} (vocabulary size {rt.model.n_vocab})")
        return JSONUTF8Response({"content": rt.model.detokenize(req.tokens, special=True)})

    @router.post("/apply-template")
    async def apply_template(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, ApplyTemplateRequest)
        prompt = chat.render_prompt(
            rt,
            req.messages,
            tools=req.tools,
            template_kwargs=req.chat_template_kwargs,
            add_generation_prompt=req.add_generation_prompt,
        )
        return JSONUTF8Response({"prompt": prompt})

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

    @router.post("/infill")
    async def infill(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, InfillRequest)
        jobs, prompt = await completion.infill_request(rt, req)
        if req.stream:
            events = generate.stream(rt.engine, jobs)
            return await stream_events(request, events, lambda ev: completion.native_stream(rt, req, jobs, prompt, ev))
        body = await until_disconnect(request, completion.native_complete(rt, req, [(jobs, prompt)]))
        return JSONUTF8Response(body)

    @router.post("/completion")
    @router.post("/completions")
    async def native_completion(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, NativeCompletionRequest)
        jobs = await completion.native_requests(rt, req)
        if req.stream:
            if len(jobs) != 1:
                raise APIError("streaming supports a single prompt")
            group, prompt = jobs[0]
            events = generate.stream(rt.engine, group)
            return await stream_events(request, events, lambda ev: completion.native_stream(rt, req, group, prompt, ev))
        body = await until_disconnect(request, completion.native_complete(rt, req, jobs))
        first = body if isinstance(body, dict) else body[0]
        # response_fields may have left any of these out of the answer
        cache_n = first.get("timings", {}).get("cache_n", 0)
        note_tokens(request, first.get("tokens_evaluated", 0), cache_n, first.get("tokens_predicted", 0))
        return JSONUTF8Response(body)

    return router
