"""MCP servers over stdio behind /tools: one built with the official SDK and one written by
hand that can sleep past its timeout or crash. Their tools appear as `<server>_<tool>`, a call
answers with the tool's text, a hung server is killed at its `timeout_ms`, and a crash errors
that call only (the other server keeps answering, and the crashed one is started again)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server

FIXTURES = Path(__file__).parent / "mcp_fixtures"


@pytest.fixture(scope="module")
def pid_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp") / "pids.txt"


@pytest.fixture(scope="module")
def sdk_cwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sdk-cwd")


@pytest.fixture(scope="module")
def mcp_server(
    model_path: str, pid_log: Path, sdk_cwd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    servers = {
        "sdk": {
            "command": sys.executable,
            "args": [str(FIXTURES / "sdk_server.py")],
            "env": {"MCP_TEST_VAR": "from-config"},
            "cwd": str(sdk_cwd),
        },
        "raw": {
            "command": sys.executable,
            "args": [str(FIXTURES / "raw_server.py")],
            "env": {"MCP_PID_LOG": str(pid_log)},
            "timeout_ms": 1500,
        },
        "broken": {"command": "/nonexistent/mcp-server"},
    }
    srv = start_server(
        [
            "-m",
            model_path,
            "-c",
            "256",
            "-np",
            "1",
            "--no-webui",
            "--mcp-servers-json",
            json.dumps({"mcpServers": servers}),
        ],
        tmp_path_factory.mktemp("mcp-server"),
    )
    yield srv
    stop_server(srv)


def call(srv: RunningServer, tool: str, params: dict[str, Any]) -> dict[str, Any]:
    res = httpx.post(f"{srv.url}/tools", json={"tool": tool, "params": params}, timeout=60)
    assert res.status_code == 200, res.text
    body: dict[str, Any] = res.json()
    return body


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too: it only waits to be reaped
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"


def pids(pid_log: Path) -> list[int]:
    return [int(p) for p in pid_log.read_text().split()]


def test_tools_are_listed_as_server_underscore_tool_with_their_schemas(mcp_server: RunningServer) -> None:
    tools = {t["tool"]: t for t in httpx.get(f"{mcp_server.url}/tools").json()}
    # no --tools: the MCP tools are the only ones; the broken server adds none
    assert sorted(tools) == ["raw_crash", "raw_echo", "raw_fail", "raw_sleep", "sdk_add", "sdk_where"]
    add = tools["sdk_add"]
    assert add["type"] == "mcp" and add["permissions"] == {"write": False}
    fn = add["definition"]["function"]
    assert fn["name"] == "sdk_add" and fn["description"] == "Add two integers."
    assert fn["parameters"]["properties"].keys() == {"a", "b"}
    assert tools["raw_echo"]["definition"]["function"]["parameters"]["required"] == ["message"]


def test_started_once_to_list_then_stopped_then_on_demand(mcp_server: RunningServer, pid_log: Path) -> None:
    warmup = pids(pid_log)
    assert len(warmup) == 1 and not alive(warmup[0])
    first = call(mcp_server, "raw_echo", {"message": "hi"})
    assert first["plain_text_response"].startswith("echo: hi pid=")
    second = call(mcp_server, "raw_echo", {"message": "again"})
    # the server started for the first call stays for the next
    assert first["plain_text_response"].split("pid=")[1] == second["plain_text_response"].split("pid=")[1]
    assert len(pids(pid_log)) == 2 and alive(pids(pid_log)[1])


def test_sdk_server_calls_with_env_and_cwd(mcp_server: RunningServer, sdk_cwd: Path) -> None:
    assert call(mcp_server, "sdk_add", {"a": 2, "b": 3}) == {"plain_text_response": "5"}
    assert call(mcp_server, "sdk_where", {}) == {"plain_text_response": f"{sdk_cwd}|from-config"}
    error = call(mcp_server, "sdk_add", {"a": "two"})
    assert "error" in error


def test_a_tool_error_is_an_error(mcp_server: RunningServer) -> None:
    assert call(mcp_server, "raw_fail", {}) == {"error": "it went wrong"}


def test_a_server_past_its_timeout_is_killed(mcp_server: RunningServer, pid_log: Path) -> None:
    call(mcp_server, "raw_echo", {"message": "warm"})
    sleeper = pids(pid_log)[-1]
    started = time.monotonic()
    assert call(mcp_server, "raw_sleep", {"seconds": 30}) == {"error": "request timed out"}
    assert time.monotonic() - started < 6
    deadline = time.monotonic() + 5
    while alive(sleeper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(sleeper)
    # the next call gets a fresh server
    after = call(mcp_server, "raw_echo", {"message": "back"})
    assert after["plain_text_response"] == f"echo: back pid={pids(pid_log)[-1]}"
    assert pids(pid_log)[-1] != sleeper


def test_a_crash_errors_that_call_only(mcp_server: RunningServer, pid_log: Path) -> None:
    assert "sdk" not in call(mcp_server, "sdk_add", {"a": 1, "b": 1}).get("error", "")
    crashed = call(mcp_server, "raw_crash", {})
    assert "exited" in crashed["error"]
    assert call(mcp_server, "sdk_add", {"a": 1, "b": 1}) == {"plain_text_response": "2"}
    assert call(mcp_server, "raw_echo", {"message": "x"})["plain_text_response"].startswith("echo: x")
    assert httpx.get(f"{mcp_server.url}/health").status_code == 200


def test_mcp_definitions_that_cannot_be_read_stop_the_start(model_path: str, tmp_path: Path) -> None:
    # (a missing file: tests/unit/test_tools_units.py)
    with pytest.raises(RuntimeError, match=r"(?s)exited with 1:.*failed to parse MCP config JSON"):
        start_server(["-m", model_path, "-c", "256", "--no-webui", "--mcp-servers-json", "not json"], tmp_path)
