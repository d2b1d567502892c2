"""Process wiring: logging, the uvicorn server, and loading the model.

The HTTP server starts first so /health can answer 503 while the model
loads; a model that fails to load ends the process with exit code 1.
SIGTERM and SIGINT stop accepting connections, give in-flight requests
GRACEFUL_SHUTDOWN_S to finish (then cancel them, which frees their slots),
stop the scheduler and exit 0, as llama-server does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TextIO

import uvicorn

from llamaserve.api.app import create_app
from llamaserve.api.event_loop import run_on_fast_loop
from llamaserve.api.listen import BindError, close_listeners, open_listeners
from llamaserve.api.logs import setup_logging
from llamaserve.api.parent_watch import exit_when_stdin_closes, is_router_child
from llamaserve.api.routes_tools import toolbox_from_config
from llamaserve.api.shutdown import DrainMiddleware
from llamaserve.api.threads import size_worker_threads
from llamaserve.api.timeouts import TimeoutMiddleware, read_timeout_protocol
from llamaserve.serving.state import ServerState
from llamaserve.tools.fileio import RuntimeRefused
from llamaserve.tools.mcp_config import McpConfigError

log = logging.getLogger("llamaserve")

GRACEFUL_SHUTDOWN_S = 5  # after SIGTERM/SIGINT, in-flight requests get this long before they are cancelled
_UVICORN_BACKSTOP_S = 5  # uvicorn cancels whatever still runs this long after the drain
_LOADER_JOIN_S = 30  # a load stopped by shutdown returns at its next progress report


@dataclass(frozen=True)
class NativeHooks:
    """What the process wiring needs from the inference library, handed in by llamaserve/compose.py."""

    route_logs: Callable[[bool], None]  # send the library's own log into Python logging (verbose or not)
    # Report loading progress (0..1) to a callback; the callback returning False aborts the load.
    set_load_progress: Callable[[Callable[[float], bool] | None], None]


def terminal_load_bar(stream: TextIO) -> Callable[[float], None]:
    """Draws llama.cpp's loading progress in place on a terminal: `loading model [####----]  45%`."""
    last = [-1]

    def draw(progress: float) -> None:
        pct = max(0, min(100, int(progress * 100)))
        if pct == last[0]:
            return
        last[0] = pct
        filled = pct * 24 // 100
        end = "\n" if pct == 100 else ""
        stream.write(f"\rloading model [{'#' * filled}{'-' * (24 - filled)}] {pct:3d}%{end}")
        stream.flush()

    return draw


def serve(state: ServerState, hooks: NativeHooks) -> int:
    """Serve until SIGTERM/SIGINT while `state.loader` loads the model in the background; the exit code."""
    config = state.config
    setup_logging(config, hooks.route_logs)
    try:
        listeners = open_listeners(config)
    except BindError as exc:
        log.error("%s", exc)
        return 1
    try:
        toolbox = toolbox_from_config(config)
    except (RuntimeRefused, McpConfigError) as exc:
        log.error("tools setup failed: %s", exc)
        close_listeners(listeners)
        return 1
    if toolbox is not None or config.ui_mcp_proxy:
        log.warning("security: agent tools enabled - do not expose to untrusted environments")
    # Outermost: a stalled body read or response write is bounded before anything else sees it,
    # including the closing message a shutdown drain sends.
    drain = DrainMiddleware(create_app(state, toolbox))
    app = TimeoutMiddleware(drain, config.timeout)
    uv_config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=max(5, min(config.timeout, 600)),
        http=read_timeout_protocol(config.timeout) or "auto",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S + _UVICORN_BACKSTOP_S,
        ssl_keyfile=config.ssl_key_file,
        ssl_certfile=config.ssl_cert_file,
    )
    server = uvicorn.Server(uv_config)
    exit_code = 0

    draw = terminal_load_bar(sys.stderr) if sys.stderr.isatty() and not config.log_disable else None

    def report(progress: float) -> bool:
        if draw is not None:
            draw(progress)
        return not server.should_exit  # False aborts a load that a shutdown made pointless

    hooks.set_load_progress(report)

    def load() -> None:
        nonlocal exit_code
        try:
            state.runtime = state.loader(config)
            for listener in listeners:
                log.info("server listening on %s", listener.address)
        except Exception as exc:  # reported and turned into exit code 1
            if server.should_exit:
                log.info("model load stopped: shutting down")
                return
            state.load_error = str(exc)
            log.error("failed to load the model: %s", exc)
            exit_code = 1
            server.should_exit = True

    def stop(sig: int, frame: FrameType | None) -> None:
        server.should_exit = True

    # uvicorn catches SIGTERM/SIGINT while it serves, shuts down, restores the
    # handlers it found and raises the signal again. With the default actions
    # that second delivery would kill the process (exit -15) or raise
    # KeyboardInterrupt after a clean shutdown; `stop` only asks for the
    # shutdown, which also covers a signal that comes before uvicorn listens.
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    if is_router_child():
        exit_when_stdin_closes(lambda: setattr(server, "should_exit", True))
    loader = threading.Thread(target=load, name="llamaserve-load", daemon=True)
    loader.start()

    async def run() -> None:
        async def drain_on_shutdown() -> None:
            # uvicorn polls should_exit the same way; its own wait for in-flight
            # tasks then ends as soon as the drain has finished them.
            while not server.should_exit:
                await asyncio.sleep(0.1)
            if toolbox is not None:
                await toolbox.shutdown()  # tool calls in flight end now, not after the grace period
            if drain.inflight:
                log.info("shutting down: %d request(s) in flight get up to %d s", drain.inflight, GRACEFUL_SHUTDOWN_S)
            await drain.drain(GRACEFUL_SHUTDOWN_S)

        size_worker_threads(config.threads_http)
        if toolbox is not None:
            await toolbox.start()  # before the first request: GET /tools lists the MCP tools at once
        watcher = asyncio.create_task(drain_on_shutdown())
        try:
            await server.serve(sockets=[listener.sock for listener in listeners])
        finally:
            watcher.cancel()
            # Stop the scheduler while the loop still runs: it may still hand
            # events of just-aborted requests to the loop, which must be open.
            await asyncio.to_thread(close_runtime)

    def close_runtime() -> None:
        loader.join(timeout=_LOADER_JOIN_S)
        runtime, state.runtime = state.runtime, None
        if runtime is not None:
            runtime.close()

    try:
        run_on_fast_loop(run())
    except KeyboardInterrupt:
        pass
    finally:
        close_runtime()  # a no-op unless run() was interrupted before its own close
        close_listeners(listeners)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return exit_code
