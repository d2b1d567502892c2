"""The agent tools' pieces without a server: glob patterns, edit_file's rules, the argv built
for an isolate (never a shell string of ours), and reading MCP definitions."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llamaserve.tools.edit import EditError, apply_edits
from llamaserve.tools.fileio import ContainerIO, SshIO, shell_quote_join
from llamaserve.tools.glob import path_glob_match
from llamaserve.tools.mcp_config import McpConfigError, load_servers, parse_servers
from llamaserve.tools.proc import run


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("*.py", "a/b/c.py", True),  # no '/': the basename at any depth
        ("*.py", "a/b/c.pyc", False),
        ("src/*.py", "src/x.py", True),
        ("src/*.py", "lib/src/x.py", True),  # anchored with **/
        ("src/*.py", "src/deep/x.py", False),  # * stays in one folder
        ("src/**/*.py", "src/a/b/x.py", True),
        ("/src/*.py", "src/x.py", False),
        ("?.txt", "a.txt", True),
        ("[ab].txt", "b.txt", True),
        ("[!ab].txt", "b.txt", False),
        ("*" * 40 + "b", "a" * 60, False),  # no exponential backtracking
    ],
)
def test_glob(pattern: str, path: str, matches: bool) -> None:
    assert path_glob_match(pattern, path) is matches


def test_edits_apply_to_the_original_text_and_refuse_ambiguity() -> None:
    assert apply_edits("a b c", [("a", "b"), ("b", "a")], "f") == "b a c"  # not incremental
    with pytest.raises(EditError, match="found 2 occurrences of edits\\[0\\]"):
        apply_edits("x\nx\n", [("x", "y")], "f")
    with pytest.raises(EditError, match="found 2 occurrences"):
        apply_edits("x  \nx\n", [("x\n", "y\n")], "f")  # a twin that differs only by trailing blanks
    with pytest.raises(EditError, match="edits\\[0\\] and edits\\[1\\] overlap"):
        apply_edits("abcdef", [("abcd", "1"), ("cdef", "2")], "f")


def test_isolate_argv_keeps_every_value_one_word() -> None:
    evil = "x; touch /tmp/pwned '$(id)'"
    argv = ContainerIO("docker", "abc123", cwd="/w").build_argv(["cat", "--", evil], False)
    assert argv == ["docker", "exec", "abc123", "cat", "--", evil]
    ssh = SshIO("me@host").build_argv(["cat", "--", evil], False)
    assert ssh[:2] == ["ssh", "-o"] and ssh[-3:-1] == ["--", "me@host"] and "-n" in ssh
    # the remote shell re-splits the last word into exactly the argv we meant
    out = run(["sh", "-c", 'eval "set -- $1"; printf "%s\\n" "$@"', "_", ssh[-1]], 4096, 5)
    assert out.output.splitlines() == ["cat", "--", evil]
    assert shell_quote_join(["it's"]) == "'it'\\''s'"


def test_mcp_definitions(tmp_path: Path) -> None:
    doc = {
        "mcpServers": {
            "a": {"command": "srv", "args": ["-x"], "env": {"K": "V"}, "cwd": "/tmp", "timeout_ms": 500},
            "no_command": {"args": []},
        }
    }
    (servers,) = parse_servers(json.dumps(doc))
    assert (servers.name, servers.command, servers.args, servers.env, servers.cwd, servers.timeout_ms) == (
        "a",
        "srv",
        ("-x",),
        {"K": "V"},
        "/tmp",
        500,
    )
    assert parse_servers("{}") == []
    for bad in ('{"mcpServers": {"a": {"command": "x", "args": "y"}}}', '{"mcpServers": {"a": {"command": 1}}}'):
        with pytest.raises(McpConfigError):
            parse_servers(bad)
    with pytest.raises(McpConfigError, match="failed to open MCP config file"):
        load_servers(str(tmp_path / "missing.json"), None)
    file = tmp_path / "mcp.json"
    file.write_text(json.dumps({"mcpServers": {"a": {"command": "first"}}}))
    merged = load_servers(str(file), json.dumps({"mcpServers": {"a": {"command": "second"}, "b": {"command": "b"}}}))
    assert [(s.name, s.command) for s in merged] == [("a", "first"), ("b", "b")]


def test_a_catastrophic_grep_pattern_stops_at_its_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llamaserve.tools import builtin
    from llamaserve.tools.base import Call

    monkeypatch.setattr(builtin, "GREP_TIMEOUT", 0.3)
    (tmp_path / "a.txt").write_text("a" * 40 + "b\n")
    started = time.monotonic()
    out = builtin.GrepSearch().invoke(Call({"path": str(tmp_path), "pattern": "(a|aa)+$"}), None)
    assert "timed out" in out["error"]
    assert time.monotonic() - started < 5
