"""Resumable streams over HTTP: the tee behind a streamed answer (routes: routes_stream.py).

With an `X-Conversation-Id` header, a streamed answer is not sent from the generation
directly: a producer task pulls the generation into the conversation's session
(serving/stream_sessions.py) and the answer reads the session from byte 0. A client
that goes away ends only its read; the producer runs on until the generation ends or
`DELETE /v1/stream` cancels it, which closes the generation (its `finally` aborts the
engine request and frees the slot). Without the header nothing changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from llamaserve.api.sse import sse_response
from llamaserve.serving.state import ServerState
from llamaserve.serving.stream_sessions import StreamSession

HEADER = "x-conversation-id"


async def _pump(session: StreamSession, chunks: AsyncIterator[bytes]) -> None:
    try:
        async for chunk in chunks:
            if session.cancelled:
                break
            session.append(chunk)
    finally:
        closer = getattr(chunks, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()
        session.finish()


def resumable(request: Request, chunks: AsyncIterator[bytes], ping_after: float | None) -> StreamingResponse:
    """The SSE answer of `chunks`, kept in the conversation's session when the header names one.

    Pings go to this reader only, not into the session: a reader that resumes later
    gets its own."""
    conversation_id = request.headers.get(HEADER, "")
    state = getattr(request.app.state, "server", None)
    if not conversation_id or not isinstance(state, ServerState):
        return sse_response(chunks, ping_after)
    session = state.streams.create(conversation_id)
    session.producer = asyncio.get_running_loop().create_task(_pump(session, chunks))
    return sse_response(session.read(0), ping_after)
