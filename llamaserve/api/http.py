"""What every route module shares: the JSON response, body parsing, SSE answers, the runtime.

Each family's routes (routes_*.py) parse and validate the body here, hand it
to a serving function, and answer; nothing under api/ decodes tokens or
renders templates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

# Re-exported: the route modules take everything they share from here.
from llamaserve.api.body import DEFAULT_BODY_LIMIT as DEFAULT_BODY_LIMIT
from llamaserve.api.body import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from llamaserve.api.body import JSONUTF8Response as JSONUTF8Response
from llamaserve.api.body import parse_json as parse_json
from llamaserve.api.body import read_body as read_body
from llamaserve.api.keepalive import PING, arrives_within, next_of, request_ping_seconds
from llamaserve.api.sse import until_disconnect
from llamaserve.api.stream_tee import resumable
from llamaserve.errors import APIError, validation_message
from llamaserve.serving.generate import Tagged, produced_tokens, token_counts
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.serving.state import ServerState
from llamaserve.sse import data_event

log = logging.getLogger("llamaserve.http")

M = TypeVar("M", bound=BaseModel)


def runtime_of(state: ServerState) -> ModelRuntime:
    """The loaded runtime, or 503 while the model loads (or reloads after sleeping)."""
    if state.runtime is None:
        raise APIError("Loading model", "unavailable_error")
    return state.runtime


async def read_json(request: Request, model: type[M]) -> M:
    """The body as `model`; every way it can be wrong is a 4xx naming the problem."""
    raw = await read_body(request)
    if not raw.strip():
        raise APIError("the request body is empty; expected a JSON object")
    data = parse_json(raw)
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object")
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise APIError(validation_message(exc)) from None
    _note_unknown_fields(model, parsed)
    return parsed


_noted_unknown: set[tuple[str, str]] = set()


def _note_unknown_fields(model: type[BaseModel], parsed: BaseModel) -> None:
    """Fields we do not know are ignored, as llama-server ignores them (clients send `user`,
    `metadata`, `store`, …); each is logged once per request type, at debug level."""
    for key in parsed.model_extra or {}:
        if (model.__name__, key) not in _noted_unknown and len(_noted_unknown) < 1024:
            _noted_unknown.add((model.__name__, key))
            log.debug("%s: ignoring unknown field %r", model.__name__, key)


def note_tokens(request: Request, prompt: int, cached: int, predicted: int) -> None:
    """Token counts for the access log (streams are counted by stream_events)."""
    request.state.tokens = (prompt, cached, predicted)


def with_usage(request: Request, body: dict[str, Any]) -> Response:
    """An OpenAI-shaped answer, its `usage` noted for the access log."""
    usage = body.get("usage") or {}
    note_tokens(
        request,
        usage.get("prompt_tokens", 0),
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        usage.get("completion_tokens", 0),
    )
    return JSONUTF8Response(body)


async def _chain(first: Tagged, rest: AsyncIterator[Tagged]) -> AsyncIterator[Tagged]:
    yield first
    async for event in rest:
        yield event


async def _recording(request: Request, events: AsyncIterator[Tagged]) -> AsyncGenerator[Tagged, None]:
    """Passes events through, noting token counts for the access log and the key's usage
    (api/quota.py), as `generate.Usage` counts them: the prompt once, the choices' completions
    added, plus the tokens streamed by choices a client cut short by leaving, so a stream
    abandoned midway is still charged what it used."""
    done: tuple[int, int, int] | None = None
    unfinished: dict[int, int] = {}  # choice -> tokens streamed so far
    try:
        async for index, event in events:
            counts = token_counts(event)
            if counts is not None:
                unfinished.pop(index, None)
                done = counts if done is None else (done[0], done[1], done[2] + counts[2])
                note_tokens(request, *done)
            else:
                produced = produced_tokens(event)
                if produced:
                    unfinished[index] = unfinished.get(index, 0) + produced
            yield index, event
    finally:
        if unfinished:
            prompt, cached, predicted = done or (0, 0, 0)
            note_tokens(request, prompt, cached, predicted + sum(unfinished.values()))


async def stream_events(
    request: Request,
    events: AsyncIterator[Tagged],
    frame: Callable[[AsyncIterator[Tagged]], AsyncIterator[bytes]],
    *,
    error_frame: Callable[[APIError], bytes] | None = None,
    ping_interval: int | None = None,
) -> Response:
    """An SSE response whose status is decided by the first event, with --sse-ping-interval pings
    (every `ping_interval` seconds instead when the request set its own `sse_ping_interval`).

    Waiting for the first event means a request that cannot start (prompt
    too long, bad parameters found by the engine) gets a proper 4xx instead
    of a 200 stream holding an error. Later failures are sent in-stream.
    When the first event takes longer than the ping interval (the request waits
    for a slot, or a long prompt is being processed), the 200 goes out with a ping
    so that proxies keep the connection, and a failure after that is sent in-stream.
    """
    recorded = _recording(request, events)
    seconds = request_ping_seconds(request, ping_interval)
    first_task = asyncio.ensure_future(next_of(recorded))
    try:
        ready = await until_disconnect(request, arrives_within(first_task, seconds))
    except BaseException:
        await _stop(first_task, recorded)
        raise
    if ready:
        try:
            first = first_task.result()
        except StopAsyncIteration:
            raise APIError("generation ended without a result", "server_error") from None
        head = _chain(first, recorded)
    else:
        head = _chain_pending(first_task, recorded)

    async def body() -> AsyncIterator[bytes]:
        try:
            if not ready:
                yield PING
            async for chunk in frame(head):
                yield chunk
        except APIError as exc:
            yield error_frame(exc) if error_frame else data_event(exc.openai_body())
        finally:
            await _stop(first_task, recorded)

    return resumable(request, body(), seconds)


async def _chain_pending(first: asyncio.Future[Tagged], rest: AsyncIterator[Tagged]) -> AsyncIterator[Tagged]:
    try:
        event = await first
    except StopAsyncIteration:
        raise APIError("generation ended without a result", "server_error") from None
    yield event
    async for item in rest:
        yield item


async def _stop(first: asyncio.Future[Tagged], recorded: AsyncGenerator[Tagged, None]) -> None:
    """Ends the generation: its `finally` aborts the engine request (the slot is freed)."""
    if not first.done():
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await first
    await recorded.aclose()
