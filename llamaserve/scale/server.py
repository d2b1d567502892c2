"""`--upstreams`: the front's process (no model, no children): listeners, uvicorn, the health watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from types import FrameType

import uvicorn

from llamaserve.api.event_loop import run_on_fast_loop
from llamaserve.api.listen import BindError, close_listeners, open_listeners
from llamaserve.api.logs import setup_logging
from llamaserve.config import ServerConfig
from llamaserve.router.proxy import Upstream
from llamaserve.scale.balancer import Balancer
from llamaserve.scale.front import create_front_app
from llamaserve.scale.health import check_once, watch

log = logging.getLogger("llamaserve.scale")


def serve(config: ServerConfig) -> int:
    setup_logging(config, lambda _native: None)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        listeners = open_listeners(config)
    except BindError as exc:
        log.error("%s", exc)
        return 1

    async def run() -> None:
        upstream = Upstream(float(config.timeout))
        balancer = Balancer(config.upstreams)
        await check_once(balancer, upstream.client)
        for url, member in balancer.members.items():
            log.info("upstream %s: %s", url, "healthy" if member.healthy else "not answering /health yet")
        app = create_front_app(config, balancer, upstream)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                timeout_keep_alive=max(5, min(config.timeout, 600)),
                timeout_graceful_shutdown=5,
                ssl_keyfile=config.ssl_key_file,
                ssl_certfile=config.ssl_cert_file,
            )
        )

        def stop(sig: int, frame: FrameType | None) -> None:
            server.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        watcher = asyncio.create_task(watch(balancer, upstream.client))
        for listener in listeners:
            log.info("server listening on %s (front for %d upstreams)", listener.address, len(balancer.members))
        try:
            await server.serve(sockets=[listener.sock for listener in listeners])
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
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
