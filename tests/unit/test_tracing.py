"""OpenTelemetry traces (llamaserve/telemetry/): when they are on, the spans built from the
engine's timings, the request span's parent from the client's `traceparent`, and what the
edge forwards. Spans go to the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

from llamaserve.config import ConfigError, ServerConfig
from llamaserve.engine.types import Finished, Timings
from llamaserve.telemetry.hook import note_finished
from llamaserve.telemetry.middleware import TracingMiddleware
from llamaserve.telemetry.provider import build_provider, tracer_of
from llamaserve.telemetry.settings import TraceSettings, trace_settings
from llamaserve.telemetry.spans import add_phase_spans

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

Message = MutableMapping[str, Any]


@pytest.fixture
def spans() -> tuple[Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return tracer_of(build_provider(exporter, "llamaserve-test", batch=False)), exporter


def _finished(t_done: float, *, slot: int = 3, predicted: int = 7, draft: int = 0) -> Finished:
    timings = Timings(
        cache_n=40,
        prompt_n=24,
        prompt_ms=20.0,
        predicted_n=predicted,
        predicted_ms=30.0,
        queue_ms=10.0,
        draft_n=draft,
        draft_n_accepted=draft // 2,
    )
    return Finished("limit", "", 64, 40, predicted, timings, id_slot=slot, t_done=t_done)


def _by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


# --- when tracing is on ---------------------------------------------------------------------


def test_tracing_is_off_unless_a_flag_or_an_otel_variable_asks() -> None:
    plain = ServerConfig()
    assert trace_settings(plain, {}) is None
    assert trace_settings(plain, {"OTEL_SERVICE_NAME": "x"}) is None  # naming a service traces nothing
    assert trace_settings(ServerConfig(otel=True), {}) == TraceSettings("otlp", "http/protobuf", None)
    assert trace_settings(plain, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is not None
    assert trace_settings(plain, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) is not None
    console = trace_settings(plain, {"OTEL_TRACES_EXPORTER": "console"})
    assert console is not None and console.exporter == "console"
    grpc = trace_settings(ServerConfig(otel=True), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc is not None and grpc.protocol == "grpc"


def test_opentelemetrys_own_off_switches_win_over_the_flag() -> None:
    on = ServerConfig(otel=True, otlp_endpoint="http://c:4318")
    assert trace_settings(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert trace_settings(on, {"OTEL_TRACES_EXPORTER": "none"}) is None


def test_the_endpoint_flag_gets_the_traces_path_unless_it_has_one() -> None:
    def url(endpoint: str) -> str | None:
        settings = trace_settings(ServerConfig(otlp_endpoint=endpoint), {})
        assert settings is not None
        return settings.endpoint

    assert url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert url("https://collector/otlp/v1/traces") == "https://collector/otlp/v1/traces"


def test_settings_it_cannot_honour_are_refused_by_name() -> None:
    for environ, named in (
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "--otlp-endpoint"),
    ):
        with pytest.raises(ConfigError, match=named):
            trace_settings(ServerConfig(otlp_endpoint="http://c:4318"), environ)
    with pytest.raises(ConfigError, match="--otlp-endpoint"):
        ServerConfig(otlp_endpoint="collector:4318", model=__file__).validate()


def test_the_flags_reach_the_config() -> None:
    from llamaserve.cli.argv import parse
    from llamaserve.cli.build import build_config

    config = build_config(parse(["--otel", "--otlp-endpoint", "http://c:4318"], {}), {})
    assert config.otel and config.otlp_endpoint == "http://c:4318"


def test_a_server_without_tracing_never_imports_the_sdk_or_our_span_code() -> None:
    """Start-up time: with tracing off, building every app shell and the generation code loads
    neither the OpenTelemetry SDK nor an exporter nor our span code (FastAPI imports the API
    package itself, which is all of OpenTelemetry a server without tracing loads)."""
    code = (
        "import os, sys\n"
        "from llamaserve.config import ServerConfig\n"
        "from llamaserve.api.run import start_request_tracing\n"
        "import logging\n"
        "assert start_request_tracing(ServerConfig(), 'x', logging.getLogger()) is True\n"
        "import llamaserve.api.app, llamaserve.edge.app, llamaserve.router.app, llamaserve.scale.front\n"
        "import llamaserve.serving.generate\n"
        "from llamaserve.edge.app import edge_app\n"
        "edge_app('t', ServerConfig())\n"
        "heavy = ('opentelemetry.sdk', 'opentelemetry.exporter', 'llamaserve.telemetry.provider',\n"
        "         'llamaserve.telemetry.spans', 'llamaserve.telemetry.middleware')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- spans from the engine's timings ----------------------------------------------------------


def test_phases_are_children_placed_from_the_engines_timings(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    request = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER)
    from opentelemetry import trace

    offset = 1_700_000_000 * 10**9  # wall-clock ns at perf_counter 0, as the clocks' offset
    add_phase_spans(tracer, trace.set_span_in_context(request), [(0, _finished(t_done=100.0))], offset_ns=offset)
    request.end()
    got = _by_name(exporter)
    queue, prefill, decode = got["queue"], got["prefill"], got["decode"]
    at = lambda seconds: offset + round(seconds * 1e9)  # noqa: E731
    # Back to back, ending when the request finished: decode 30 ms, prefill 20 ms, queue 10 ms.
    assert (decode.start_time, decode.end_time) == (at(99.97), at(100.0))
    assert (prefill.start_time, prefill.end_time) == (at(99.95), at(99.97))
    assert (queue.start_time, queue.end_time) == (at(99.94), at(99.95))
    request_id = request.get_span_context().span_id
    for child in (queue, prefill, decode):
        assert child.parent is not None and child.parent.span_id == request_id
        assert child.context.trace_id == request.get_span_context().trace_id
        assert child.attributes["llamaserve.slot.id"] == 3
        assert "llamaserve.choice.index" not in child.attributes  # one choice
    assert prefill.attributes["gen_ai.usage.input_tokens"] == 64
    assert prefill.attributes["gen_ai.usage.cache_read.input_tokens"] == 40
    assert prefill.attributes["llamaserve.prompt.processed_tokens"] == 24
    assert decode.attributes["gen_ai.usage.output_tokens"] == 7
    assert "llamaserve.draft.tokens" not in decode.attributes


def test_each_choice_has_its_phases_and_a_draft_is_counted(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    now = time.perf_counter()
    choices = [(0, _finished(now, slot=1, draft=6)), (1, _finished(now, slot=2, predicted=0))]
    choices[1][1].timings.predicted_ms = 0.0  # stopped at its prompt: no decode phase
    add_phase_spans(tracer, trace_context_of(tracer), choices)
    names = sorted((s.name, s.attributes["llamaserve.choice.index"]) for s in exporter.get_finished_spans())
    assert names == [("decode", 0), ("prefill", 0), ("prefill", 1), ("queue", 0), ("queue", 1)]
    decode = _by_name(exporter)["decode"]
    assert decode.attributes["llamaserve.draft.tokens"] == 6
    assert decode.attributes["llamaserve.draft.accepted_tokens"] == 3
    # Real clocks: the phases end now, on the wall clock.
    assert abs(decode.end_time - time.time_ns()) < 5 * 10**9


def trace_context_of(tracer: Tracer) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(tracer.start_span("parent"))


# --- the request span (ASGI middleware) -------------------------------------------------------


def _call(app: Callable[..., Awaitable[None]], path: str, headers: list[tuple[bytes, bytes]]) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent


def test_the_request_span_follows_the_clients_traceparent_and_carries_the_usage(
    spans: tuple[Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans

    async def streamed_generation(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

        async def pump() -> None:  # a stream's body runs in a task of its own (a copied context)
            note_finished(0, _finished(time.perf_counter(), slot=5))
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

        await asyncio.create_task(pump())
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app = TracingMiddleware(streamed_generation, tracer, model="SmolLM2")
    _call(app, "/v1/chat/completions", [(b"traceparent", TRACEPARENT.encode()), (b"tracestate", b"k=v")])
    got = _by_name(exporter)
    request = got["POST /v1/chat/completions"]
    assert request.kind == SpanKind.SERVER
    assert request.parent is not None and request.parent.is_remote
    assert f"{request.context.trace_id:032x}" == TRACE_ID and f"{request.parent.span_id:016x}" == PARENT_ID
    assert request.context.trace_state.get("k") == "v"
    attrs = request.attributes
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "SmolLM2"
    assert attrs["gen_ai.usage.input_tokens"] == 64 and attrs["gen_ai.usage.output_tokens"] == 7
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 40
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert attrs["llamaserve.slot.id"] == 5
    for name in ("queue", "prefill", "decode"):
        assert got[name].parent is not None and got[name].parent.span_id == request.context.span_id


def test_a_request_without_traceparent_starts_a_trace_and_a_5xx_is_an_error(
    spans: tuple[Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    _call(TracingMiddleware(failing, tracer), "/slots/0", [])
    (span,) = exporter.get_finished_spans()
    assert span.parent is None and span.attributes["url.path"] == "/slots/0"
    assert span.name == "POST"  # no route matched: HTTP's conventions keep the path out of the name
    assert span.status.is_ok is False and span.attributes["error.type"] == "503"
    assert "gen_ai.operation.name" not in span.attributes  # not a generating route


def test_health_checks_and_scrapes_are_not_traced(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    app = TracingMiddleware(ok, tracer)
    for path in ("/health", "/v1/health", "/metrics"):
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b""}

        async def send(message: Message, into: list[Message] = sent) -> None:
            into.append(message)

        asyncio.run(app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send))
        assert sent[0]["status"] == 200
    assert exporter.get_finished_spans() == ()


def test_the_edge_forwards_its_own_span_as_the_parent(spans: tuple[Tracer, InMemorySpanExporter]) -> None:
    tracer, exporter = spans
    forwarded: list[list[tuple[bytes, bytes]]] = []

    async def proxy(scope: Any, receive: Any, send: Any) -> None:
        forwarded.append(list(scope["headers"]))
        scope.setdefault("state", {})["trace_model"] = "smol"  # what the router's forwarding notes
        headers = [(b"x-llamaserve-upstream", b"http://127.0.0.1:9")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    headers = [(b"traceparent", TRACEPARENT.encode()), (b"tracestate", b"k=v"), (b"x-other", b"1")]
    _call(TracingMiddleware(proxy, tracer, forward=True), "/v1/chat/completions", headers)
    (edge,) = exporter.get_finished_spans()
    sent = dict(forwarded[0])
    assert sent[b"x-other"] == b"1"
    assert [k for k, _ in forwarded[0]].count(b"traceparent") == 1
    assert sent[b"traceparent"].decode() == f"00-{TRACE_ID}-{edge.context.span_id:016x}-01"
    assert sent[b"tracestate"] == b"k=v"
    assert edge.parent is not None and f"{edge.parent.span_id:016x}" == PARENT_ID
    assert edge.attributes["gen_ai.request.model"] == "smol"
    assert edge.attributes["llamaserve.upstream"] == "http://127.0.0.1:9"


def test_asking_for_traces_without_the_extra_stops_the_start_with_the_install_hint() -> None:
    """The OpenTelemetry SDK missing (a plain install) while --otel asks: exit 1 naming the extra,
    not a traceback and not a server that silently traces nothing."""
    code = (
        "import logging, sys\n"
        "sys.modules['opentelemetry.sdk'] = None  # as if the otel extra were not installed\n"
        "from llamaserve.config import ServerConfig\n"
        "from llamaserve.api.run import start_request_tracing\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "print(start_request_tracing(ServerConfig(otel=True), 'x', logging.getLogger('t')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert "pip install 'llamaserve[otel]'" in out.stderr
