"""The start-up the single-model server, the router and the front share (llamaserve/api/run.py).

Each process's own behaviour is tested end to end in tests/server (test_lifecycle, test_router,
test_upstreams, test_http_flags); here the shared order itself: the hooks around uvicorn, a stop
asked before or while uvicorn runs, SIGTERM ending the serving cleanly, and the sockets and
signal handlers given back afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from llamaserve.api.listen import open_listeners
from llamaserve.api.run import ASGIApp, Site, StopSwitch, bind, run_server
from llamaserve.config import ServerConfig


async def _hello(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


class _Recorder(Site):
    """A site that notes each hook, answers one request from beside the app, then stops."""

    def __init__(self, port: int, stop_by: str) -> None:
        self.port = port
        self.stop_by = stop_by
        self.calls: list[str] = []
        self.answer = b""
        self.task: asyncio.Task[None] | None = None

    def begin(self, stop: StopSwitch) -> None:
        self.calls.append("begin")

    async def open(self, stop: StopSwitch) -> ASGIApp:
        self.calls.append("open")
        self.task = asyncio.create_task(self._ask_then_stop(stop))
        return _hello

    async def _ask_then_stop(self, stop: StopSwitch) -> None:
        url = f"http://127.0.0.1:{self.port}/"
        for _ in range(100):  # uvicorn starts listening shortly after open() returns
            try:
                self.answer = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
                break
            except OSError:
                await asyncio.sleep(0.05)
        if self.stop_by == "signal":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            stop.request()

    async def close(self) -> None:
        self.calls.append("close")
        if self.task is not None:
            await self.task

    def end(self) -> None:
        self.calls.append("end")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("stop_by", ["switch", "signal"])
def test_the_hooks_run_in_order_and_everything_is_given_back(stop_by: str) -> None:
    config = ServerConfig(host="127.0.0.1", port=_free_port())
    listeners = open_listeners(config)
    site = _Recorder(config.port, stop_by)
    before = signal.getsignal(signal.SIGTERM)
    run_server(config, listeners, site)  # SIGTERM here would kill pytest unless run_server catches it
    assert site.answer == b"hello"
    assert site.calls == ["begin", "open", "close", "end"]
    assert all(listener.sock.fileno() == -1 for listener in listeners)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_asked_before_uvicorn_runs_is_kept() -> None:
    """A signal during start-up (or a model that fails at once) must still stop the server."""
    switch = StopSwitch()
    switch.request()
    assert switch.requested
    server = uvicorn.Server(uvicorn.Config(_hello))
    switch.attach(server)
    assert server.should_exit


def test_the_switch_sees_uvicorns_own_stop() -> None:
    """uvicorn sets should_exit itself when it catches a signal; the switch reads that flag."""
    switch = StopSwitch()
    server = uvicorn.Server(uvicorn.Config(_hello))
    switch.attach(server)
    assert not switch.requested
    server.should_exit = True
    assert switch.requested


def test_a_busy_address_is_logged_and_no_socket_is_left(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sock_path = str(tmp_path / "a.sock")
        config = ServerConfig(host=f"{sock_path},127.0.0.1", port=port)
        assert bind(config, logging.getLogger("test")) is None
    assert "couldn't bind HTTP server socket" in caplog.text
    assert not os.path.exists(sock_path)  # the UNIX socket bound first was closed and removed
