"""The resumable-stream routes: `GET`/`DELETE /v1/stream`, `POST /v1/streams/lookup`.

The sessions are filled by api/stream_tee.py; see serving/stream_sessions.py for the
feature. These routes never touch the model (api/middleware.py does not count them as
tasks for --sleep-idle-seconds).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, parse_json, read_body
from llamaserve.api.keepalive import request_ping_seconds
from llamaserve.api.sse import sse_response
from llamaserve.errors import APIError
from llamaserve.serving.state import ServerState
from llamaserve.serving.stream_sessions import OffsetLost


def _conv_id(request: Request) -> str:
    conv_id = request.query_params.get("conv_id", "")
    if not conv_id:
        raise APIError("Missing conversation id in path")
    return conv_id


def stream_routes(state: ServerState) -> APIRouter:
    """The id travels in the query string: it may embed a model name with slashes."""
    router = APIRouter()

    @router.get("/v1/stream")
    async def replay(request: Request) -> Response:
        """Replay from byte `from`, then follow the live bytes until the generation ends."""
        session = state.streams.get(_conv_id(request))
        if session is None:
            raise APIError("Stream not found or expired", "not_found_error")
        raw = request.query_params.get("from", "")
        if raw and not raw.isdigit():
            raise APIError("Invalid 'from' offset")
        offset = int(raw or 0)
        if offset < session.dropped:
            raise APIError("Stream offset lost, please restart")

        async def body() -> AsyncIterator[bytes]:
            with contextlib.suppress(OffsetLost):  # fell behind a 4 MiB buffer: the stream just ends
                async for chunk in session.read(offset):
                    yield chunk

        return sse_response(body(), request_ping_seconds(request))

    @router.post("/v1/streams/lookup")
    async def lookup(request: Request) -> Response:
        try:
            body = parse_json(await read_body(request))
        except APIError as exc:
            raise APIError(f"invalid body: {exc.message}") from None
        asked = body.get("conversation_ids") if isinstance(body, dict) else None
        ids = [i for i in asked if isinstance(i, str) and i] if isinstance(asked, list) else []
        return JSONUTF8Response(state.streams.lookup(ids))

    @router.delete("/v1/stream")
    async def stop(request: Request) -> Response:
        """The explicit Stop; 204 even when the session is already gone."""
        state.streams.stop(_conv_id(request))
        return Response(status_code=204)

    return router
