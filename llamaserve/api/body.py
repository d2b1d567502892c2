"""Request bodies and JSON answers, for every app that serves routes of api/ (the single
server, and the agent tools' routes behind the router and the `--upstreams` front): the body
read within --body-limit, parsed as JSON with a bound on nesting, and the UTF-8 JSON answer.
Nothing here knows the model, so the processes at the edge import it without the engine's side.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from llamaserve.errors import APIError
from llamaserve.jsondepth import nests_deeper

DEFAULT_BODY_LIMIT = 32 * 1024 * 1024
# Deepest nesting of arrays and objects a body may have. Real requests stay far below it
# (a tool schema or a nested content part is a few levels); without a bound, a body nested
# thousands of levels deep exhausts Python's recursion in parsing, validation or templating.
MAX_JSON_DEPTH = 128


class JSONUTF8Response(JSONResponse):
    media_type = "application/json; charset=utf-8"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def read_body(request: Request) -> bytes:
    """The raw body, within --body-limit (413 past it, before reading it all when declared)."""
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
    return b"".join(chunks)


def parse_json(raw: bytes) -> Any:
    """A request body as JSON; not JSON, not UTF-8 or nested too deep is a 400 that says which."""
    too_deep = APIError(f"the request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise APIError("the request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise APIError(f"the request body is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise too_deep from None
    # Fewer brackets than the limit cannot nest past it: the walk is skipped for almost every body.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and nests_deeper(data, MAX_JSON_DEPTH):
        raise too_deep
    return data
