"""docker/entrypoint.sh, the images' entry point, run here without Docker.

The script is run as the image runs it, with the installed `llama-server` on PATH
and the configuration in `LLAMA_ARG_*` variables only, as `docker run -e` or
compose's `environment:` would pass it. One server at a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import REPO, free_port

ENTRYPOINT = REPO / "docker" / "entrypoint.sh"


def _clean_env(tmp: Path, extra: dict[str, str]) -> dict[str, str]:
    # The outer environment's LLAMA_ARG_* would leak into the server: only the test's own count.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # The venv's console script must import this checkout, not whichever tree the venv was installed from.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["LLAMA_ARG_RESPONSES_DB"] = str(tmp / "responses.sqlite3")
    env["LLAMA_ARG_THREADS"] = "2"
    # An empty download cache: with models cached, no model named would start a router.
    env["LLAMA_CACHE"] = str(tmp / "cache")
    return {**env, **extra}


class Entrypoint:
    def __init__(self, args: list[str], env: dict[str, str], port: int, tmp: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = tmp / f"entrypoint-{port}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 -- the server writes to it until it stops
        self.proc = subprocess.Popen(
            ["sh", str(ENTRYPOINT), *args], cwd=tmp, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"entrypoint exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture()
def run_entrypoint(tmp_path: Path) -> Iterator[list[Entrypoint]]:
    started: list[Entrypoint] = []
    yield started
    for ep in started:
        ep.stop()


def test_variables_alone_configure_the_image_defaults_fill_the_rest(
    tmp_path: Path, run_entrypoint: list[Entrypoint], model_path: str
) -> None:
    port = free_port()
    env = _clean_env(
        tmp_path,
        {
            "LLAMA_ARG_PORT": str(port),
            "LLAMA_ARG_CTX_SIZE": "3072",
            "LLAMA_ARG_N_PARALLEL": "3",
            "LLAMA_ARG_ENDPOINT_METRICS": "1",
        },
    )
    ep = Entrypoint([], env, port, tmp_path)
    run_entrypoint.append(ep)

    props = httpx.get(f"{ep.url}/props", timeout=10).json()
    assert props["total_slots"] == 3
    assert props["default_generation_settings"]["n_ctx"] == 1024  # 3072 over 3 slots of their own
    assert props["endpoint_metrics"] is True
    assert os.path.realpath(props["model_path"]) == os.path.realpath(model_path)  # none named: the embedded one
    metrics = httpx.get(f"{ep.url}/metrics", timeout=10)
    assert metrics.status_code == 200 and "llamacpp:" in metrics.text
    # The image's host default: every interface, as llama.cpp's server image.
    assert f"server listening on http://0.0.0.0:{port}" in ep.log()


def test_flags_beat_variables_and_a_users_variable_beats_the_image_default(
    tmp_path: Path, run_entrypoint: list[Entrypoint]
) -> None:
    port, unused = free_port(), free_port()
    env = _clean_env(
        tmp_path,
        {
            "LLAMA_ARG_HOST": "127.0.0.1",
            "LLAMA_ARG_PORT": str(unused),
            "LLAMA_ARG_CTX_SIZE": "4096",
            "LLAMA_ARG_N_PARALLEL": "4",
        },
    )
    ep = Entrypoint(["--port", str(port), "-c", "2048", "-np", "2"], env, port, tmp_path)
    run_entrypoint.append(ep)

    props = httpx.get(f"{ep.url}/props", timeout=10).json()
    assert props["total_slots"] == 2
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert httpx.get(f"{ep.url}/metrics", timeout=10).status_code != 200  # not asked for: off
    assert f"server listening on http://127.0.0.1:{port}" in ep.log()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{unused}/health", timeout=2)
