"""The process around the requests: -to/--timeout bounds stalled reads but not long answers,
SIGTERM/SIGINT end the process cleanly with 0, a terminal shows the model loading."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import REPO, RunningServer, free_port, start_server

TIMEOUT_S = 1
# One thread: llama.cpp's threads spin at barriers, which on a busy 2-core machine can slow
# decoding a hundredfold; one thread keeps these tests' timing steady.


@pytest.fixture(scope="module")
def timeout_server(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        ["-m", model_path, "-c", "8192", "-np", "2", "-t", "1", "--timeout", str(TIMEOUT_S)],
        tmp_path_factory.mktemp("timeout"),
    )
    yield srv
    # Ctrl-C ends it like SIGTERM does: a clean shutdown, exit code 0.
    srv.process.send_signal(signal.SIGINT)
    assert srv.process.wait(timeout=20) == 0, srv.log()


def _address(srv: RunningServer) -> tuple[str, int]:
    host, port = srv.url.removeprefix("http://").split(":")
    return host, int(port)


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - start
        data += chunk


def test_a_stalled_body_gets_408_and_the_connection_closes(timeout_server: RunningServer) -> None:
    with socket.create_connection(_address(timeout_server)) as sock:
        sock.sendall(
            b"POST /completion HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"prompt":'
        )  # 10 of the 100 bytes promised
        data, waited = _read_until_closed(sock, 20)
    assert TIMEOUT_S * 0.9 <= waited < TIMEOUT_S + 8
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), data
    error = json.loads(body)["error"]
    assert error["code"] == 408 and "timed out" in error["message"]
    assert "timed out" in timeout_server.log()


def test_stalled_headers_and_idle_connections_are_closed(timeout_server: RunningServer) -> None:
    with socket.create_connection(_address(timeout_server)) as sock:
        sock.sendall(b"POST /completion HTTP/1.1\r\nHost: te")
        data, waited = _read_until_closed(sock, 20)
    assert data.startswith(b"HTTP/1.1 408") and waited < TIMEOUT_S + 8
    with socket.create_connection(_address(timeout_server)) as sock:
        data, waited = _read_until_closed(sock, 20)
    assert data == b"" and waited < TIMEOUT_S + 8


def test_answers_longer_than_the_timeout_are_not_cut(timeout_server: RunningServer) -> None:
    # ignore_eos with a budget far beyond what any machine writes in a few seconds: the
    # stream is read until it has outlived the timeout three times over, whatever the speed.
    request = {"prompt": "Once upon a time", "n_predict": 4000, "ignore_eos": True, "temperature": 0}
    outlive_s = 3 * TIMEOUT_S
    start = time.monotonic()
    late_events = 0
    tokens = 0
    with httpx.stream("POST", f"{timeout_server.url}/completion", json={**request, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                assert not event["stop"], "the 4000-token stream ended before it outlived the timeout"
                tokens += 1
                if time.monotonic() - start > outlive_s:
                    late_events += 1
                    if late_events >= 5:
                        break  # still streaming well past the timeout: not cut
    assert late_events >= 5
    # A non-streamed answer computed for longer than the timeout is not a stalled read either:
    # ask for as many tokens as the stream produced in twice the timeout.
    rate = tokens / (time.monotonic() - start)
    n_predict = max(16, int(rate * 2 * TIMEOUT_S))
    t0 = time.monotonic()
    r = httpx.post(f"{timeout_server.url}/completion", json={**request, "n_predict": n_predict}, timeout=120)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == n_predict
    assert time.monotonic() - t0 > TIMEOUT_S


def test_sigterm_during_a_stream_exits_0_within_bounds(model_path: str, tmp_path: Path) -> None:
    srv = start_server(["-m", model_path, "-c", "8192", "-np", "1", "-t", "1"], tmp_path)
    first_chunk = threading.Event()
    outcome: list[str] = []

    def stream() -> None:
        body = {"prompt": "Write a long story.", "n_predict": 8000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{srv.url}/completion", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        first_chunk.set()
            outcome.append("ended")
        except httpx.HTTPError as exc:
            outcome.append(type(exc).__name__)
        finally:
            first_chunk.set()

    client = threading.Thread(target=stream)
    client.start()
    try:
        assert first_chunk.wait(60), srv.log()
        start = time.monotonic()
        srv.process.send_signal(signal.SIGTERM)
        code = srv.process.wait(timeout=15)
        took = time.monotonic() - start
    finally:
        if srv.process.poll() is None:
            srv.process.kill()
        client.join(30)
    assert code == 0, srv.log()
    # The stream was cut after the grace period, but ended the normal way (its last chunk), not broken off.
    assert took < 15 and outcome == ["ended"], (took, outcome)
    assert "Traceback" not in srv.log(), srv.log()


def test_a_terminal_shows_the_loading_bar(model_path: str) -> None:
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamaserve", "--port", str(free_port()), "-m", model_path, "-c", "1024", "-t", "1"],
        cwd=REPO,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"server listening" not in seen and time.monotonic() < deadline:
            if select.select([controller], [], [], 1.0)[0]:
                try:
                    seen += os.read(controller, 65536)
                except OSError:  # the process closed the terminal
                    break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    assert b"\rloading model [" in seen and b"] 100%" in seen, seen[-2000:]
