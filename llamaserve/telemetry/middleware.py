"""The request span: one SERVER span per HTTP request, a child of the client's `traceparent`.

Plain ASGI, outermost, so the span covers the whole answer (a stream until its last chunk)
and every status (a 401 of the key check too). In the model server the generation code hands
each finished choice to the span (telemetry/hook.py), which then gets its token counts and
the queue/prefill/decode children (telemetry/spans.py). At the edge (the router, the
`--upstreams` front) the span's own context replaces the client's `traceparent` and
`tracestate` in the headers the proxy forwards, so the model server's span is its child.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from llamaserve.telemetry.hook import start_collecting, stop_collecting
from llamaserve.telemetry.spans import add_phase_spans, usage_attributes

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The GenAI operation of each generating route (gen_ai.operation.name).
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/messages": "chat",
    "/v1/responses": "chat",
    "/v1/audio/transcriptions": "chat",
    "/completion": "text_completion",
    "/completions": "text_completion",
    "/v1/completions": "text_completion",
    "/infill": "text_completion",
    "/embedding": "embeddings",
    "/embeddings": "embeddings",
    "/v1/embeddings": "embeddings",
    "/rerank": "rerank",
    "/reranking": "rerank",
    "/v1/rerank": "rerank",
    "/v1/reranking": "rerank",
}
PROVIDER = "llama.cpp"
UPSTREAM_HEADER = b"x-llamaserve-upstream"  # the front's answer names its member (scale/front.py)
# What a route may leave in the request's state for its span: the model a router request names.
MODEL_STATE_KEY = "trace_model"
# Polled, not asked: a load balancer's health checks and a scraper's reads (the front and the
# router ask every member's /health each second) would bury the requests in spans.
UNTRACED_READS = frozenset({"/health", "/v1/health", "/metrics"})


class _Getter(Getter[list[tuple[bytes, bytes]]]):
    """Reads a carrier of ASGI's raw header pairs for OpenTelemetry's propagators."""

    def get(self, carrier: list[tuple[bytes, bytes]], key: str) -> list[str] | None:
        name = key.lower().encode("latin-1")
        values = [v.decode("latin-1") for k, v in carrier if k.lower() == name]
        return values or None

    def keys(self, carrier: list[tuple[bytes, bytes]]) -> list[str]:
        return [k.decode("latin-1") for k, _ in carrier]


_GETTER = _Getter()


def _route_of(scope: Scope) -> str | None:
    """The matched route's template (`/v1/responses/{response_id}`); None for a catch-all."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str) or ":path}" in path:
        return None
    return path


class TracingMiddleware:
    """`model`: the model this server answers as ("" at the edge, where a route names it);
    `forward`: replace the trace headers with this span's before the app forwards them."""

    def __init__(self, app: ASGIApp, tracer: Tracer, model: str = "", forward: bool = False) -> None:
        self.app = app
        self.tracer = tracer
        self.model = model
        self.forward = forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "GET")
        path = scope.get("path", "")
        if scope["type"] != "http" or (method in ("GET", "HEAD") and path in UNTRACED_READS):
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        parent = propagate.extract(headers, getter=_GETTER)
        attributes: dict[str, Any] = {"http.request.method": method, "url.path": path}
        operation = OPERATIONS.get(path)
        if operation:
            attributes["gen_ai.operation.name"] = operation
            attributes["gen_ai.provider.name"] = PROVIDER
            if self.model:
                attributes["gen_ai.request.model"] = self.model
                attributes["gen_ai.response.model"] = self.model
        span = self.tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER, attributes=attributes)
        if self.forward:
            scope = dict(scope, headers=_with_trace_headers(headers, span))
        status = 0
        ended = False
        collected, token = start_collecting()

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                self._finish(span, scope, status, collected)

        async def traced_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.forward:
                    _note_upstream(span, message.get("headers", ()))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                end()

        try:
            await self.app(scope, receive, traced_send)
        except asyncio.CancelledError:
            raise  # the client left or the server stops: not the request's failure
        except BaseException as exc:
            span.record_exception(exc)
            status = status or getattr(exc, "http_status", 500)
            raise
        finally:
            stop_collecting(token)
            end()  # a client gone mid-stream: the span ends with the app call

    def _finish(self, span: Span, scope: Scope, status: int, collected: list[Any]) -> None:
        method = scope.get("method", "GET")
        route = _route_of(scope)
        if route is not None:
            span.update_name(f"{method} {route}")
            span.set_attribute("http.route", route)
        elif scope.get("path", "") not in OPERATIONS:
            # HTTP's conventions: no route, no path in the name (a client could invent any number);
            # the edge's catch-all keeps the API's own paths, which it forwards (`url.path` has all).
            span.update_name(method)
        model = (scope.get("state") or {}).get(MODEL_STATE_KEY)
        if isinstance(model, str) and model:
            span.set_attribute("gen_ai.request.model", model)
        if status:
            span.set_attribute("http.response.status_code", status)
        if status >= 400:
            span.set_attribute("error.type", str(status))
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        if collected:
            span.set_attributes(usage_attributes(collected))
            add_phase_spans(self.tracer, trace.set_span_in_context(span), collected)
        span.end()


def _with_trace_headers(headers: list[tuple[bytes, bytes]], span: Span) -> list[tuple[bytes, bytes]]:
    """The request's headers with the trace context (traceparent, tracestate, baggage) of `span`."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    replaced = {name.encode("latin-1") for name in carrier} | {b"traceparent", b"tracestate"}
    kept = [(k, v) for k, v in headers if k.lower() not in replaced]
    return kept + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]


def _note_upstream(span: Span, headers: Any) -> None:
    for key, value in headers:
        if key.lower() == UPSTREAM_HEADER:
            span.set_attribute("llamaserve.upstream", value.decode("latin-1"))
            return
