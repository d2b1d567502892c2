"""Command lines from llama-server's documentation and common tutorials start our server unchanged.

Each one either serves a chat request or, for a feature that is filed but not built, exits 1 with a
message that names the feature. The model path stands in for the one the tutorial downloads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import start_server, stop_server

SERVES: dict[str, list[str]] = {
    "readme basic": ["-c", "2048"],
    "gpu tutorial": ["-ngl", "99", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--jinja", "-c", "32768", "--no-mmap"],
    "built-in template": ["--chat-template", "llama3", "--no-jinja", "-c", "2048"],
    "team server": ["--host", "127.0.0.1", "-c", "4096", "-np", "4", "--cont-batching", "--metrics", "--slots"],
    "batching knobs": ["-t", "2", "-tb", "2", "-b", "512", "-ub", "512", "--mlock", "--no-warmup", "-cb", "-kvu"],
    "reasoning": ["--jinja", "--reasoning", "on", "--reasoning-format", "deepseek", "--reasoning-budget", "-1"],
    "long context": ["--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", "8192", "-c", "16384"],
    "placement": [
        "-sm",
        "none",
        "-mg",
        "0",
        "-ts",
        "1",
        "-dev",
        "none",
        "-ot",
        "token_embd=CPU",
        "-nr",
        "--numa",
        "distribute",
    ],
    "sampling defaults": [
        "--seed",
        "42",
        "--temp",
        "0.7",
        "--top-k",
        "40",
        "--top-p",
        "0.9",
        "--repeat-penalty",
        "1.1",
        "--keep",
        "-1",
        "-sp",
        "--props",
        "--log-disable",
        "--timeout",
        "600",
    ],
    "thread placement": [
        "--cpu-range",
        "0-1",
        "--cpu-strict",
        "1",
        "--prio",
        "0",
        "--poll",
        "0",
        "--threads-batch",
        "2",
    ],
    # {model}: the model stands in for the draft too.
    "speculative": [
        "-md",
        "{model}",
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "16",
        "-ngld",
        "99",
        "-devd",
        "none",
    ],
}
REFUSES: dict[str, tuple[list[str], str]] = {
    "backend sampling": (["--backend-sampling"], "backend sampling"),
}


@pytest.mark.parametrize("name", list(SERVES))
def test_documented_command_line_serves_a_chat(name: str, model_path: str, tmp_path: Path) -> None:
    server = start_server(["-m", model_path, *(a.replace("{model}", model_path) for a in SERVES[name])], tmp_path)
    try:
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
    finally:
        stop_server(server)


def test_docker_compose_variables_configure_the_server(model_path: str, tmp_path: Path) -> None:
    env = {
        "LLAMA_ARG_MODEL": model_path,
        "LLAMA_ARG_CTX_SIZE": "4096",
        "LLAMA_ARG_N_PARALLEL": "2",
        "LLAMA_ARG_ENDPOINT_METRICS": "1",
        "LLAMA_ARG_CACHE_TYPE_K": "q8_0",
    }
    server = start_server([], tmp_path, env=env)
    try:
        props = httpx.get(f"{server.url}/props", timeout=30).json()
        assert props["total_slots"] == 2
        assert (
            props["default_generation_settings"]["n_ctx"] == 4096 // 2
            or props["default_generation_settings"]["n_ctx"] == 4096
        )
        assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 200
    finally:
        stop_server(server)


@pytest.mark.parametrize("name", list(REFUSES))
def test_command_line_of_a_feature_not_built_yet_exits_1_naming_it(name: str, model_path: str) -> None:
    args, feature = REFUSES[name]
    out = subprocess.run(
        [sys.executable, "-m", "llamaserve", "-m", model_path, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 1
    assert feature in out.stderr
