"""Anthropic Messages and OpenAI Responses routes.

Both translate to the chat pipeline (serving/messages.py, serving/responses.py).
The Anthropic routes answer every error, body-parse and validation errors
included, in Anthropic's envelope `{"type": "error", "error": {"type", "message"}}`
and send mid-stream failures as `event: error`; they catch errors themselves
because the app's global handler speaks the OpenAI envelope. The Responses
routes use the app's (OpenAI-shaped) handler; stored responses
(previous_response_id, GET, DELETE, input_items) go through
serving/response_state.py to the SQLite file of --responses-db. The GET and
DELETE routes need no model, so they answer while it loads.

Anthropic clients send `x-api-key` and `anthropic-version`; neither is
required or rejected here (auth is the app's concern).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.app import JSONUTF8Response, read_json, stream_events
from llamaserve.api.sse import ClientGone, until_disconnect
from llamaserve.errors import APIError
from llamaserve.protocol.anthropic import CountTokensRequest, MessagesRequest
from llamaserve.protocol.responses import ResponsesRequest
from llamaserve.serving import chat, generate, response_state
from llamaserve.serving import messages as msgs
from llamaserve.serving import responses as resp
from llamaserve.serving.response_store import ResponseStore, db_path
from llamaserve.serving.responses_input import to_chat_request
from llamaserve.serving.runtime import ModelRuntime, ServerState

log = logging.getLogger("llamaserve.http")

Handler = Callable[[Request], Awaitable[Response]]


def anthropic_errors(handler: Handler) -> Handler:
    """Every failure of an Anthropic route as Anthropic's error envelope."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as exc:
            return JSONUTF8Response(exc.anthropic_body(), status_code=exc.status)
        except ClientGone:
            raise
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            error = APIError(f"internal error: {type(exc).__name__}", "server_error")
            return JSONUTF8Response(error.anthropic_body(), status_code=500)

    return wrapped


def _note_tokens(request: Request, prompt: int, cached: int, predicted: int) -> None:
    """Token counts for the access log (streams are counted by stream_events)."""
    request.state.tokens = (prompt, cached, predicted)


def extra_routes(state: ServerState, runtime_fn: Callable[[], ModelRuntime]) -> APIRouter:
    router = APIRouter()
    # Opened on first use. Never closed explicitly: every write is committed
    # (and synced) before it is acknowledged, so exiting loses nothing.
    store = ResponseStore(db_path(state.config.responses_db))

    # ------------------------------------------------ Anthropic Messages
    @router.post("/v1/messages")
    @anthropic_errors
    async def create_message(request: Request) -> Response:
        rt = runtime_fn()
        req = await read_json(request, MessagesRequest)
        jobs = await chat.chat_request(rt, msgs.to_chat_request(req))
        tap = msgs.FinishTap(rt.engine)
        if req.stream:
            events = generate.stream(rt.engine, jobs)
            return await stream_events(
                request, events, lambda ev: msgs.message_stream(rt, req, jobs, tap, ev), error_frame=msgs.error_event
            )
        body = await until_disconnect(request, msgs.create_message(rt, req, jobs, tap))
        fin = tap.finished.get(0)
        if fin is not None:
            _note_tokens(request, fin.n_prompt_tokens, fin.n_cached, fin.n_predicted)
        return JSONUTF8Response(body)

    @router.post("/v1/messages/count_tokens")
    @anthropic_errors
    async def count_tokens(request: Request) -> Response:
        rt = runtime_fn()
        req = await read_json(request, CountTokensRequest)
        return JSONUTF8Response(msgs.count_tokens(rt, req))

    # ------------------------------------------------- OpenAI Responses
    @router.post("/v1/responses")
    @router.post("/responses")
    async def create_response(request: Request) -> Response:
        rt = runtime_fn()
        req = await read_json(request, ResponsesRequest)
        history = await response_state.history(store, req)
        jobs = await chat.chat_request(rt, to_chat_request(req, history))

        async def keep(body: dict[str, Any]) -> dict[str, Any]:
            return await response_state.remember(store, req, body)

        if req.stream:
            events = generate.stream(rt.engine, jobs)
            return await stream_events(
                request, events, lambda ev: resp.response_stream(rt, req, jobs, ev, on_final=keep)
            )
        body = await keep(await until_disconnect(request, resp.create_response(rt, req, jobs)))
        usage = body["usage"]
        _note_tokens(
            request, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]
        )
        return JSONUTF8Response(body)

    @router.post("/v1/responses/input_tokens")
    async def response_input_tokens(request: Request) -> Response:
        rt = runtime_fn()
        req = await read_json(request, ResponsesRequest)
        return JSONUTF8Response(resp.input_tokens(rt, req, await response_state.history(store, req)))

    @router.get("/v1/responses/{response_id}")
    @router.get("/responses/{response_id}")
    async def get_response(response_id: str) -> Response:
        return JSONUTF8Response(await response_state.retrieve(store, response_id))

    @router.delete("/v1/responses/{response_id}")
    @router.delete("/responses/{response_id}")
    async def delete_response(response_id: str) -> Response:
        return JSONUTF8Response(await response_state.delete(store, response_id))

    @router.get("/v1/responses/{response_id}/input_items")
    @router.get("/responses/{response_id}/input_items")
    async def list_input_items(request: Request, response_id: str) -> Response:
        return JSONUTF8Response(await response_state.input_items(store, response_id, request.query_params))

    return router
