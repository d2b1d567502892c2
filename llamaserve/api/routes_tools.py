"""GET/POST /tools (llama-server's agent tools) and /cors-proxy (the web UI's MCP proxy).

Both answer 403 "this feature is disabled" unless turned on (--tools / MCP servers,
--ui-mcp-proxy), as llama-server does. POST /tools takes `{tool, params, stream}`
(api/tool_calls.py); the x-tool-cwd, x-tool-runtime and x-resp-type headers set what the
model cannot; x-tool-runtime only where the operator allows it (--tools-runtime-header).
api/site_guard.py refuses both routes to what a page of another site could send. The tools'
modules load only on a server whose tools are on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.body import JSONUTF8Response
from llamaserve.config import ServerConfig

if TYPE_CHECKING:
    from llamaserve.tools.registry import Toolbox


def toolbox_from_config(config: ServerConfig) -> Toolbox | None:
    """The server's tools, or None when neither --tools nor MCP servers are on (then /tools is
    a 403). McpConfigError for MCP definitions that cannot be read, RuntimeRefused for a
    --tools-runtime that cannot be used. The MCP servers' tools join at `Toolbox.start`."""
    if not config.tools_enabled:
        return None
    from llamaserve.tools.mcp_config import load_servers
    from llamaserve.tools.registry import Toolbox, builtin_selection, make_runtime

    servers = load_servers(config.mcp_servers_config, config.mcp_servers_json)
    runtime = make_runtime(config.tools_runtime) if config.tools_runtime else None
    mcp = None
    if servers:
        from llamaserve.tools.mcp_client import McpManager  # the MCP SDK, ~0.3 s to import: only when used

        mcp = McpManager(servers)
    return Toolbox(builtin_selection(config.tools), config.tools_root, runtime, mcp, config.tools_runtime_header)


def disabled() -> Response:
    body = {"error": {"code": 403, "message": "this feature is disabled", "type": "feature_disabled"}}
    return JSONUTF8Response(body, status_code=403)


def tools_routes(toolbox: Toolbox | None) -> APIRouter:
    router = APIRouter()

    @router.get("/tools")
    async def list_tools() -> Response:
        if toolbox is None:
            return disabled()
        return JSONUTF8Response(toolbox.listing())

    @router.post("/tools")
    async def call_tool(request: Request) -> Response:
        if toolbox is None:
            return disabled()
        from llamaserve.api.tool_calls import call_tool as call  # loaded with the toolbox already

        return await call(toolbox, request)

    return router
