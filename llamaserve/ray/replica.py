"""One Ray Serve replica: our single-model server as a child process on a loopback port.

The replica starts `python -m llamaserve <flags> --host 127.0.0.1 --port <free>` with a pipe
on its stdin (`LLAMASERVE_ROUTER_CHILD=1`: the child exits when the replica's process dies,
so a replica Ray kills leaves no server behind), waits for its `/health`, and then relays
each request the ingress hands it: first a dict with the status, the headers and this
replica's id, then the body's chunks as they arrive. Ray's health check is the child's
own `/health`, so a dead or stuck engine makes Ray replace the replica.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from llamaserve.edge.proxy import transparent_headers
from llamaserve.errors import APIError
from llamaserve.sse import data_event, named_event

CHILD_HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
HEALTH_TIMEOUT_S = 10.0
_DROP_RESPONSE = {"server", "date", "transfer-encoding", "content-length", "keep-alive", "connection"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((CHILD_HOST, 0))
        return int(s.getsockname()[1])


def child_argv(argv: list[str], port: int) -> list[str]:
    """The replica's flags with its own loopback address (the ingress has the public one)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--host", "--port"):
            skip = True
            continue
        if arg.startswith(("--host=", "--port=")):
            continue
        out.append(arg)
    return [sys.executable, "-m", "llamaserve", *out, "--host", CHILD_HOST, "--port", str(port)]


def stream_error(path: str, message: str) -> bytes:
    error = APIError(message, "server_error")
    if path.startswith("/v1/messages"):
        return named_event("error", error.anthropic_body())
    return data_event(error.openai_body())


class Engine:
    """The child server of one replica (the Ray deployment class wraps this)."""

    def __init__(self, argv: list[str], replica_id: str) -> None:
        self.replica_id = replica_id
        self.port = _free_port()
        self.base_url = f"http://{CHILD_HOST}:{self.port}"
        env = {**os.environ, "LLAMASERVE_ROUTER_CHILD": "1"}
        # The child runs the same llamaserve as this replica (a source tree Ray put on sys.path too).
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.process = subprocess.Popen(child_argv(argv, self.port), stdin=subprocess.PIPE, env=env)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llamaserve child exited with {self.process.returncode} while starting")
            try:
                if httpx.get(self.base_url + "/health", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.process.kill()
        raise RuntimeError("the llamaserve child did not become ready")

    async def check_health(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the llamaserve child exited with {self.process.returncode}")
        answer = await self.client.get(self.base_url + "/health", timeout=HEALTH_TIMEOUT_S)
        if answer.status_code != 200:
            raise RuntimeError(f"the llamaserve child's /health answered {answer.status_code}")

    async def forward(
        self, method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes
    ) -> AsyncIterator[Any]:
        url = self.base_url + path + (f"?{query}" if query else "")
        request = self.client.build_request(method, url, headers=transparent_headers(headers), content=body)
        upstream = await self.client.send(request, stream=True)
        try:
            kept = [
                (k, v)
                for k, v in upstream.headers.multi_items()
                if k.lower() not in _DROP_RESPONSE and not k.lower().startswith("access-control-")
            ]
            yield {"status": upstream.status_code, "headers": kept, "replica": self.replica_id, "pid": os.getpid()}
            is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            except httpx.HTTPError:
                if is_sse:
                    yield stream_error(path, "the model server stopped while answering")
        finally:
            # Also when the ingress's client disconnects (Ray cancels this generator): the
            # child sees the connection close and frees the slot.
            await upstream.aclose()

    def shutdown(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
