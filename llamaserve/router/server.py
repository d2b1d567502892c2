"""The router's process: the model list, the listeners, uvicorn, and the children's shutdown."""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping, Sequence
from types import FrameType

import uvicorn

from llamaserve.api.event_loop import run_on_fast_loop
from llamaserve.api.listen import BindError, close_listeners, open_listeners
from llamaserve.api.logs import setup_logging
from llamaserve.config import ConfigError, ServerConfig
from llamaserve.router.app import create_router_app
from llamaserve.router.catalog import ModelSpec, load_catalog
from llamaserve.router.preset import from_argv
from llamaserve.router.proxy import Upstream
from llamaserve.router.registry import Registry

log = logging.getLogger("llamaserve.router")


def _log_models(specs: dict[str, ModelSpec]) -> None:
    log.info("available models (%d):", len(specs))
    for name, spec in specs.items():
        extra = f" (aliases: {', '.join(spec.aliases)})" if spec.aliases else ""
        log.info("  [%10s] %s%s", spec.source, name, extra)


def serve(config: ServerConfig, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    setup_logging(config, lambda _native: None)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per forwarded request otherwise
    try:
        specs = load_catalog(config, environ)
    except (ConfigError, OSError) as exc:
        log.error("router: %s", exc)
        return 1
    starting = sum(1 for s in specs.values() if s.load_on_startup)
    if config.models_max > 0 and starting > config.models_max:
        log.error("number of models to load on startup (%d) exceeds --models-max (%d)", starting, config.models_max)
        return 1
    _log_models(specs)
    try:
        listeners = open_listeners(config)
    except BindError as exc:
        log.error("%s", exc)
        return 1

    def reload() -> dict[str, ModelSpec]:
        return load_catalog(config, environ)

    async def run() -> None:
        upstream = Upstream(float(config.timeout))
        registry = Registry(config, from_argv(argv), specs, environ, upstream.client)
        app = create_router_app(config, registry, upstream, reload)
        uv_config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=max(5, min(config.timeout, 600)),
            timeout_graceful_shutdown=5,
            ssl_keyfile=config.ssl_key_file,
            ssl_certfile=config.ssl_cert_file,
        )
        server = uvicorn.Server(uv_config)

        def stop(sig: int, frame: FrameType | None) -> None:
            server.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        registry.start_watch()
        for listener in listeners:
            log.info("router listening on %s", listener.address)
            log.info("server listening on %s", listener.address)
        try:
            await server.serve(sockets=[listener.sock for listener in listeners])
        finally:
            await registry.shutdown()
            await upstream.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    try:
        run_on_fast_loop(run())
    except KeyboardInterrupt:
        pass
    finally:
        close_listeners(listeners)
    return 0
