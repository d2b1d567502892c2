"""The agent tools through POST /tools on a real server: every built-in tool, each refusal
(a path out of the tools root by `..`, by a symlink or by the working-directory header, a bad
runtime spec, option injection into ssh/docker), bad params as 400s naming the field, CORS
limited to localhost, and the API key guarding /tools."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import RunningServer, start_server, stop_server

KEY = "tools-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tools-root")


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("outside")
    (folder / "secret.txt").write_text("top secret\n")
    return folder


@pytest.fixture(scope="module")
def tools_server(root: Path, model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        ["-m", model_path, "-c", "256", "-np", "1", "--tools", "all", "--api-key", KEY, "--no-webui"],
        tmp_path_factory.mktemp("tools-server"),
        env={"LLAMASERVE_TOOLS_ROOT": str(root)},
    )
    yield srv
    stop_server(srv)


def post(srv: RunningServer, tool: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    res = httpx.post(
        f"{srv.url}/tools", json={"tool": tool, "params": params}, headers={**AUTH, **(headers or {})}, timeout=60
    )
    return res


def call(srv: RunningServer, tool: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    res = post(srv, tool, params, headers)
    assert res.status_code == 200, res.text
    body = res.json()
    assert "error" not in body, body
    return body


def refused(srv: RunningServer, tool: str, params: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    res = post(srv, tool, params, headers)
    assert res.status_code == 200, res.text
    body = res.json()
    assert "error" in body, body
    return str(body["error"])


def test_get_tools_lists_the_seven_with_their_schemas(tools_server: RunningServer) -> None:
    res = httpx.get(f"{tools_server.url}/tools", headers=AUTH)
    assert res.status_code == 200
    tools = {t["tool"]: t for t in res.json()}
    assert list(tools) == [
        "read_file",
        "file_glob_search",
        "grep_search",
        "exec_shell_command",
        "write_file",
        "edit_file",
        "get_info",
    ]
    assert tools["write_file"]["permissions"] == {"write": True}
    assert tools["read_file"]["permissions"] == {"write": False}
    fn = tools["edit_file"]["definition"]["function"]
    assert fn["name"] == "edit_file"
    assert fn["parameters"]["required"] == ["path", "edits"]
    assert fn["parameters"]["properties"]["edits"]["items"]["required"] == ["old_text", "new_text"]


def test_read_file_whole_ranges_line_numbers_and_base64(tools_server: RunningServer, root: Path) -> None:
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    assert call(tools_server, "read_file", {"path": "notes.txt"})["plain_text_response"] == "alpha\nbeta\ngamma\n"
    part = call(tools_server, "read_file", {"path": "notes.txt", "start_line": 2, "end_line": 2, "append_loc": True})
    assert part["plain_text_response"] == "2\u2192beta\n"
    raw = call(tools_server, "read_file", {"path": "notes.txt"}, {"x-resp-type": "base64"})
    assert raw == {"base64": "YWxwaGEKYmV0YQpnYW1tYQo=", "size_bytes": 17}
    (root / "big.txt").write_text("x" * 20000)
    assert "file too large" in refused(tools_server, "read_file", {"path": "big.txt"})
    assert "cannot stat file" in refused(tools_server, "read_file", {"path": "missing.txt"})


def test_paths_out_of_the_root_are_refused(tools_server: RunningServer, root: Path, outside: Path) -> None:
    (root / "sub").mkdir(exist_ok=True)
    escape = os.path.relpath(outside / "secret.txt", root / "sub")
    for path in (f"sub/{escape}", str(outside / "secret.txt"), "../" + outside.name + "/secret.txt"):
        assert "outside the tools root" in refused(tools_server, "read_file", {"path": path})
    # a link inside the root that points out of it: refused for reading and for writing through it
    link = root / "link.txt"
    if not link.exists():
        link.symlink_to(outside / "secret.txt")
    assert "outside the tools root" in refused(tools_server, "read_file", {"path": "link.txt"})
    assert "outside the tools root" in refused(tools_server, "write_file", {"path": "link.txt", "content": "pwned"})
    dir_link = root / "outdir"
    if not dir_link.exists():
        dir_link.symlink_to(outside, target_is_directory=True)
    assert "outside the tools root" in refused(
        tools_server, "write_file", {"path": "outdir/new.txt", "content": "pwned"}
    )
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert not (outside / "new.txt").exists()
    # nor do the searches read through links, nor does a working directory outside the root work
    grep = call(tools_server, "grep_search", {"path": ".", "pattern": "top secret"})
    assert "Total matches: 0" in grep["plain_text_response"]
    glob = call(tools_server, "file_glob_search", {"path": ".", "include": "secret.txt"})
    assert glob["entries"] == []
    error = refused(tools_server, "read_file", {"path": "secret.txt"}, {"x-tool-cwd": str(outside)})
    assert "outside the tools root" in error


def test_write_creates_parents_and_edit_applies_unique_disjoint_edits(tools_server: RunningServer, root: Path) -> None:
    res = call(tools_server, "write_file", {"path": "deep/er/f.txt", "content": "one\ntwo\nthree\n"})
    assert res == {"result": "file written successfully", "path": "deep/er/f.txt", "bytes": 14}
    edits = [{"old_text": "one", "new_text": "1"}, {"old_text": "three\n", "new_text": "3\nfour\n"}]
    res = call(tools_server, "edit_file", {"path": "deep/er/f.txt", "edits": edits})
    assert res["result"] == "file edited successfully" and res["edits_applied"] == 2
    assert (root / "deep/er/f.txt").read_text() == "1\ntwo\n3\nfour\n"
    # typographic quotes and trailing blanks in old_text still find the line; other lines stay as they were
    (root / "fuzzy.txt").write_text("keep  \nsay \u201chi\u201d   \n")
    call(tools_server, "edit_file", {"path": "fuzzy.txt", "edits": [{"old_text": 'say "hi"', "new_text": "said"}]})
    assert (root / "fuzzy.txt").read_text() == "keep  \nsaid\n"


def test_edit_refuses_non_unique_overlapping_missing_and_no_op_edits(tools_server: RunningServer, root: Path) -> None:
    (root / "e.txt").write_text("dup\ndup\nab\n")
    assert "must be unique" in refused(
        tools_server, "edit_file", {"path": "e.txt", "edits": [{"old_text": "dup", "new_text": "x"}]}
    )
    overlapping = [{"old_text": "dup\nab", "new_text": "x"}, {"old_text": "ab", "new_text": "y"}]
    assert "overlap" in refused(tools_server, "edit_file", {"path": "e.txt", "edits": overlapping})
    assert "could not find" in refused(
        tools_server, "edit_file", {"path": "e.txt", "edits": [{"old_text": "zzz", "new_text": "x"}]}
    )
    assert "no changes made" in refused(
        tools_server, "edit_file", {"path": "e.txt", "edits": [{"old_text": "ab", "new_text": "ab"}]}
    )
    assert (root / "e.txt").read_text() == "dup\ndup\nab\n"


def test_glob_depth_limit_types_and_junk_dirs(tools_server: RunningServer, root: Path) -> None:
    base = root / "g"
    (base / "a" / "b").mkdir(parents=True)
    (base / "node_modules" / "pkg").mkdir(parents=True)
    (base / "top.txt").write_text("t")
    (base / "a" / "mid.txt").write_text("m")
    (base / "a" / "b" / "deep.py").write_text("d")
    (base / "node_modules" / "pkg" / "index.txt").write_text("n")

    def paths(**params: Any) -> list[str]:
        return sorted(e["path"] for e in call(tools_server, "file_glob_search", {"path": "g", **params})["entries"])

    assert paths() == ["a/b/deep.py", "a/mid.txt", "top.txt"]
    assert paths(max_depth=1) == ["top.txt"]
    assert paths(max_depth=2) == ["a/mid.txt", "top.txt"]
    assert paths(include="*.py") == ["a/b/deep.py"]
    assert paths(include="a/*.txt") == ["a/mid.txt"]
    assert paths(exclude="*.txt") == ["a/b/deep.py"]
    assert paths(type="dir") == ["a", "a/b", "node_modules"]  # listed, never walked
    limited = call(tools_server, "file_glob_search", {"path": "g", "limit": 1})
    assert len(limited["entries"]) == 1 and "Total matches: 3" in limited["plain_text_response"]
    assert limited["base"] == str(base)
    assert "invalid type" in refused(tools_server, "file_glob_search", {"path": "g", "type": "bogus"})
    assert "invalid limit" in refused(tools_server, "file_glob_search", {"path": "g", "limit": 0})
    assert "not a directory" in refused(tools_server, "file_glob_search", {"path": "nope"})


def test_grep_include_literal_case_and_context(tools_server: RunningServer, root: Path) -> None:
    base = root / "src"
    base.mkdir(exist_ok=True)
    (base / "a.py").write_text("x = 1\nneedle(1)\ny = 2\n")
    (base / "b.txt").write_text("NEEDLE(1)\n")
    text = call(tools_server, "grep_search", {"path": "src", "pattern": "needle", "include": "*.py"})[
        "plain_text_response"
    ]
    assert text == "a.py:needle(1)\n\n---\nTotal matches: 1\n"
    text = call(
        tools_server, "grep_search", {"path": "src", "pattern": "needle(1)", "literal": True, "ignore_case": True}
    )["plain_text_response"]
    assert "a.py:needle(1)" in text and "b.txt:NEEDLE(1)" in text and "Total matches: 2" in text
    text = call(tools_server, "grep_search", {"path": "src/a.py", "pattern": "needle", "context_lines": 1})[
        "plain_text_response"
    ]
    assert text.startswith("src/a.py-1-x = 1\nsrc/a.py:2:needle(1)\nsrc/a.py-3-y = 2\n--\n")
    assert "invalid regex" in refused(tools_server, "grep_search", {"path": "src", "pattern": "("})


def test_exec_runs_in_the_root_with_exit_code_and_timeout(tools_server: RunningServer, root: Path) -> None:
    text = call(tools_server, "exec_shell_command", {"command": "pwd; echo oops >&2; exit 3"})["plain_text_response"]
    assert text == f"{root}\noops\n\n[exit code: 3]"
    started = time.monotonic()
    text = call(tools_server, "exec_shell_command", {"command": "sleep 30 & sleep 30", "timeout": 1})[
        "plain_text_response"
    ]
    assert "[exit due to timed out]" in text
    assert time.monotonic() - started < 10
    text = call(
        tools_server, "exec_shell_command", {"command": "head -c 5000 /dev/zero | tr '\\0' x", "max_output_size": 10}
    )
    assert text["plain_text_response"].startswith("xxxxxxxxxx\n[output truncated]")


def test_exec_streams_its_output_as_server_sent_events(tools_server: RunningServer) -> None:
    body = {"tool": "exec_shell_command", "params": {"command": "echo first; sleep 0.3; echo second"}, "stream": True}
    events = []
    with httpx.stream("POST", f"{tools_server.url}/tools", json=body, headers=AUTH, timeout=30) as res:
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/event-stream")
        for line in res.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert events[-1] == {"done": True}
    chunks = [e["chunk"] for e in events[:-1]]
    assert len(chunks) >= 2  # the first line arrived before the command ended
    assert "".join(chunks) == "first\nsecond\n\n[exit code: 0]"
    # only exec streams
    res = httpx.post(
        f"{tools_server.url}/tools", json={"tool": "read_file", "params": {"path": "x"}, "stream": True}, headers=AUTH
    )
    assert res.status_code == 404 and "does not support stream" in res.json()["error"]["message"]


def test_get_info_reports_the_os_and_working_directory(tools_server: RunningServer, root: Path) -> None:
    info = call(tools_server, "get_info", {})
    assert info["cwd"] == str(root)
    assert os.uname().sysname in info["os"]
    sub = root / "info-sub"
    sub.mkdir(exist_ok=True)
    assert call(tools_server, "get_info", {}, {"x-tool-cwd": str(sub)})["cwd"] == str(sub)


@pytest.mark.parametrize(
    ("tool", "params", "field"),
    [
        ("read_file", {}, "params.path: required"),
        ("read_file", {"path": 3}, "params.path: expected a string"),
        ("read_file", {"path": "a", "start_line": "2"}, "params.start_line: expected an integer"),
        ("read_file", {"path": "a", "append_loc": 1}, "params.append_loc: expected a boolean"),
        ("read_file", {"path": "a", "colour": "red"}, "params.colour: unknown parameter"),
        ("edit_file", {"path": "a", "edits": "x"}, "params.edits: expected an array"),
        ("edit_file", {"path": "a", "edits": []}, "params.edits: must be a non-empty array"),
        ("edit_file", {"path": "a", "edits": [{"old_text": "a"}]}, "params.edits[0].new_text: required"),
        ("edit_file", {"path": "a", "edits": [{"old_text": "", "new_text": "b"}]}, "params.edits[0].old_text"),
        ("exec_shell_command", {"command": "true", "timeout": True}, "params.timeout: expected an integer"),
    ],
)
def test_bad_params_are_400s_naming_the_field(
    tools_server: RunningServer, tool: str, params: dict[str, Any], field: str
) -> None:
    res = post(tools_server, tool, params)
    assert res.status_code == 400, res.text
    assert field in res.json()["error"]["message"]


def test_bad_bodies_and_unknown_tools(tools_server: RunningServer) -> None:
    res = httpx.post(f"{tools_server.url}/tools", json={"params": {}}, headers=AUTH)
    assert res.status_code == 400 and "tool" in res.json()["error"]["message"]
    res = httpx.post(f"{tools_server.url}/tools", json={"tool": "read_file", "params": []}, headers=AUTH)
    assert res.status_code == 400 and "params" in res.json()["error"]["message"]
    res = post(tools_server, "rm_rf", {})
    assert res.status_code == 404 and 'unknown tool "rm_rf"' in res.json()["error"]["message"]


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ("fake:does-not-exist", "unknown tool runtime"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
        ("ssh:host;touch /tmp/pwned", "invalid ssh target"),
        ("docker-container:--privileged", "invalid container id"),
        ("podman-container:-v/:/host", "invalid container id"),
        ("docker:busybox", "must name a running container"),
    ],
)
def test_runtime_header_refusals(tools_server: RunningServer, runtime: str, message: str) -> None:
    res = post(tools_server, "exec_shell_command", {"command": "echo hi"}, {"x-tool-runtime": runtime})
    assert res.status_code == 500, res.text
    assert message in res.json()["error"]["message"]


def test_a_well_formed_runtime_header_cannot_override_the_operator(tools_server: RunningServer) -> None:
    res = post(tools_server, "exec_shell_command", {"command": "echo hi"}, {"x-tool-runtime": "ssh:build-host"})
    assert res.status_code == 403, res.text
    assert res.json()["error"]["message"].startswith("x-tool-runtime: ")


@pytest.mark.parametrize(
    "browser",
    [
        {"Content-Type": "text/plain;charset=UTF-8"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"},
        {"Origin": "http://localhost:3000"},
    ],
)
def test_what_another_sites_page_could_send_never_runs(
    tools_server: RunningServer, root: Path, browser: dict[str, str]
) -> None:
    marker = root / "cross-site-marker"
    body = json.dumps({"tool": "exec_shell_command", "params": {"command": f"touch {marker}"}})
    headers = {**AUTH, "Content-Type": "application/json", **browser}
    res = httpx.post(f"{tools_server.url}/tools", content=body, headers=headers, timeout=60)
    assert res.status_code == 403 and res.json()["error"]["type"] == "permission_error", res.text
    assert not marker.exists()


def test_nothing_under_tools_answers_without_the_key(tools_server: RunningServer) -> None:
    for method, body in (("GET", None), ("POST", {"tool": "get_info", "params": {}})):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            res = httpx.request(method, f"{tools_server.url}/tools", json=body, headers=headers)
            assert res.status_code == 401, res.text
            assert "os" not in res.text


def test_cors_grants_localhost_origins_only(tools_server: RunningServer) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
    evil = httpx.options(f"{tools_server.url}/tools", headers={"Origin": "http://evil.example", **preflight})
    assert evil.status_code == 200 and "access-control-allow-origin" not in evil.headers
    local = httpx.options(f"{tools_server.url}/tools", headers={"Origin": "http://localhost:8080", **preflight})
    assert local.headers["access-control-allow-origin"] == "http://localhost:8080"
    res = httpx.get(f"{tools_server.url}/tools", headers={"Origin": "http://evil.example", **AUTH})
    assert "access-control-allow-origin" not in res.headers


_SAFE_TOOLS = ["read_file", "file_glob_search", "grep_search", "write_file", "edit_file", "get_info"]
_KEYS = ["path", "content", "edits", "old_text", "new_text", "pattern", "include", "exclude", "type"]
_KEYS += ["max_depth", "limit", "start_line", "end_line", "append_loc", "literal", "context_lines", "cwd", "x"]
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=80, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(
    tool=st.sampled_from(_SAFE_TOOLS),
    params=st.dictionaries(st.sampled_from(_KEYS), _json, max_size=5) | _json,
)
def test_fuzzed_params_never_get_a_5xx(tools_server: RunningServer, tool: str, params: Any) -> None:
    # (exec_shell_command is left out: its fuzzed commands would run)
    res = httpx.post(f"{tools_server.url}/tools", json={"tool": tool, "params": params}, headers=AUTH, timeout=30)
    assert res.status_code in (200, 400), res.text


def test_a_tools_runtime_that_cannot_be_used_stops_the_start(model_path: str, tmp_path: Path) -> None:
    for spec, message in (("fake:x", "unknown tool runtime"), ("ssh:-oProxyCommand=id", "invalid ssh target")):
        with pytest.raises(RuntimeError, match=rf"(?s)exited with 1:.*tools setup failed: {message}"):
            start_server(
                ["-m", model_path, "-c", "256", "--no-webui", "--tools", "all", "--tools-runtime", spec], tmp_path
            )


def test_a_streamed_command_stops_when_the_client_goes_away(tools_server: RunningServer) -> None:
    body = {"tool": "exec_shell_command", "params": {"command": "echo $$; sleep 30", "timeout": 60}, "stream": True}
    with httpx.stream("POST", f"{tools_server.url}/tools", json=body, headers=AUTH, timeout=30) as res:
        for line in res.iter_lines():
            if line.startswith("data: "):
                pid = int(json.loads(line[6:])["chunk"].strip())
                break
    # the shell prints nothing more, yet it goes within moments of the disconnect
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
