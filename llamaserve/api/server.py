"""Process wiring: logging, the uvicorn server (api/run.py, shared with the router and the
front), and loading the model.

The listeners are bound first and the model starts loading in a thread at once; the app
(FastAPI, every API family's routes and models: most of the start's imports) is imported
and built while llama.cpp loads the weights, which it does without the GIL, so on two cores
the two overlap. /health answers 503 until the model is in; a model that fails to load
ends the process with exit code 1.
SIGTERM and SIGINT stop accepting connections, give in-flight requests
GRACEFUL_SHUTDOWN_S to finish (then cancel them, which frees their slots),
stop the scheduler and exit 0, as llama-server does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llamaserve.api.heap import settle_heap
from llamaserve.api.listen import Listener, close_listeners
from llamaserve.api.load_bar import load_bar_for
from llamaserve.api.logs import setup_logging
from llamaserve.api.parent_watch import exit_when_stdin_closes, is_router_child
from llamaserve.api.run import Site, StopSwitch, bind, run_server, start_request_tracing
from llamaserve.api.shutdown import ASGIApp, DrainMiddleware
from llamaserve.api.threads import size_worker_threads
from llamaserve.api.timeouts import TimeoutMiddleware
from llamaserve.config import ServerConfig
from llamaserve.serving.state import ServerState

if TYPE_CHECKING:  # the app's modules load in `_ModelSite.open`, while the model loads
    from llamaserve.families.batches.routes import BatchService
    from llamaserve.tools.registry import Toolbox

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


def serve(state: ServerState, hooks: NativeHooks) -> int:
    """Serve until SIGTERM/SIGINT while `state.loader` loads the model in the background; the exit code."""
    config = state.config
    setup_logging(config, hooks.route_logs)
    if not start_request_tracing(config, "llamaserve", log):
        return 1
    listeners = bind(config, log)
    if listeners is None:
        return 1
    try:
        toolbox = _toolbox(config)
    except ToolsSetupError as exc:
        log.error("tools setup failed: %s", exc)
        close_listeners(listeners)
        return 1
    if toolbox is not None or config.ui_mcp_proxy:
        log.warning("security: agent tools enabled - do not expose to untrusted environments")
    # One switch for the signals, the loader (a failed load stops the server) and the drain.
    stop = StopSwitch()
    site = _ModelSite(state, hooks, listeners, toolbox, stop)
    run_server(config, listeners, site, stop)
    return site.exit_code


class ToolsSetupError(Exception):
    """The agent tools' flags ask for what cannot be set up (MCP definitions, --tools-runtime)."""


def _toolbox(config: ServerConfig) -> Toolbox | None:
    """The agent tools (api/routes_tools.py), None when off. Their modules load only when some are on."""
    if not config.tools_enabled:
        return None
    from llamaserve.api.routes_tools import toolbox_from_config
    from llamaserve.tools.fileio import RuntimeRefused
    from llamaserve.tools.mcp_config import McpConfigError

    try:
        return toolbox_from_config(config)
    except (RuntimeRefused, McpConfigError) as exc:
        raise ToolsSetupError(str(exc)) from exc


class _ModelSite(Site):
    """The single-model server in the shared start-up: the model loads in a thread of its own,
    started before the app is imported and built, while uvicorn already answers (/health is 503
    until it is in), and a stop drains the requests in flight before uvicorn's own shutdown."""

    graceful_s = GRACEFUL_SHUTDOWN_S + _UVICORN_BACKSTOP_S

    def __init__(
        self,
        state: ServerState,
        hooks: NativeHooks,
        listeners: list[Listener],
        toolbox: Toolbox | None,
        stop: StopSwitch,
    ) -> None:
        self.state = state
        self.hooks = hooks
        self.listeners = listeners
        self.toolbox = toolbox
        self.exit_code = 0
        self.batches: BatchService | None = None  # with the app, in open()
        self.loader = threading.Thread(target=self._load, name="llamaserve-load", daemon=True)
        self.stop = stop
        self._watcher: asyncio.Task[None] | None = None

    def begin(self, stop: StopSwitch) -> None:
        config = self.state.config
        draw = load_bar_for(config)

        def report(progress: float) -> bool:
            if draw is not None:
                draw(progress)
            return not stop.requested  # False aborts a load that a shutdown made pointless

        self.hooks.set_load_progress(report)
        if is_router_child():
            exit_when_stdin_closes(stop.request)
        self.loader.start()

    def _load(self) -> None:
        state = self.state
        try:
            state.runtime = state.loader(state.config)
            settle_heap()  # the loaded model's objects out of the collector's passes (also after the app is built)
            for listener in self.listeners:
                log.info("server listening on %s", listener.address)
        except Exception as exc:  # reported and turned into exit code 1
            if self.stop.requested:
                log.info("model load stopped: shutting down")
                return
            state.load_error = str(exc)
            log.error("failed to load the model: %s", exc)
            self.exit_code = 1
            self.stop.request()

    async def open(self, stop: StopSwitch) -> ASGIApp:
        # Imported here, not at the top: the loader thread started in begin() is in llama.cpp by now.
        from llamaserve.api.app import create_app

        app = create_app(self.state, self.toolbox)
        self.batches = app.state.batches
        drain = DrainMiddleware(app)
        size_worker_threads(self.state.config.threads_http)
        if self.toolbox is not None:
            await self.toolbox.start()  # before the first request: GET /tools lists the MCP tools at once
        self._watcher = asyncio.create_task(self._drain_on_shutdown(drain))
        settle_heap()  # the app's objects too (the model may have loaded first: api/heap.py)
        self.batches.start()  # resumes the batches a previous run left unfinished
        # Outermost: a stalled body read or response write is bounded before anything else sees it,
        # including the closing message a shutdown drain sends.
        return TimeoutMiddleware(drain, self.state.config.timeout)

    async def _drain_on_shutdown(self, drain: DrainMiddleware) -> None:
        # uvicorn polls should_exit the same way; its own wait for in-flight
        # tasks then ends as soon as the drain has finished them.
        while not self.stop.requested:
            await asyncio.sleep(0.1)
        # Batch lines in flight are cancelled, not drained: they keep no record and run again
        # after the restart.
        if self.batches is not None:
            await self.batches.stop()
        if self.toolbox is not None:
            await self.toolbox.shutdown()  # tool calls in flight end now, not after the grace period
        if drain.inflight:
            log.info("shutting down: %d request(s) in flight get up to %d s", drain.inflight, GRACEFUL_SHUTDOWN_S)
        await drain.drain(GRACEFUL_SHUTDOWN_S)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self.batches is not None:
            await self.batches.stop()
        # Stop the scheduler while the loop still runs: it may still hand
        # events of just-aborted requests to the loop, which must be open.
        await asyncio.to_thread(self._close_runtime)

    def end(self) -> None:
        self._close_runtime()  # a no-op unless the loop was interrupted before close()

    def _close_runtime(self) -> None:
        if self.loader.ident is not None:  # started: a load stopped by shutdown returns soon
            self.loader.join(timeout=_LOADER_JOIN_S)
        runtime, self.state.runtime = self.state.runtime, None
        if runtime is not None:
            runtime.close()
