"""`--upstreams`: the front's process (no model, no children): the shared start-up (api/run.py)
with the members' health watched beside the app."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from llamaserve.api.edge_tools import EdgeTools
from llamaserve.api.run import (
    ASGIApp,
    Site,
    StopSwitch,
    bind,
    run_server,
    setup_forwarder_logging,
    start_request_tracing,
)
from llamaserve.config import ConfigError, ServerConfig
from llamaserve.edge.proxy import Upstream
from llamaserve.scale.balancer import Balancer
from llamaserve.scale.front import create_front_app
from llamaserve.scale.health import check_once, watch

log = logging.getLogger("llamaserve.scale")


def serve(config: ServerConfig) -> int:
    setup_forwarder_logging(config)
    if not start_request_tracing(config, "llamaserve-front", log):
        return 1
    try:
        tools = EdgeTools.from_config(config)
    except ConfigError as exc:
        log.error("%s", exc)
        return 1
    if tools.enabled:
        log.warning("security: agent tools enabled - do not expose to untrusted environments")
    listeners = bind(config, log)
    if listeners is None:
        return 1
    run_server(config, listeners, _FrontSite(config, tools, [lst.address for lst in listeners]))
    return 0


class _FrontSite(Site):
    """The front in the shared start-up: every member asked once before the first request (so
    the log says which answer), then watched every second while the app serves."""

    def __init__(self, config: ServerConfig, tools: EdgeTools, addresses: list[str]) -> None:
        self.config = config
        self.tools = tools
        self.addresses = addresses
        self.upstream: Upstream | None = None
        self.watcher: asyncio.Task[None] | None = None

    async def open(self, stop: StopSwitch) -> ASGIApp:
        upstream = self.upstream = Upstream(float(self.config.timeout))
        balancer = Balancer(self.config.upstreams)
        await check_once(balancer, upstream.client)
        for url, member in balancer.members.items():
            log.info("upstream %s: %s", url, "healthy" if member.healthy else "not answering /health yet")
        app = create_front_app(self.config, balancer, upstream, self.tools)
        await self.tools.start(stop)
        self.watcher = asyncio.create_task(watch(balancer, upstream.client))
        for address in self.addresses:
            log.info("server listening on %s (front for %d upstreams)", address, len(balancer.members))
        return app

    async def close(self) -> None:
        await self.tools.close()
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher
        if self.upstream is not None:
            await self.upstream.close()
