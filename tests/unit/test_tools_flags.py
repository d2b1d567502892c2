"""The agent-tool flags: what --tools, -ag/--agent, --tools-runtime and the MCP flags set, the
CORS default they bring, and their LLAMA_ARG_* variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaserve.cli import config_from_args
from llamaserve.config import ConfigError, ServerConfig


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return str(p)


def cfg(model_file: str, *args: str, env: dict[str, str] | None = None) -> ServerConfig:
    return config_from_args(["-m", model_file, *args], environ=env or {})


def test_without_tools_cors_stays_open_and_tools_off(model_file: str) -> None:
    c = cfg(model_file)
    assert c.cors_origins == ("*",) and c.tools == () and not c.tools_enabled and not c.ui_mcp_proxy


@pytest.mark.parametrize(
    "args",
    [
        ["--tools", "read_file,grep_search"],
        ["--agent"],
        ["--mcp-servers-json", '{"mcpServers": {}}'],
        ["--ui-mcp-proxy"],
    ],
)
def test_any_agent_feature_limits_cors_to_localhost(model_file: str, args: list[str]) -> None:
    assert cfg(model_file, *args).cors_origins == ("localhost",)
    # an explicit --cors-origins wins, whichever side of the flag it is given on
    assert cfg(model_file, "--cors-origins", "*", *args).cors_origins == ("*",)
    assert cfg(model_file, *args, "--cors-origins", "http://a.example").cors_origins == ("http://a.example",)


def test_tools_take_names_or_all_and_refuse_unknown_ones(model_file: str) -> None:
    assert cfg(model_file, "--tools", "read_file, get_info").tools == ("read_file", "get_info")
    assert cfg(model_file, "--tools", "all").tools == ("all",)
    with pytest.raises(ConfigError, match=r'unknown tool "rm_rf"\. available tools: read_file, file_glob_search'):
        cfg(model_file, "--tools", "read_file,rm_rf")


def test_agent_is_all_tools_and_the_proxy_and_the_later_flag_wins(model_file: str) -> None:
    c = cfg(model_file, "-ag")
    assert c.tools == ("all",) and c.ui_mcp_proxy
    assert cfg(model_file, "--tools", "read_file", "--agent").tools == ("all",)
    c = cfg(model_file, "--agent", "--tools", "read_file", "--no-ui-mcp-proxy")
    assert c.tools == ("read_file",) and not c.ui_mcp_proxy
    c = cfg(model_file, "--agent", "--no-agent")
    assert c.tools == () and not c.ui_mcp_proxy and c.cors_origins == ("*",)


def test_variables(model_file: str, tmp_path: Path) -> None:
    env = {
        "LLAMA_ARG_TOOLS": "write_file",
        "LLAMA_ARG_TOOLS_RUNTIME": "ssh:builder@host",
        "LLAMA_ARG_MCP_SERVERS_CONFIG": str(tmp_path / "mcp.json"),
        "LLAMA_ARG_MCP_SERVERS_JSON": '{"mcpServers": {}}',
        "LLAMA_ARG_UI_MCP_PROXY": "1",
        "LLAMASERVE_TOOLS_ROOT": str(tmp_path),
    }
    c = cfg(model_file, env=env)
    assert c.tools == ("write_file",)
    assert c.tools_runtime == "ssh:builder@host"
    assert c.mcp_servers_config == str(tmp_path / "mcp.json")
    assert c.mcp_servers_json == '{"mcpServers": {}}'
    assert c.ui_mcp_proxy and c.tools_root == str(tmp_path)
    assert cfg(model_file, env={"LLAMA_ARG_AGENT": "1"}).tools == ("all",)
    assert cfg(model_file, "--tools-runtime", "none").tools_runtime == ""


def test_a_tools_root_must_be_a_folder(model_file: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="LLAMASERVE_TOOLS_ROOT"):
        cfg(model_file, "--tools", "all", env={"LLAMASERVE_TOOLS_ROOT": str(tmp_path / "nope")})
