"""A tiny stand-in for llamaserve's HTTP API, stdlib only, for developing and testing the web UI.

It serves the static UI at ``/`` and mimics the endpoints the page uses: ``GET /props``,
``GET /v1/models``, ``GET /slots``, ``GET /health`` and a streaming
``POST /v1/chat/completions`` (SSE ``data:`` lines, ``delta.reasoning_content``,
``delta.tool_calls``, a final chunk with ``timings``, then ``data: [DONE]``).

Run it like the real server::

    python tests/webui/fake_api.py --port 8080 [--api-key KEY] [--models a,b] [--token-delay 0.03]

The canned answer depends on the last user message: "long" streams ~600 tokens (for stopping),
"think" streams reasoning first, "tool" streams a tool call; anything else gets a short
Markdown answer with code and math. Unknown flags (``-m``, ``-c``, ``-np`` …) are accepted and
ignored, so the same command line works for both servers.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from llamaserve.webui import STATIC_DIR as STATIC  # noqa: E402  (stdlib-only module, no server deps)
from llamaserve.webui import headers_for  # noqa: E402

PUBLIC_PATHS = {"/health", "/v1/health", "/models", "/v1/models"}

DEFAULT_ANSWER = (
    "Sure! Here is a **short** answer with a list, some code and a formula.\n\n"
    "1. First, define a function:\n"
    "2. Then call it.\n\n"
    "```python\n"
    "def greet(name: str) -> str:\n"
    '    return f"Hello, {name}!"\n\n'
    'print(greet("llama"))\n'
    "```\n\n"
    "The energy is $E = mc^2$, and the area under $x^2$ is\n\n"
    "$$\\int_0^1 x^2\\,dx = \\frac{1}{3}$$\n\n"
    "| size | speed |\n|---|---|\n| 135M | fast |\n"
)
REASONING = "The user wants a short answer. Let me think about it step by step: recall the facts, then answer clearly."
THINK_ANSWER = "After thinking it over: the answer is **42**."


def pieces(text: str) -> list[str]:
    """Token-ish pieces: words with their trailing whitespace."""
    return re.findall(r"\S+\s*|\s+", text)


class FakeState:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.slots = [{"id": i, "n_ctx": args.ctx_size, "is_processing": False} for i in range(args.parallel)]
        self.cache: list[str] = []  # last prompt's message texts: a crude prompt cache

    @property
    def alias(self) -> str:
        if self.args.alias:
            return str(self.args.alias)
        return Path(self.args.model).name if self.args.model else "fake-model"

    def model_ids(self) -> list[str]:
        ids = [self.alias]
        ids += [m for m in (self.args.models or "").split(",") if m and m != self.alias]
        return ids

    def acquire(self) -> dict[str, Any] | None:
        with self.lock:
            for s in self.slots:
                if not s["is_processing"]:
                    s["is_processing"] = True
                    return s
        return None

    def release(self, slot: dict[str, Any]) -> None:
        with self.lock:
            slot["is_processing"] = False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-llamaserve/0"
    state: FakeState

    # ------------------------------------------------------------ plumbing
    def log_message(self, fmt: str, *args: Any) -> None:
        if self.state.args.verbose:
            sys.stderr.write("fake_api: " + fmt % args + "\n")

    def send_json(self, obj: Any, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str, typ: str) -> None:
        self.send_json({"error": {"code": status, "message": message, "type": typ}}, status)

    def authorised(self, path: str) -> bool:
        key = self.state.args.api_key
        if not key or path in PUBLIC_PATHS or self.command == "OPTIONS":
            return True
        if self.headers.get("Authorization", "") == f"Bearer {key}":
            return True
        self.send_error_json(401, "Invalid API Key", "authentication_error")
        return False

    def read_body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b"{}"
        return json.loads(raw or b"{}")

    # ------------------------------------------------------------ routes
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path in ("/health", "/v1/health"):
            self.send_json({"status": "ok"})
        elif path in ("/v1/models", "/models"):
            self.send_json(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": m,
                            "object": "model",
                            "created": 0,
                            "owned_by": "llamaserve",
                            "meta": {"n_ctx_train": self.state.args.ctx_size},
                        }
                        for m in self.state.model_ids()
                    ],
                }
            )
        elif path == "/props":
            if self.authorised(path):
                self.send_json(self.props())
        elif path == "/slots":
            if self.authorised(path):
                with self.state.lock:
                    self.send_json([dict(s) for s in self.state.slots])
        elif path == "/__fake/requests":
            with self.state.lock:
                self.send_json(self.state.requests)
        else:
            self.static(path)

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if not self.authorised(path):
            return
        if path in ("/v1/chat/completions", "/chat/completions"):
            try:
                body = self.read_body()
            except (ValueError, json.JSONDecodeError):
                self.send_error_json(400, "invalid JSON", "invalid_request_error")
                return
            with self.state.lock:
                self.state.requests.append(body)
            self.chat(body)
        else:
            self.send_error_json(404, "File Not Found", "not_found_error")

    def props(self) -> dict[str, Any]:
        a = self.state.args
        ui = json.loads(a.ui_settings) if a.ui_settings else {}
        return {
            "default_generation_settings": {
                "n_ctx": a.ctx_size,
                "params": {
                    "temperature": 0.8,
                    "top_k": 40,
                    "top_p": 0.95,
                    "min_p": 0.05,
                    "n_predict": -1,
                    "repeat_penalty": 1.0,
                    "seed": 4294967295,
                },
            },
            "total_slots": a.parallel,
            "model_alias": self.state.alias,
            "model_path": a.model or "/models/fake-model.gguf",
            "ui_settings": ui,
            "build_info": "fake",
            "modalities": {kind: kind in a.modalities.split(",") for kind in ("vision", "video", "audio")},
        }

    def static(self, path: str) -> None:
        rel = "index.html" if path in ("", "/") else path.lstrip("/")
        target = (STATIC / rel).resolve()
        if STATIC.resolve() not in target.parents or not target.is_file():
            self.send_error_json(404, "File Not Found", "not_found_error")
            return
        data = target.read_bytes()
        ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if target.suffix in (".js", ".mjs"):
            ctype = "text/javascript"
        if ctype.startswith("text/") or ctype in ("application/json", "image/svg+xml"):
            ctype += "; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers_for(target.name).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    # ------------------------------------------------------------ chat
    def script(self, body: dict[str, Any]) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        msgs = body.get("messages") or []
        last = next((m for m in reversed(msgs) if m.get("role") == "user"), {})
        text = str(last.get("content") or "").lower()
        if "long" in text:
            return [], [f"word{i} " for i in range(600)], []
        if "think" in text:
            return pieces(REASONING), pieces(THINK_ANSWER), []
        if "tool" in text:
            calls = [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
                {"index": 0, "function": {"arguments": '{"city": '}},
                {"index": 0, "function": {"arguments": '"Paris"}'}},
            ]
            return [], pieces("Let me check the weather."), calls
        return [], pieces(DEFAULT_ANSWER), []

    def chat(self, body: dict[str, Any]) -> None:
        slot = self.state.acquire()
        if slot is None:
            self.send_error_json(503, "no slot available", "unavailable_error")
            return
        try:
            if body.get("stream"):
                self.stream_chat(body)
            else:
                reasoning, answer, _calls = self.script(body)
                msg: dict[str, Any] = {"role": "assistant", "content": "".join(answer)}
                if reasoning:
                    msg["reasoning_content"] = "".join(reasoning)
                self.send_json(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": self.state.alias,
                        "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                        "timings": self.timings(body, len(answer), 10.0),
                    }
                )
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            if self.state.args.verbose:
                sys.stderr.write("fake_api: client disconnected, slot freed\n")
        finally:
            self.state.release(slot)

    def timings(self, body: dict[str, Any], n_gen: int, gen_ms: float) -> dict[str, Any]:
        texts = [str(m.get("content") or "") for m in body.get("messages") or []]
        total = sum(len(t) for t in texts) // 4 + 8
        cached_texts = 0
        for a, b in zip(self.state.cache, texts, strict=False):
            if a != b:
                break
            cached_texts += 1
        cache_n = sum(len(t) for t in texts[:cached_texts]) // 4
        self.state.cache = texts
        prompt_n = max(1, total - cache_n)
        prompt_ms = prompt_n * 0.8 + 3
        return {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3),
            "prompt_per_second": round(1000 * prompt_n / prompt_ms, 3),
            "predicted_n": n_gen,
            "predicted_ms": round(gen_ms, 3),
            "predicted_per_token_ms": round(gen_ms / max(1, n_gen), 3),
            "predicted_per_second": round(1000 * n_gen / max(gen_ms, 1e-6), 3),
        }

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def event(self, obj: Any) -> None:
        self.write_chunk(f"data: {json.dumps(obj)}\n\n".encode())

    def stream_chat(self, body: dict[str, Any]) -> None:
        delay = self.state.args.token_delay
        reasoning, answer, calls = self.script(body)
        max_tokens = body.get("max_tokens", body.get("n_predict", -1))
        if isinstance(max_tokens, int) and max_tokens >= 0:
            answer = answer[:max_tokens]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        env = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model") or self.state.alias,
        }

        def delta(d: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
            self.event({**env, "choices": [choice], **extra})

        t0 = time.perf_counter()
        delta({"role": "assistant", "content": None})
        for p in reasoning:
            time.sleep(delay)
            delta({"reasoning_content": p})
        for p in answer:
            time.sleep(delay)
            delta({"content": p})
        for c in calls:
            time.sleep(delay)
            delta({"tool_calls": [c]})
        gen_ms = (time.perf_counter() - t0) * 1000
        finish = "tool_calls" if calls else ("length" if len(answer) == max_tokens else "stop")
        delta({}, finish, timings=self.timings(body, len(reasoning) + len(answer) + len(calls), gen_ms))
        self.write_chunk(b"data: [DONE]\n\n")
        self.write_chunk(b"")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-m", "--model", default="")
    p.add_argument("-a", "--alias", default="")
    p.add_argument("--api-key", default="")
    p.add_argument("--models", default="", help="extra model ids for /v1/models, comma separated")
    p.add_argument("--ui-settings", default="", help="JSON object returned as /props ui_settings")
    p.add_argument("--modalities", default="", help="what /props says the model takes: vision,audio")
    p.add_argument("--token-delay", type=float, default=0.03, help="seconds between streamed pieces")
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-np", "--parallel", type=int, default=2)
    p.add_argument("-v", "--verbose", action="store_true")
    args, _unknown = p.parse_known_args(argv)
    return args


def serve(args: argparse.Namespace) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": FakeState(args)})
    httpd = ThreadingHTTPServer((args.host, args.port), handler)
    httpd.daemon_threads = True
    return httpd


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    httpd = serve(args)
    print(f"fake_api listening on http://{args.host}:{httpd.server_address[1]}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
