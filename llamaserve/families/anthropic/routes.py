"""Anthropic Messages routes: /v1/messages and /v1/messages/count_tokens.

They translate to the chat pipeline (families/anthropic/serving.py) and answer every
error, body-parse and validation errors included, in Anthropic's envelope
`{"type": "error", "error": {"type", "message"}}`, sending mid-stream
failures as `event: error`. They catch errors themselves because the app's
global handler speaks the OpenAI envelope.

Anthropic clients send `x-api-key` and `anthropic-version`; neither is
required or rejected here (auth is the app's concern).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, note_tokens, read_json, runtime_of, stream_events
from llamaserve.api.sse import ClientGone, until_disconnect
from llamaserve.errors import APIError
from llamaserve.families.anthropic import serving as msgs
from llamaserve.families.anthropic.protocol import CountTokensRequest, MessagesRequest
from llamaserve.families.anthropic.request import to_chat_request
from llamaserve.families.chat import serving as chat
from llamaserve.serving import generate
from llamaserve.serving.state import ServerState

log = logging.getLogger("llamaserve.http")

Handler = Callable[[Request], Awaitable[Response]]


def anthropic_errors(handler: Handler) -> Handler:
    """Every failure of an Anthropic route as Anthropic's error envelope."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as exc:
            return JSONUTF8Response(exc.anthropic_body(), status_code=exc.status, headers=exc.headers or None)
        except ClientGone:
            raise
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            error = APIError(f"internal error: {type(exc).__name__}", "server_error")
            return JSONUTF8Response(error.anthropic_body(), status_code=500)

    return wrapped


def anthropic_routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    @anthropic_errors
    async def create_message(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, MessagesRequest)
        jobs = await chat.chat_request(rt, to_chat_request(req))
        if req.stream:
            events = generate.stream(rt.engine, jobs.requests)
            return await stream_events(
                request,
                events,
                lambda ev: msgs.message_stream(rt, req, jobs, ev),
                error_frame=msgs.error_event,
                ping_interval=req.sse_ping_interval,
            )
        body = await until_disconnect(request, msgs.create_message(rt, req, jobs))
        used = body["usage"]
        cached = used["cache_read_input_tokens"]
        note_tokens(request, used["input_tokens"] + cached, cached, used["output_tokens"])
        return JSONUTF8Response(body)

    @router.post("/v1/messages/count_tokens")
    @anthropic_errors
    async def count_tokens(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, CountTokensRequest)
        return JSONUTF8Response(await msgs.count_tokens(rt, req))

    return router
