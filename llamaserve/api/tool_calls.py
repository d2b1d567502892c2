"""POST /tools on a server whose agent tools are on (api/routes_tools.py answers 403 otherwise):
`{tool, params, stream}` checked, the call made, its output as JSON or, streamed, as SSE
`{"chunk"}` events and a closing `{"done": true}`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from llamaserve.api.body import JSONUTF8Response, parse_json, read_body
from llamaserve.api.sse import sse_response
from llamaserve.errors import APIError
from llamaserve.tools.base import Call, ParamError, Tool
from llamaserve.tools.fileio import RuntimeRefused
from llamaserve.tools.proc import StreamSink
from llamaserve.tools.registry import HeaderRefused, Toolbox, UnknownTool


async def call_tool(toolbox: Toolbox, request: Request) -> Response:
    body = parse_json(await read_body(request))
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    name = body.get("tool")
    if not isinstance(name, str):
        raise APIError("'tool' is required and must be a string")
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise APIError("'params' must be an object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError("'stream' must be a boolean")
    try:
        tool = toolbox.find(name, stream)
        call = toolbox.prepare(tool, params, request.headers)
        if stream:
            return sse_response(_stream(toolbox, tool, call))
        result = await toolbox.invoke(tool, call)
    except UnknownTool as exc:
        raise APIError(str(exc), status=404) from exc
    except ParamError as exc:
        raise APIError(str(exc)) from exc
    except RuntimeRefused as exc:
        raise APIError(str(exc), "server_error", status=500) from exc
    except HeaderRefused as exc:
        raise APIError(str(exc), "permission_error") from exc
    return JSONUTF8Response(result)


def _frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


async def _stream(toolbox: Toolbox, tool: Tool, call: Call) -> AsyncIterator[bytes]:
    """Each piece of output as `{"chunk"}` while the tool runs, then `{"done": true}` (with
    `error` when it failed). A client that goes away stops the command."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    sink = StreamSink(lambda chunk: loop.call_soon_threadsafe(queue.put_nowait, chunk))

    async def work() -> None:
        try:
            await toolbox.invoke(tool, call, sink)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    task = asyncio.ensure_future(work())
    try:
        while True:
            chunk = await queue.get()
            if chunk is None:
                break
            if chunk:
                yield _frame({"chunk": chunk})
        error = ""
        try:
            await task
        except (ParamError, RuntimeRefused) as exc:
            error = str(exc)
        except Exception as exc:  # the stream has begun: the failure goes into its last event
            error = f"{type(exc).__name__}: {exc}"
        yield _frame({"done": True, **({"error": error} if error else {})})
    finally:
        sink.closed = True  # a client that went away stops the command
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
