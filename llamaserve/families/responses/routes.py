"""OpenAI Responses routes: create, input_tokens, and the stored responses.

They translate to the chat pipeline (families/responses/serving.py) and use the app's
OpenAI-shaped error handler. Stored responses (previous_response_id, GET,
DELETE, input_items) go through state.py to the SQLite file
of --responses-db; the GET and DELETE routes need no model, so they answer
while it loads.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, note_tokens, read_json, runtime_of, stream_events
from llamaserve.api.sse import until_disconnect
from llamaserve.families.chat import serving as chat
from llamaserve.families.responses import serving as resp
from llamaserve.families.responses import state as response_state
from llamaserve.families.responses.input import to_chat_request
from llamaserve.families.responses.protocol import ResponsesRequest
from llamaserve.families.responses.store import ResponseStore, db_path
from llamaserve.serving import generate
from llamaserve.serving.state import ServerState


def responses_routes(state: ServerState) -> APIRouter:
    router = APIRouter()
    # Opened on first use. Never closed explicitly: every write is committed
    # (and synced) before it is acknowledged, so exiting loses nothing.
    store = ResponseStore(db_path(state.config.responses_db))

    @router.post("/v1/responses")
    @router.post("/responses")
    async def create_response(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, ResponsesRequest)
        history = await response_state.history(store, req)
        jobs = await chat.chat_request(rt, to_chat_request(req, history))

        async def keep(body: dict[str, Any]) -> dict[str, Any]:
            return await response_state.remember(store, req, body)

        if req.stream:
            events = generate.stream(rt.engine, jobs.requests)
            return await stream_events(
                request,
                events,
                lambda ev: resp.response_stream(rt, req, jobs, ev, on_final=keep),
                ping_interval=req.sse_ping_interval,
            )
        body = await keep(await until_disconnect(request, resp.create_response(rt, req, jobs)))
        usage = body["usage"]
        note_tokens(
            request, usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]
        )
        return JSONUTF8Response(body)

    @router.post("/v1/responses/input_tokens")
    @router.post("/responses/input_tokens")
    async def response_input_tokens(request: Request) -> Response:
        rt = runtime_of(state)
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
