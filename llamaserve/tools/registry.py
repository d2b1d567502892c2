"""The tools a server offers (built-in and MCP), and how one POST /tools becomes a call."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llamaserve.tools.base import JSON, Call, Tool, check_object
from llamaserve.tools.builtin import builtin_tools
from llamaserve.tools.container import SpawnedContainer
from llamaserve.tools.fileio import PathRefused, make_io, parse_container_spec
from llamaserve.tools.proc import ChunkSink

if TYPE_CHECKING:  # the MCP SDK loads only when MCP servers are configured (start-up time)
    from llamaserve.tools.mcp_client import McpManager

log = logging.getLogger("llamaserve.tools")


class UnknownTool(Exception):
    """No such tool, or one that cannot stream: a 404, as llama-server."""


class HeaderRefused(Exception):
    """A request header that would override the operator's choice (where tools run): a 403."""


@dataclass
class Runtime:
    """--tools-runtime: a fixed target (validated at start) or a container the server owns."""

    static: str = ""
    owned: SpawnedContainer | None = None

    def spec(self) -> str:
        return self.owned.spec() if self.owned is not None else self.static

    def close(self) -> None:
        if self.owned is not None:
            self.owned.close()


def make_runtime(spec: str) -> Runtime:
    parsed = parse_container_spec(spec)
    if parsed is not None and not parsed[2]:
        return Runtime(owned=SpawnedContainer(spec))
    make_io("", spec, None)  # nothing to own: refuse a bad spec now rather than at each call
    return Runtime(static=spec)


# What the headers set; the model must not be able to set them through the params.
_HEADER_PARAMS = ("cwd", "runtime", "resp_type")


class Toolbox:
    def __init__(
        self,
        tools: list[Tool],
        root: str | None = None,
        runtime: Runtime | None = None,
        mcp: McpManager | None = None,
        runtime_header: bool = False,
    ) -> None:
        self.tools = tools
        self.root = root
        self.runtime = runtime or Runtime()
        self.runtime_header = runtime_header  # --tools-runtime-header: x-tool-runtime may choose
        self.mcp = mcp

    async def start(self) -> None:
        """List the MCP servers' tools (each server started and stopped once). A name that
        is taken already (a built-in, another server's) is skipped."""
        if self.mcp is None:
            return
        from llamaserve.tools.mcp_client import McpTool  # the SDK: only a server with MCP servers loads it

        seen = {t.name for t in self.tools}
        added = 0
        for definition in await self.mcp.warmup():
            tool = McpTool(definition, self.mcp)
            if tool.name in seen:
                log.warning(
                    "MCP tool %s from server %s collides with an existing tool, skipping", tool.name, definition.server
                )
                continue
            seen.add(tool.name)
            self.tools.append(tool)
            added += 1
        if added:
            log.info("added %d MCP tools", added)

    def listing(self) -> list[JSON]:
        return [t.to_json() for t in self.tools]

    def find(self, name: str, stream: bool) -> Tool:
        for tool in self.tools:
            if tool.name == name:
                if stream and not tool.support_stream:
                    raise UnknownTool(f'tool "{name}" does not support stream = true')
                return tool
        raise UnknownTool(f'unknown tool "{name}"')

    def prepare(self, tool: Tool, params: JSON, headers: Mapping[str, str]) -> Call:
        """The call: header values over whatever the params said, the params checked against
        the tool's schema (400 naming the field)."""
        params = {k: v for k, v in params.items() if k not in _HEADER_PARAMS}
        if tool.kind == "server":
            check_object(tool.definition()["function"]["parameters"], params)
        runtime = self._runtime(headers.get("x-tool-runtime", ""))
        return Call(
            params,
            cwd=headers.get("x-tool-cwd", ""),
            runtime=runtime,
            resp_type=headers.get("x-resp-type", ""),
            root=self.root,
        )

    def _runtime(self, asked: str) -> str:
        """Where the call runs: the operator's runtime, or the header's where the operator let
        requests choose. A malformed header is RuntimeRefused either way (llama-server's 500),
        so a bad value is named before the permission question."""
        ours = self.runtime.spec()
        if not asked or asked == ours:
            return ours
        make_io("", asked, None)
        if not self.runtime_header:
            raise HeaderRefused(
                "x-tool-runtime: this server's tools run where its operator said (--tools-runtime); "
                "start it with --tools-runtime-header to let requests choose"
            )
        return asked

    async def invoke(self, tool: Tool, call: Call, sink: ChunkSink | None = None) -> JSON:
        try:
            return await tool.call(call, sink)
        except PathRefused as exc:
            return {"error": str(exc)}

    async def shutdown(self) -> None:
        if self.mcp is not None:
            await self.mcp.close()
        self.runtime.close()


def builtin_selection(names: tuple[str, ...]) -> list[Tool]:
    tools = builtin_tools()
    if "all" in names:
        return tools
    return [t for t in tools if t.name in names]
