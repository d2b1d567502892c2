"""What OpenTelemetry tracing costs: streamed chat at a few concurrent clients, traces on vs off.

Two servers on the same model start once: one plain, one with `--otlp-endpoint` to a small
collector this script runs (it decodes every export, so the spans are really built, batched,
serialized and sent). They take turns (A B, B A, ...: a slow spell of the shared machine falls
on both); in a turn each of `--clients` clients sends `--requests` streamed chat completions
of `--tokens` tokens (`ignore_eos`), one after another. Reported per client count: the median
aggregate rate (completion tokens over the turn's wall time), the median time to first
token, and the cost, 1 - on/off. `--micro N` times the tracing middleware and the phase
spans alone, in process, per request.

    .venv/bin/python benchmarks/trace_bench.py --turns 4 --clients 4,16 --tokens 32 --requests 3
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_bench import default_model
from serve_bench import ServerProcess, free_port, wait_healthy

PROMPT = "Write a long story about a lighthouse keeper and the sea."


class Sink:
    """An OTLP/HTTP receiver that counts the spans it is sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers.get("content-length", "0"))))
                sink.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


async def client_loop(client: httpx.AsyncClient, url: str, args: argparse.Namespace) -> tuple[int, list[float]]:
    """Completion tokens this client received, and each request's time to first token."""
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    tokens, ttfts = 0, []
    for _ in range(args.requests):
        start = time.perf_counter()
        first = None
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as res:
            res.raise_for_status()
            async for line in res.aiter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    if any(c.get("delta", {}).get("content") for c in event.get("choices", ())):
                        tokens += 1
                        first = first or time.perf_counter() - start
        ttfts.append(first or 0.0)
    return tokens, ttfts


async def turn(client: httpx.AsyncClient, url: str, clients: int, args: argparse.Namespace) -> tuple[float, float]:
    """(aggregate tokens per second, median TTFT in ms) of one turn."""
    start = time.perf_counter()
    results = await asyncio.gather(*(client_loop(client, url, args) for _ in range(clients)))
    rate = sum(n for n, _ in results) / (time.perf_counter() - start)
    return rate, statistics.median(t for _, ts in results for t in ts) * 1e3


async def run(args: argparse.Namespace) -> None:
    model = args.model or default_model()
    levels = [int(c) for c in args.clients.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="trace-bench-"))
    sink = Sink()
    slots = max(levels)
    common = [sys.executable, "-m", "llamaserve", "-m", model, "-t", str(args.threads), "-np", str(slots)]
    common += ["-c", str(slots * 256), "--responses-db", str(tmp / "r.sqlite3")]
    servers: dict[str, tuple[ServerProcess, str]] = {}
    for name, extra in (("off", []), ("on", ["--otlp-endpoint", sink.url])):
        port = free_port()
        proc = ServerProcess([*common, "--port", str(port), *extra], tmp / f"{name}.log")
        proc.start()
        servers[name] = (proc, f"http://127.0.0.1:{port}")
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        limits = httpx.Limits(max_connections=slots * 2, max_keepalive_connections=slots * 2)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            for proc, url in servers.values():
                await wait_healthy(client, url, 180, proc.alive)
            for _, url in servers.values():  # warm-up: connections, compute buffers
                await turn(client, url, slots, argparse.Namespace(tokens=4, requests=1))
            for clients in levels:
                for i in range(args.turns):
                    order = ("off", "on") if i % 2 == 0 else ("on", "off")
                    for name in order:
                        rate, ttft = await turn(client, servers[name][1], clients, args)
                        results.setdefault((name, clients), []).append((rate, ttft))
                        print(f"{clients:3d} clients, turn {i + 1} {name:>3}: {rate:7.1f} tok/s, TTFT {ttft:6.1f} ms")
    finally:
        for proc, _ in servers.values():
            proc.stop(20)
    for clients in levels:
        off, on = results[("off", clients)], results[("on", clients)]
        rate_off, rate_on = statistics.median(r for r, _ in off), statistics.median(r for r, _ in on)
        ttft_off, ttft_on = statistics.median(t for _, t in off), statistics.median(t for _, t in on)
        pairs = [1 - b[0] / a[0] for a, b in zip(off, on, strict=True)]
        print(
            f"{clients} clients: off {rate_off:.1f} tok/s, on {rate_on:.1f} tok/s, cost {100 * (1 - rate_on / rate_off):+.1f}% "
            f"(per turn {100 * min(pairs):+.1f}..{100 * max(pairs):+.1f}%); TTFT p50 off {ttft_off:.1f} ms, on {ttft_on:.1f} ms"
        )
    print(f"spans the collector received: {sink.spans}")


def micro(n: int) -> None:
    """The request span and its three phase spans, built in process with the batch processor."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from llamaserve.engine.types import Finished, Timings
    from llamaserve.telemetry.hook import note_finished
    from llamaserve.telemetry.middleware import TracingMiddleware
    from llamaserve.telemetry.provider import build_provider, tracer_of

    class Discard(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer = tracer_of(build_provider(Discard(), "bench"))

    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        timings = Timings(cache_n=10, prompt_n=20, prompt_ms=5.0, predicted_n=32, predicted_ms=50.0, queue_ms=1.0)
        note_finished(0, Finished("limit", "", 30, 10, 32, timings, id_slot=0, t_done=time.perf_counter()))
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def go(wrapped: object) -> float:
        headers = [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]

        async def receive() -> dict:  # type: ignore[type-arg]
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:  # type: ignore[type-arg]
            pass

        start = time.perf_counter()
        for _ in range(n):
            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
            await wrapped(scope, receive, send)  # type: ignore[operator]
        return (time.perf_counter() - start) / n * 1e6

    bare = asyncio.run(go(app))
    traced = asyncio.run(go(TracingMiddleware(app, tracer, model="m")))  # type: ignore[arg-type]
    print(f"per request: {traced - bare:.1f} µs of tracing (request span + queue/prefill/decode, batched export)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--clients", default="4,16", help="comma-separated client counts")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro", type=int, default=0, help="only time the tracing code alone over N requests")
    args = parser.parse_args()
    if args.micro:
        micro(args.micro)
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
