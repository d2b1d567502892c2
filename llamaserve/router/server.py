"""The router's process: the model list, then the shared start-up (api/run.py), and the
children stopped before the loop ends."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

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
from llamaserve.router.app import create_router_app
from llamaserve.router.catalog import ModelSpec, load_catalog
from llamaserve.router.downloads import Downloads
from llamaserve.router.preset import from_argv
from llamaserve.router.registry import Registry

log = logging.getLogger("llamaserve.router")


def _log_models(specs: dict[str, ModelSpec]) -> None:
    log.info("available models (%d):", len(specs))
    for name, spec in specs.items():
        extra = f" (aliases: {', '.join(spec.aliases)})" if spec.aliases else ""
        log.info("  [%10s] %s%s", spec.source, name, extra)


def serve(config: ServerConfig, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    setup_forwarder_logging(config)
    try:
        specs = load_catalog(config, environ)
        tools = EdgeTools.from_config(config)
    except (ConfigError, OSError) as exc:
        log.error("router: %s", exc)
        return 1
    if tools.enabled:
        log.warning("security: agent tools enabled - do not expose to untrusted environments")
    starting = sum(1 for s in specs.values() if s.load_on_startup)
    if config.models_max > 0 and starting > config.models_max:
        log.error("number of models to load on startup (%d) exceeds --models-max (%d)", starting, config.models_max)
        return 1
    _log_models(specs)
    if not start_request_tracing(config, "llamaserve-router", log):
        return 1
    listeners = bind(config, log)
    if listeners is None:
        return 1
    run_server(config, listeners, _RouterSite(config, argv, environ, specs, tools, [lst.address for lst in listeners]))
    return 0


class _RouterSite(Site):
    """The router in the shared start-up: its registry and proxy live on the loop, and the
    children are stopped (SIGTERM, then SIGKILL after their stop-timeout) before it ends."""

    def __init__(
        self,
        config: ServerConfig,
        argv: Sequence[str],
        environ: Mapping[str, str],
        specs: dict[str, ModelSpec],
        tools: EdgeTools,
        addresses: list[str],
    ) -> None:
        self.config = config
        self.argv = argv
        self.environ = environ
        self.specs = specs
        self.tools = tools
        self.addresses = addresses
        self.upstream: Upstream | None = None
        self.registry: Registry | None = None
        self.downloads: Downloads | None = None

    def _reload(self) -> dict[str, ModelSpec]:
        return load_catalog(self.config, self.environ)

    async def open(self, stop: StopSwitch) -> ASGIApp:
        # Built on the loop: the registry's watch and the proxy's clients belong to it.
        config = self.config
        self.upstream = Upstream(float(config.timeout))
        self.registry = Registry(config, from_argv(self.argv), self.specs, self.environ, self.upstream.client)
        registry = self.registry

        async def reread() -> None:
            await registry.reload(self._reload())

        self.downloads = Downloads(self.environ, config.hf_token, registry.broadcast, reread)
        app = create_router_app(config, registry, self.upstream, self._reload, self.tools, self.downloads)
        await self.tools.start(stop)
        self.registry.start_watch()
        for address in self.addresses:
            log.info("router listening on %s", address)
            log.info("server listening on %s", address)  # the line scripts wait for, as from llama-server
        return app

    async def close(self) -> None:
        await self.tools.close()
        if self.downloads is not None:
            await self.downloads.shutdown()
        if self.registry is not None:
            await self.registry.shutdown()
        if self.upstream is not None:
            await self.upstream.close()
