"""The server's side of quota/report.py: when the edge in front asks (`x-llamaserve-usage:
report`), each answer says what its request used, read from the counts the routes note for
the access log (`api/http.note_tokens`, from the engine's Finished event), so nothing is
parsed or counted twice. A request that does not ask passes through untouched."""

from __future__ import annotations

from llamaserve.api.middleware import ASGIApp, Message, Receive, Scope, Send
from llamaserve.quota import report


def _asks(scope: Scope) -> bool:
    return any(k == report.HEADER and v == report.ASK for k, v in scope.get("headers", ()))


class UsageReportMiddleware:
    def __init__(self, app: ASGIApp, model: str) -> None:
        self.app = app
        self.model = model

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _asks(scope):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        streamed = False

        async def reporting_send(message: Message) -> None:
            nonlocal streamed
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                streamed = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
                tokens = None if streamed else state.get("tokens")
                headers.append((report.HEADER, report.header_value(tokens, self.model)))
                message["headers"] = headers
            elif streamed and message["type"] == "http.response.body" and not message.get("more_body", False):
                tokens = state.get("tokens")
                if tokens:
                    await send({"type": "http.response.body", "body": report.comment(tokens), "more_body": True})
            await send(message)

        await self.app(scope, receive, reporting_send)
