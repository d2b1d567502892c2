"""The HTTP application: thin routes over the serving adapters.

Routes parse and validate the body, hand it to a serving function, and shape
errors. Nothing here decodes tokens or renders templates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamaserve.api.metrics import LlamaCollector, render_metrics
from llamaserve.api.middleware import AccessLogMiddleware, APIKeyMiddleware, IdleMiddleware
from llamaserve.api.sse import ClientGone, data_event, sse_response, until_disconnect
from llamaserve.engine.types import Finished, TextDelta
from llamaserve.errors import APIError, validation_message
from llamaserve.protocol.embedding import EmbeddingRequest, NativeEmbeddingRequest, RerankRequest
from llamaserve.protocol.native import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    InfillRequest,
    NativeCompletionRequest,
    TokenizeRequest,
)
from llamaserve.protocol.openai import ChatCompletionRequest, CompletionRequest
from llamaserve.serving import chat, completion, embedding, generate, info
from llamaserve.serving.runtime import ModelRuntime, ServerState
from llamaserve.serving.sleep import IdleSleeper

log = logging.getLogger("llamaserve.http")

M = TypeVar("M", bound=BaseModel)

DEFAULT_BODY_LIMIT = 32 * 1024 * 1024


class JSONUTF8Response(JSONResponse):
    media_type = "application/json; charset=utf-8"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def read_json(request: Request, model: type[M]) -> M:
    """The body as `model`; every way it can be wrong is a 4xx naming the problem."""
    limit = getattr(request.app.state, "body_limit", DEFAULT_BODY_LIMIT)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(f"request body too large (limit is {limit} bytes)", "request_too_large", status=413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(f"request body too large (limit is {limit} bytes)", "request_too_large", status=413)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise APIError("the request body is empty; expected a JSON object")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise APIError("the request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise APIError(f"the request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise APIError(validation_message(exc)) from None


Tagged = tuple[int, TextDelta | Finished]


async def _chain(first: Tagged, rest: AsyncIterator[Tagged]) -> AsyncIterator[Tagged]:
    yield first
    async for event in rest:
        yield event


async def stream_events(
    request: Request,
    events: AsyncIterator[Tagged],
    frame: Callable[[AsyncIterator[Tagged]], AsyncIterator[bytes]],
    *,
    error_frame: Callable[[APIError], bytes] | None = None,
) -> Response:
    """An SSE response whose status is decided by the first event.

    Waiting for the first event means a request that cannot start (prompt
    too long, bad parameters found by the engine) gets a proper 4xx instead
    of a 200 stream holding an error. Later failures are sent in-stream.
    """
    events = _recording(request, events)
    try:
        first = await until_disconnect(request, events.__anext__())
    except StopAsyncIteration:
        raise APIError("generation ended without a result", "server_error") from None

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in frame(_chain(first, events)):
                yield chunk
        except APIError as exc:
            yield error_frame(exc) if error_frame else data_event(exc.openai_body())
        finally:
            await events.aclose()

    return sse_response(body())


async def _recording(request: Request, events: AsyncIterator[Tagged]) -> AsyncIterator[Tagged]:
    """Passes events through, noting token counts for the access log."""
    async for index, event in events:
        if isinstance(event, Finished):
            request.state.tokens = (event.n_prompt_tokens, event.n_cached, event.n_predicted)
        yield index, event


def _with_usage(request: Request, body: dict[str, Any]) -> Response:
    usage = body.get("usage") or {}
    request.state.tokens = (
        usage.get("prompt_tokens", 0),
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        usage.get("completion_tokens", 0),
    )
    return JSONUTF8Response(body)


def create_app(state: ServerState) -> FastAPI:
    config = state.config
    app = FastAPI(title="llamaserve", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.server = state
    app.state.body_limit = config.body_limit_mib * 1024 * 1024
    # Outermost first: the access log sees every answer, CORS answers preflights
    # before the key check, the key check guards everything else, and only
    # authorised tasks reach the idle tracking (and may wake a sleeping model).
    if config.sleep_idle_seconds > 0:
        app.add_middleware(IdleMiddleware, sleeper=IdleSleeper(state, config.sleep_idle_seconds))
    app.add_middleware(APIKeyMiddleware, keys=config.api_keys)
    credentials = config.cors_credentials if config.cors_credentials is not None else "*" not in config.cors_origins
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(config.cors_origins),
        allow_credentials=credentials and "*" not in config.cors_origins,
        allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
        allow_headers=["*"],
    )
    app.add_middleware(AccessLogMiddleware)
    collector = LlamaCollector(state)

    def runtime() -> ModelRuntime:
        if state.runtime is None:
            raise APIError("Loading model", "unavailable_error")
        return state.runtime

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return JSONUTF8Response(exc.openai_body(), status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONUTF8Response(
            APIError(str(exc.detail), kind, status=exc.status_code).openai_body(), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        return JSONUTF8Response(
            APIError(f"internal error: {type(exc).__name__}", "server_error").openai_body(), status_code=500
        )

    # ------------------------------------------------------------- health
    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> Response:
        if state.asleep is None:  # asleep is healthy: the next task reloads the model
            runtime()
        return JSONUTF8Response({"status": "ok"})

    # ------------------------------------------------------------- models
    @app.get("/v1/models")
    @app.get("/models")
    async def list_models() -> Response:
        return JSONUTF8Response(state.asleep.models if state.asleep else info.models(runtime()))

    @app.get("/props")
    async def get_props() -> Response:
        return JSONUTF8Response(state.asleep.props if state.asleep else info.props(runtime()))

    @app.post("/props")
    async def set_props() -> Response:
        runtime()
        if not state.config.endpoint_props:
            raise APIError(
                "This server does not support changing global properties. Start it with `--props`",
                "not_supported_error",
            )
        return JSONUTF8Response({"success": True})

    @app.get("/slots")
    async def get_slots(request: Request) -> Response:
        rt = runtime()
        if not state.config.endpoint_slots:
            raise APIError(
                "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error"
            )
        if request.query_params.get("fail_on_no_slot") in ("1", "true") and all(s.busy for s in rt.scheduler.slots):
            raise APIError("no slot available", "unavailable_error")
        return JSONUTF8Response(info.slots(rt))

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.asleep is None:
            runtime()
        if not config.endpoint_metrics:
            raise APIError(
                "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error"
            )
        return Response(
            render_metrics(state, collector),
            media_type="text/plain; version=0.0.4",
            headers={"Process-Start-Time-Unix": str(int(state.started))},
        )

    # ------------------------------------------------------------- tokens
    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        rt = runtime()
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

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, DetokenizeRequest)
        bad = [t for t in req.tokens if not rt.model.valid_token(t)]
        if bad:
            raise APIError(f"invalid token id {bad[0]} (vocabulary size {rt.model.n_vocab})")
        return JSONUTF8Response({"content": rt.model.detokenize(req.tokens, special=True)})

    @app.post("/apply-template")
    async def apply_template(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, ApplyTemplateRequest)
        prompt = chat.render_prompt(rt, req.messages, tools=req.tools, template_kwargs=req.chat_template_kwargs)
        return JSONUTF8Response({"prompt": prompt})

    # --------------------------------------------------------- generation
    @app.post("/v1/embeddings")
    async def oai_embeddings(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, EmbeddingRequest)
        body = await embedding.openai_embeddings(rt, req)
        request.state.tokens = (body["usage"]["prompt_tokens"], 0, 0)
        return JSONUTF8Response(body)

    @app.post("/embedding")
    @app.post("/embeddings")
    async def native_embeddings(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, NativeEmbeddingRequest)
        return JSONUTF8Response(await embedding.native_embeddings(rt, req))

    @app.post("/rerank")
    @app.post("/reranking")
    @app.post("/v1/rerank")
    @app.post("/v1/reranking")
    async def rerank(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, RerankRequest)
        _, body = await embedding.rerank(rt, req)
        return JSONUTF8Response(body)

    @app.post("/infill")
    async def infill(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, InfillRequest)
        job, prompt = await completion.infill_request(rt, req)
        if req.stream:
            events = generate.stream(rt.engine, [job])
            return await stream_events(request, events, lambda ev: completion.native_stream(rt, req, job, prompt, ev))
        body = await until_disconnect(request, completion.native_complete(rt, req, [(job, prompt)]))
        return JSONUTF8Response(body)

    @app.post("/completion")
    @app.post("/completions")
    async def native_completion(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, NativeCompletionRequest)
        jobs = await completion.native_requests(rt, req)
        if req.stream:
            if len(jobs) != 1:
                raise APIError("streaming supports a single prompt")
            job, prompt = jobs[0]
            events = generate.stream(rt.engine, [job])
            return await stream_events(request, events, lambda ev: completion.native_stream(rt, req, job, prompt, ev))
        body = await until_disconnect(request, completion.native_complete(rt, req, jobs))
        first = body if isinstance(body, dict) else body[0]
        request.state.tokens = (first["tokens_evaluated"], first["timings"]["cache_n"], first["tokens_predicted"])
        return JSONUTF8Response(body)

    @app.post("/v1/completions")
    async def oai_completion(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, CompletionRequest)
        groups = await completion.oai_requests(rt, req)
        if req.stream:
            if len(groups) != 1:
                raise APIError("streaming supports a single prompt")
            events = generate.stream(rt.engine, groups[0])
            return await stream_events(request, events, lambda ev: completion.oai_stream(rt, req, groups[0], ev))
        return _with_usage(request, await until_disconnect(request, completion.oai_complete(rt, groups)))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        rt = runtime()
        req = await read_json(request, ChatCompletionRequest)
        jobs = await chat.chat_request(rt, req)
        if req.stream:
            events = generate.stream(rt.engine, jobs)
            return await stream_events(request, events, lambda ev: chat.chat_stream(rt, req, jobs, ev))
        return _with_usage(request, await until_disconnect(request, chat.chat_complete(rt, jobs)))

    from llamaserve.api.routes_extra import extra_routes  # imported here: it imports this module

    app.include_router(extra_routes(state, runtime))
    from llamaserve.api.routes_cache import cache_routes

    app.include_router(cache_routes(state, runtime))
    if config.static_path:
        from starlette.staticfiles import StaticFiles

        app.mount("/", StaticFiles(directory=config.static_path, html=True), name="static")
    elif config.webui:
        from llamaserve.webui import static_files

        app.mount("/", static_files(), name="webui")
    return app
