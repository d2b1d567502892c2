"""One start-up for every process that serves HTTP: the single-model server, the router, the front.

All three bind their listeners before anything slow (llama-server binds every address before
it loads, so a busy port fails at once), run uvicorn on those sockets on the fast event loop
(api/event_loop.py), and stop on SIGTERM/SIGINT with exit code 0. What differs is the app and
what runs beside it, which a process hands in as a `Site`; `run_server` owns the order:

    signals caught → site.begin → [loop: site.open → uvicorn serves → site.close] → site.end
    → listeners closed → signal handlers restored

so each process's shutdown (the drain, the children, the health watch) happens while the loop
still runs, and the sockets go only after everything that could still answer on them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from llamaserve.api.event_loop import run_on_fast_loop
from llamaserve.api.listen import BindError, Listener, close_listeners, open_listeners
from llamaserve.api.logs import setup_logging
from llamaserve.api.shutdown import ASGIApp
from llamaserve.api.timeouts import read_timeout_protocol
from llamaserve.config import ConfigError, ServerConfig
from llamaserve.telemetry.tracing import start_tracing

if TYPE_CHECKING:  # imported where the server starts: the model server's load begins before it
    import uvicorn

# ASGIApp is named here too, so a process's Site needs nothing of api/ but this module.
__all__ = [
    "ASGIApp",
    "Site",
    "StopSwitch",
    "bind",
    "run_server",
    "setup_forwarder_logging",
    "start_request_tracing",
    "uvicorn_config",
]

DEFAULT_GRACEFUL_S = 5  # how long uvicorn waits for open requests after a stop, unless a process says otherwise
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSwitch:
    """The process's one "please stop", whoever asks: a signal, a failed model load, a router gone.

    Asked before uvicorn runs, the wish is kept and handed to the server when it is attached
    (uvicorn then starts and stops at once); once attached, it is uvicorn's own `should_exit`,
    which uvicorn's signal capture sets too, so `requested` sees every way a stop comes.
    `request` may be called from any thread (the loader's, stdin's watcher): uvicorn polls the
    flag from its loop.
    """

    def __init__(self) -> None:
        self._early = False
        self._server: uvicorn.Server | None = None

    def request(self) -> None:
        self._early = True
        server = self._server
        if server is not None:
            server.should_exit = True

    @property
    def requested(self) -> bool:
        server = self._server
        return self._early or (server is not None and server.should_exit)

    def attach(self, server: uvicorn.Server) -> None:
        self._server = server
        if self._early:
            server.should_exit = True


class Site:
    """What one process plugs into `run_server`; each hook does nothing unless overridden."""

    # uvicorn cancels requests still open this long after the stop (the API drains its own first).
    graceful_s: int = DEFAULT_GRACEFUL_S
    # uvicorn's HTTP protocol: a name, or a class; "auto": api/timeouts.py's, which bounds the
    # headers' arrival by --timeout and spells the CORS headers as llama-server does, for every process.
    http: type[asyncio.Protocol] | str = "auto"

    def begin(self, stop: StopSwitch) -> None:
        """Before the loop, with the signals already caught: start what runs in threads of its own."""

    async def open(self, stop: StopSwitch) -> ASGIApp:
        """Inside the loop, before uvicorn: build the app and start the tasks that run beside it."""
        raise NotImplementedError

    async def close(self) -> None:
        """After uvicorn has stopped, while the loop still runs: stop what runs beside the app."""

    def end(self) -> None:
        """After the loop, also when it was interrupted: what must not outlive the process's serving."""


def bind(config: ServerConfig, log: logging.Logger) -> list[Listener] | None:
    """Every --host address bound, or None after logging which one failed (the process exits 1)."""
    try:
        return open_listeners(config)
    except BindError as exc:
        log.error("%s", exc)
        return None


def start_request_tracing(config: ServerConfig, service: str, log: logging.Logger) -> bool:
    """OpenTelemetry traces when the flags or the OTEL_* variables ask for them (telemetry/), under
    `service` unless OTEL_SERVICE_NAME names one; False, logged, when they cannot start."""
    try:
        if start_tracing(config, os.environ, service):
            log.info("tracing: every request exported as OpenTelemetry spans (%s)", service)
    except ConfigError as exc:
        log.error("tracing: %s", exc)
        return False
    return True


def setup_forwarder_logging(config: ServerConfig) -> None:
    """Logging for a process with no model (the router, the front): no native log to route, and
    httpx's line per forwarded request kept out of the log."""
    setup_logging(config, lambda _native: None)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_server(config: ServerConfig, listeners: list[Listener], site: Site, stop: StopSwitch | None = None) -> None:
    """Serve `site` on `listeners` until stopped; the listeners are closed on return."""
    switch = stop or StopSwitch()
    previous = _catch_signals(switch.request)
    try:
        site.begin(switch)
        run_on_fast_loop(_serve(config, listeners, site, switch))
    except KeyboardInterrupt:
        pass  # a second Ctrl-C while shutting down: what follows still cleans up
    finally:
        site.end()
        close_listeners(listeners)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _serve(config: ServerConfig, listeners: list[Listener], site: Site, stop: StopSwitch) -> None:
    import uvicorn

    app = await site.open(stop)
    server = uvicorn.Server(uvicorn_config(config, app, site))
    stop.attach(server)
    try:
        await server.serve(sockets=[listener.sock for listener in listeners])
    finally:
        await site.close()


def uvicorn_config(config: ServerConfig, app: ASGIApp, site: Site) -> uvicorn.Config:
    """The settings every process shares: no uvicorn access log (ours is api/middleware.py), the
    keep-alive bounded by --timeout, TLS from --ssl-key-file/--ssl-cert-file."""
    import uvicorn

    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=max(5, min(config.timeout, 600)),
        http=(read_timeout_protocol(config.timeout) or "auto") if site.http == "auto" else site.http,
        timeout_graceful_shutdown=site.graceful_s,
        ssl_keyfile=config.ssl_key_file,
        ssl_certfile=config.ssl_cert_file,
    )


def _catch_signals(stop: Callable[[], None]) -> dict[int, signal._HANDLER]:
    """SIGTERM/SIGINT only ask for the stop. uvicorn catches both while it serves, restores the
    handlers it found afterwards and raises the signal again: with the default actions that
    second delivery would kill the process (exit -15) or raise KeyboardInterrupt after a clean
    shutdown. Caught from before the loop starts, a signal during start-up stops cleanly too."""

    def handler(sig: int, frame: FrameType | None) -> None:
        stop()

    return {sig: signal.signal(sig, handler) for sig in _SIGNALS}
