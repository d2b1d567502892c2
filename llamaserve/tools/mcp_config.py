"""MCP server definitions in Cursor's format, as llama-server reads them:
`{"mcpServers": {"<name>": {"command", "args", "env", "cwd", "timeout_ms"}}}`.
An entry without a command is skipped; a name given twice (file and inline) keeps the first."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("llamaserve.tools")

DEFAULT_TIMEOUT_MS = 30000


class McpConfigError(Exception):
    """The definitions cannot be read: the server does not start, as llama-server."""


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # merged over the server's environment
    cwd: str = ""
    timeout_ms: int = DEFAULT_TIMEOUT_MS  # per tool call


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise McpConfigError(f"{where} must be an array of strings")
    return list(value)


def parse_servers(text: str) -> list[McpServerConfig]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise McpConfigError(f"failed to parse MCP config JSON: {exc}") from exc
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        return []
    out: list[McpServerConfig] = []
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise McpConfigError(f"mcpServers.{name} must be an object")
        command = entry.get("command", "")
        if not isinstance(command, str):
            raise McpConfigError(f"mcpServers.{name}.command must be a string")
        if not command:
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        env = entry.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise McpConfigError(f"mcpServers.{name}.env must be an object of strings")
        cwd = entry.get("cwd", "")
        if not isinstance(cwd, str):
            raise McpConfigError(f"mcpServers.{name}.cwd must be a string")
        timeout = entry.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise McpConfigError(f"mcpServers.{name}.timeout_ms must be a positive integer")
        args = _strings(entry.get("args", []), f"mcpServers.{name}.args")
        out.append(McpServerConfig(name, command, tuple(args), dict(env), cwd, timeout))
    return out


def load_servers(path: str | None, inline: str | None) -> list[McpServerConfig]:
    """The servers of --mcp-servers-config and --mcp-servers-json together."""
    texts: list[str] = []
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                texts.append(fh.read())
        except OSError as exc:
            raise McpConfigError(f"failed to open MCP config file: {path}: {exc.strerror}") from exc
    if inline:
        texts.append(inline)
    out: list[McpServerConfig] = []
    for text in texts:
        parsed = parse_servers(text)
        if not parsed:
            log.warning("MCP config: no servers found in JSON")
        for server in parsed:
            if any(s.name == server.name for s in out):
                log.warning("MCP config: duplicate server name '%s', skipping", server.name)
                continue
            out.append(server)
    return out
