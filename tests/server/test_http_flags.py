"""llama-server's HTTP flags on a real server: --api-prefix, --host (TCP + UNIX socket),
--reuse-port, --sse-ping-interval, CORS, --tags, --log-jsonl, --log-prompts-dir.

Two servers: one with every flag set, one with the defaults (the default CORS policy,
unprefixed routes, a port without SO_REUSEPORT).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server

PREFIX = "/x"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


@pytest.fixture(scope="module")
def flagged(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("flagged")
    sock = tmp / "llama.sock"
    srv = start_server(
        [
            "-m",
            model_path,
            "-np",
            "1",
            "-c",
            "2048",
            "-t",
            "2",
            "--api-prefix",
            PREFIX,
            "--host",
            f"127.0.0.1,{sock}",
            "--reuse-port",
            "--threads-http",
            "4",
            "--sse-ping-interval",
            "1",
            "--cors-origins",
            "localhost",
            "--cors-methods",
            "GET,POST",
            "--cors-headers",
            "Content-Type,Authorization",
            "--tags",
            "beta, alpha,beta",
            "--log-jsonl",
            "--log-prompts-dir",
            str(tmp / "prompts"),
        ],
        tmp,
        health_path=f"{PREFIX}/health",
    )
    yield srv, tmp
    stop_server(srv)


@pytest.fixture(scope="module")
def plain(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("plain")
    srv = start_server(["-m", model_path, "-np", "1", "-c", "512", "-t", "2"], tmp)
    yield srv
    stop_server(srv)


def _port(srv: RunningServer) -> int:
    return int(srv.url.rsplit(":", 1)[1])


# --api-prefix


def test_routes_answer_under_the_prefix_only(flagged: tuple[RunningServer, Path]) -> None:
    srv = flagged[0]
    assert httpx.get(f"{srv.url}{PREFIX}/health").status_code == 200
    assert httpx.get(f"{srv.url}{PREFIX}/v1/models").status_code == 200
    # llama-server registers each route as prefix + path: the bare path is a 404.
    bare = httpx.get(f"{srv.url}/health")
    assert bare.status_code == 404
    assert bare.json()["error"] == {"message": "File Not Found", "type": "not_found_error", "code": 404}
    r = httpx.post(f"{srv.url}{PREFIX}/completion", json={"prompt": "Hello", "n_predict": 2})
    assert r.status_code == 200 and "content" in r.json()


def test_unprefixed_routes_without_the_flag(plain: RunningServer) -> None:
    assert httpx.get(f"{plain.url}/health").status_code == 200
    assert httpx.get(f"{plain.url}/x/health").status_code == 404


# --host a,b.sock and --reuse-port


def test_every_host_listens_and_is_logged(flagged: tuple[RunningServer, Path]) -> None:
    srv, tmp = flagged
    sock = tmp / "llama.sock"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as client:
        r = client.get(f"http://localhost{PREFIX}/v1/models")
    assert r.status_code == 200 and r.json()["data"]
    messages = [json.loads(line)["msg"] for line in srv.log().splitlines() if line.startswith("{")]
    assert f"server listening on http://127.0.0.1:{_port(srv)}" in messages
    assert f"server listening on unix://{sock}" in messages


def _bind_beside(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))


def test_reuse_port_lets_a_second_socket_bind(flagged: tuple[RunningServer, Path], plain: RunningServer) -> None:
    _bind_beside(_port(flagged[0]))  # both sockets carry SO_REUSEPORT: Linux allows it
    with pytest.raises(OSError):
        _bind_beside(_port(plain))  # the server's socket does not


# --tags


def test_tags_are_shown_in_v1_models(flagged: tuple[RunningServer, Path], plain: RunningServer) -> None:
    assert httpx.get(f"{flagged[0].url}{PREFIX}/v1/models").json()["data"][0]["tags"] == ["alpha", "beta"]
    assert httpx.get(f"{plain.url}/v1/models").json()["data"][0]["tags"] == []


# CORS


def test_default_cors_reflects_the_origin_with_credentials(plain: RunningServer) -> None:
    r = httpx.get(f"{plain.url}/health", headers={"Origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-credentials" not in r.headers  # preflights only, as llama-server
    assert "access-control-allow-origin" not in httpx.get(f"{plain.url}/health").headers
    pre = httpx.options(f"{plain.url}/v1/chat/completions", headers={"Origin": "https://app.example", **PREFLIGHT})
    assert pre.status_code == 200 and pre.content == b""
    cors = {k: v for k, v in pre.headers.items() if k.startswith("access-control-")}
    assert cors == {
        "access-control-allow-origin": "https://app.example",
        "access-control-allow-credentials": "true",
        "access-control-allow-methods": "GET, POST, DELETE, OPTIONS",
        "access-control-allow-headers": "*",
    }
    assert pre.headers["content-type"] == "text/html"


def test_cors_header_names_go_on_the_wire_spelled_as_llama_server_spells_them(plain: RunningServer) -> None:
    """Clients that copy headers into a plain dict look the names up with llama-server's case."""
    with socket.create_connection(("127.0.0.1", _port(plain)), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head = raw.split(b"\r\n\r\n", 1)[0]
    assert raw.startswith(b"HTTP/1.1 200")
    assert b"\r\nAccess-Control-Allow-Origin: https://app.example" in head
    assert b"\r\naccess-control-allow-origin:" not in head


@pytest.mark.parametrize(
    "origin",
    ["http://localhost", "http://localhost:8080", "https://127.0.0.1:3000", "http://[::1]", "http://[::1]:3000"],
)
def test_localhost_origins_are_reflected(flagged: tuple[RunningServer, Path], origin: str) -> None:
    srv = flagged[0]
    pre = httpx.options(f"{srv.url}{PREFIX}/completion", headers={"Origin": origin, **PREFLIGHT})
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == origin
    assert pre.headers["access-control-allow-methods"] == "GET, POST"
    assert pre.headers["access-control-allow-headers"] == "Content-Type, Authorization"
    assert httpx.get(f"{srv.url}{PREFIX}/health", headers={"Origin": origin}).headers[
        "access-control-allow-origin"
    ] == (origin)


@pytest.mark.parametrize(
    "origin", ["http://localhost.evil.com", "http://notlocalhost", "http://evil.com", "localhost", "ftp://localhost"]
)
def test_look_alikes_of_localhost_are_refused(flagged: tuple[RunningServer, Path], origin: str) -> None:
    srv = flagged[0]
    pre = httpx.options(f"{srv.url}{PREFIX}/completion", headers={"Origin": origin, **PREFLIGHT})
    assert pre.status_code == 200 and "access-control-allow-origin" not in pre.headers
    assert (
        "access-control-allow-origin" not in httpx.get(f"{srv.url}{PREFIX}/health", headers={"Origin": origin}).headers
    )


# --sse-ping-interval


def test_a_queued_stream_gets_pings(flagged: tuple[RunningServer, Path]) -> None:
    """-np 1: a stream that waits behind another gets `:\\n\\n` each quiet second, then its answer."""
    url = f"{flagged[0].url}{PREFIX}/completion"
    busy_started = threading.Event()
    stop_busy = threading.Event()

    def hold_the_slot() -> None:
        body = {"prompt": "Count:", "n_predict": 1500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=60) as r:
            for _ in r.iter_bytes():
                busy_started.set()
                if stop_busy.is_set():
                    return  # closing the stream aborts the generation and frees the slot

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    try:
        assert busy_started.wait(60)
        received = b""
        start = time.monotonic()
        with httpx.stream("POST", url, json={"prompt": "Hi", "n_predict": 4, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()
            while b":\n\n:\n\n" not in received:
                received += next(chunks)
            assert time.monotonic() - start >= 2  # two quiet seconds, one ping each
            assert b"data:" not in received
            stop_busy.set()
            for chunk in chunks:
                received += chunk
        events = [json.loads(line[6:]) for line in received.decode().split("\n") if line.startswith("data: ")]
        assert events and events[-1]["stop"] is True
    finally:
        stop_busy.set()
        holder.join(60)


# --log-jsonl, --log-prompts-dir


def test_log_lines_are_json_objects(flagged: tuple[RunningServer, Path]) -> None:
    lines = [line for line in flagged[0].log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and all(r["type"] == "log" and r["level"] in ("debug", "info", "warn", "error") for r in records)
    assert all("\033[" not in line for line in lines)
    assert any("model loaded" in r["msg"] for r in records)


def test_each_prompt_and_answer_is_written_down(flagged: tuple[RunningServer, Path]) -> None:
    srv, tmp = flagged
    before = set((tmp / "prompts").glob("*.txt"))
    r = httpx.post(f"{srv.url}{PREFIX}/completion", json={"prompt": "Paris is the capital of", "n_predict": 4})
    answer = r.json()["content"]
    written = set((tmp / "prompts").glob("*.txt")) - before
    assert len(written) == 1
    text = written.pop().read_text(encoding="utf-8")
    assert text.startswith("Paris is the capital of") or "Paris is the capital of" in text
    assert text.endswith("\n\n----- answer -----\n" + answer)
