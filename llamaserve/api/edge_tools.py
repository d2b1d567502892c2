"""The agent tools (`/tools`, the MCP servers' tools) and the web UI's MCP proxy (`/cors-proxy`)
for a process that serves them at its edge, without a model: the router and the `--upstreams`
front. The routes are the single server's own (routes_tools.py, cors_proxy.py), so a client sees
the same answers, the same 403 when off, and the same site guard in front of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from fastapi import APIRouter

from llamaserve.api.cors_proxy import cors_proxy_routes
from llamaserve.api.routes_tools import toolbox_from_config, tools_routes
from llamaserve.api.run import StopSwitch
from llamaserve.config import ConfigError, ServerConfig
from llamaserve.tools.fileio import RuntimeRefused
from llamaserve.tools.mcp_config import McpConfigError
from llamaserve.tools.registry import Toolbox


@dataclass
class EdgeTools:
    toolbox: Toolbox | None  # None: --tools and MCP servers are off
    proxy: bool  # --ui-mcp-proxy
    _watch: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: ServerConfig) -> EdgeTools:
        """ConfigError when the MCP definitions cannot be read or the tools' runtime cannot be used."""
        try:
            toolbox = toolbox_from_config(config)
        except (RuntimeRefused, McpConfigError) as exc:
            raise ConfigError(f"tools setup failed: {exc}") from exc
        return cls(toolbox, config.ui_mcp_proxy)

    @property
    def enabled(self) -> bool:
        return self.toolbox is not None or self.proxy

    def routes(self, *, only_enabled: bool) -> list[APIRouter]:
        """The routers to include; with `only_enabled`, those of what is off are left out (the
        front then forwards them to its members), else they answer 403 as llama-server's router."""
        out = []
        if self.toolbox is not None or not only_enabled:
            out.append(tools_routes(self.toolbox))
        if self.proxy or not only_enabled:
            out.append(cors_proxy_routes(self.proxy))
        return out

    async def start(self, stop: StopSwitch) -> None:
        """Before the first request: GET /tools lists the MCP servers' tools at once. When the
        process is asked to stop, the tools are shut down at once, as the single server does
        (api/server.py): a slow tool call must not hold uvicorn's wait for open requests."""
        if self.toolbox is None:
            return
        await self.toolbox.start()
        self._watch = asyncio.create_task(self._shutdown_on_stop(stop))

    async def _shutdown_on_stop(self, stop: StopSwitch) -> None:
        # uvicorn polls its should_exit the same way
        while not stop.requested:
            await asyncio.sleep(0.1)
        await self.shutdown()

    async def shutdown(self) -> None:
        """Tool calls in flight end now, and a tools container is removed (once)."""
        toolbox, self.toolbox = self.toolbox, None
        if toolbox is not None:
            await toolbox.shutdown()

    async def close(self) -> None:
        """After uvicorn has stopped: the tools shut down if the stop watch has not done it."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.shutdown()
