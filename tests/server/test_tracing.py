"""OpenTelemetry traces from real processes, exported over OTLP/HTTP to a collector the test runs.

A SmolLM2 server (`--otlp-endpoint`), an `--upstreams` front before it (`--otel` with the
OTEL_* variables) and a router with one model (the variables only, which its child inherits)
send their spans to a small HTTP server here that decodes OTLP's protobuf. A request carrying
a W3C `traceparent` must come back as one trace: the client's span → the edge's span → the
model server's request span → its queue, prefill and decode spans.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.server.conftest import RunningServer, start_server, stop_server

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
# Spans leave each process within 100 ms of ending, not the SDK's default 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
PROMPT = [{"role": "user", "content": "Name three colors."}]


def _traceparent(span: str = CLIENT_SPAN) -> dict[str, str]:
    return {"traceparent": f"00-{TRACE_ID}-{span}-01", "tracestate": "vendor=1"}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class Got:
    """One exported span, decoded: who sent it and what it says."""

    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, Any]
    error: bool


class Collector:
    """An OTLP/HTTP trace receiver on a free port: POST /v1/traces, protobuf in, spans kept."""

    def __init__(self) -> None:
        self.spans: list[Got] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                assert self.path == "/v1/traces", self.path
                assert self.headers.get("content-type") == "application/x-protobuf"
                collector.receive(body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self._keep(str(resource.get("service.name")), span)

    def _keep(self, service: str, span: Span) -> None:
        got = Got(
            service,
            span.name,
            span.kind,
            span.trace_id.hex(),
            span.span_id.hex(),
            span.parent_span_id.hex(),
            span.start_time_unix_nano,
            span.end_time_unix_nano,
            {a.key: _value(a.value) for a in span.attributes},
            span.status.code == span.status.STATUS_CODE_ERROR,
        )
        with self.lock:
            self.spans.append(got)

    def wait(self, ready: Callable[[list[Got]], bool], timeout: float = 30.0) -> list[Got]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                spans = list(self.spans)
            if ready(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans never arrived; got {[(s.service, s.name) for s in spans]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _children(spans: list[Got], parent: Got) -> dict[str, Got]:
    return {s.name: s for s in spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id}


def _phases_done(spans: list[Got], parent_name: str, service: str = "llamaserve") -> bool:
    """The model server's request span of the client's trace has arrived with its three phases."""
    for s in spans:
        if s.trace_id == TRACE_ID and s.service == service and s.name == parent_name:
            return {"queue", "prefill", "decode"} <= set(_children(spans, s))
    return False


def _check_phases(request: Got, phases: dict[str, Got]) -> None:
    """Queue, prefill, decode back to back inside the request span, each naming the slot."""
    queue, prefill, decode = phases["queue"], phases["prefill"], phases["decode"]
    slack = 2_000_000  # 2 ms: the engine's clock and the wall clock are read at different moments
    assert request.start - slack <= queue.start <= queue.end <= prefill.start + 1000
    assert prefill.start <= prefill.end <= decode.start + 1000 <= decode.end + 1000
    assert decode.end <= request.end + slack
    slot = request.attributes["llamaserve.slot.id"]
    assert all(p.attributes["llamaserve.slot.id"] == slot for p in (queue, prefill, decode))
    assert decode.attributes["gen_ai.usage.output_tokens"] == request.attributes["gen_ai.usage.output_tokens"]


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def traced(model_path: str, collector: Collector, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("traced")
    args = ["-m", model_path, "-np", "2", "-c", "2048", "-t", "2", "--temp", "0", "--otlp-endpoint", collector.url]
    srv = start_server(args, tmp, env=FAST_EXPORT)
    yield srv
    stop_server(srv)


def test_a_request_span_follows_the_clients_traceparent_with_its_phases(
    traced: RunningServer, collector: Collector
) -> None:
    body = {"messages": PROMPT, "max_tokens": 4}
    first = httpx.post(f"{traced.url}/v1/chat/completions", json=body, timeout=60)  # a trace of its own
    again = httpx.post(f"{traced.url}/v1/chat/completions", json=body, headers=_traceparent(), timeout=60)
    assert first.status_code == 200 and again.status_code == 200, again.text
    spans = collector.wait(lambda s: _phases_done(s, "POST /v1/chat/completions"))
    (request,) = [s for s in spans if s.trace_id == TRACE_ID and s.parent_id == CLIENT_SPAN]
    assert any(s.name == request.name and s.parent_id == "" for s in spans)  # the first request's root span
    assert request.service == "llamaserve" and request.kind == Span.SPAN_KIND_SERVER
    usage = again.json()["usage"]
    attrs = request.attributes
    assert attrs["http.route"] == "/v1/chat/completions" and attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == again.json()["model"]
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"] == 4
    # The same prompt again: the slot's cache served most of it, and the span says how much.
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and attrs["gen_ai.usage.cache_read.input_tokens"] == cached
    assert attrs["gen_ai.response.finish_reasons"] == ["length"]
    phases = _children(spans, request)
    _check_phases(request, phases)
    assert phases["prefill"].attributes["llamaserve.prompt.processed_tokens"] == usage["prompt_tokens"] - cached


def test_a_streamed_answer_is_one_span_to_its_last_chunk(traced: RunningServer, collector: Collector) -> None:
    span_id = "2222222222222222"
    body = {"prompt": "The sky is", "n_predict": 3, "stream": True}
    with httpx.stream("POST", f"{traced.url}/completion", json=body, headers=_traceparent(span_id)) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[-1]["stop"] is True
    spans = collector.wait(lambda s: any(x.parent_id == span_id for x in s))
    (request,) = [s for s in spans if s.parent_id == span_id]
    assert request.name == "POST /completion"
    assert request.attributes["gen_ai.operation.name"] == "text_completion"
    assert request.attributes["gen_ai.usage.output_tokens"] == events[-1]["tokens_predicted"] == 3
    spans = collector.wait(lambda s: len(_children(s, request)) == 3)
    _check_phases(request, _children(spans, request))


def test_a_refused_request_is_a_span_with_its_status(traced: RunningServer, collector: Collector) -> None:
    span_id = "3333333333333333"
    r = httpx.post(f"{traced.url}/v1/chat/completions", json={"messages": "nope"}, headers=_traceparent(span_id))
    assert r.status_code == 400
    spans = collector.wait(lambda s: any(x.parent_id == span_id for x in s))
    (request,) = [s for s in spans if s.parent_id == span_id]
    assert request.attributes["http.response.status_code"] == 400 and request.attributes["error.type"] == "400"
    assert not request.error  # a client's mistake is not the server's error
    assert _children(spans, request) == {}


def test_the_front_forwards_its_span_as_the_parent(traced: RunningServer, collector: Collector, tmp_path: Path) -> None:
    env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
    front = start_server(["--upstreams", traced.url, "--otel"], tmp_path, env=env)
    try:
        span_id = "4444444444444444"
        body = {"messages": PROMPT, "max_tokens": 2}
        r = httpx.post(f"{front.url}/v1/chat/completions", json=body, headers=_traceparent(span_id), timeout=60)
        assert r.status_code == 200, r.text
        spans = collector.wait(lambda s: any(x.parent_id == span_id for x in s))
        (edge,) = [s for s in spans if s.parent_id == span_id]
        spans = collector.wait(lambda s: any(x.parent_id == edge.span_id for x in s))
    finally:
        stop_server(front)
    assert edge.service == "llamaserve-front" and edge.name == "POST /v1/chat/completions"
    assert edge.attributes["llamaserve.upstream"] == traced.url
    (request,) = [s for s in spans if s.parent_id == edge.span_id]
    assert request.service == "llamaserve" and request.trace_id == TRACE_ID
    assert edge.start <= request.start and request.end <= edge.end


def test_through_the_router_one_trace_from_client_to_decode(
    model_path: str, collector: Collector, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(model_path)
    env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "LLAMA_CACHE": str(tmp_path / "cache")}
    router = start_server(
        ["--models-dir", str(models), "-t", "2", "-np", "2", "-c", "1024", "--temp", "0"], tmp_path, env=env
    )
    try:
        span_id = "5555555555555555"
        body = {"model": "smol", "messages": PROMPT, "max_tokens": 3, "stream": True}
        with httpx.stream(
            "POST", f"{router.url}/v1/chat/completions", json=body, headers=_traceparent(span_id), timeout=180
        ) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]"
        spans = collector.wait(lambda s: any(x.parent_id == span_id for x in s))
        (edge,) = [s for s in spans if s.parent_id == span_id]
        spans = collector.wait(lambda s: any(len(_children(s, x)) == 3 for x in s if x.parent_id == edge.span_id))
    finally:
        stop_server(router)
    assert edge.service == "llamaserve-router" and edge.kind == Span.SPAN_KIND_SERVER
    assert edge.attributes["gen_ai.request.model"] == "smol"
    (request,) = [s for s in spans if s.parent_id == edge.span_id]
    assert request.service == "llamaserve" and request.name == "POST /v1/chat/completions"
    assert request.attributes["gen_ai.usage.output_tokens"] == 3
    _check_phases(request, _children(spans, request))
    assert {s.trace_id for s in (edge, request, *_children(spans, request).values())} == {TRACE_ID}
