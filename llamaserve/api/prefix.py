"""--api-prefix: every route, the web UI included, answers only under the prefix.

llama-server registers each route as prefix + path, so an unprefixed path is a 404
("File Not Found"); so it is here. The prefix is stripped before the rest of the app
sees the path, so the key check's public paths, the idle tracking and the routes all
work on the unprefixed names.
"""

from __future__ import annotations

import json

from llamaserve.api.middleware import ASGIApp, Receive, Scope, Send, send_json

_NOT_FOUND = json.dumps({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}).encode()


class PrefixMiddleware:
    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix  # validated by ServerConfig: a leading "/", no trailing one

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path != self.prefix and not path.startswith(self.prefix + "/"):
            await send_json(send, 404, _NOT_FOUND)
            return
        inner = dict(scope)
        inner["path"] = path[len(self.prefix) :] or "/"
        raw = scope.get("raw_path")
        if isinstance(raw, bytes) and raw.startswith(self.prefix.encode()):
            inner["raw_path"] = raw[len(self.prefix) :] or b"/"
        await self.app(inner, receive, send)
