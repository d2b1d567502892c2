"""Process wiring: logging, the uvicorn server, and loading the model.

The HTTP server starts first so /health can answer 503 while the model
loads; a model that fails to load ends the process with exit code 1.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading

import uvicorn

from llamaserve.api.app import create_app
from llamaserve.config import ServerConfig
from llamaserve.llama.logs import route_llama_logs
from llamaserve.serving.runtime import ServerState, load_runtime

log = logging.getLogger("llamaserve")


def setup_logging(config: ServerConfig) -> None:
    level = logging.DEBUG if config.log_verbosity > 3 else logging.INFO
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s")
    route_llama_logs(verbose=config.log_verbosity > 3)


def serve(config: ServerConfig) -> int:
    setup_logging(config)
    state = ServerState(config)
    app = create_app(state)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                               access_log=False, timeout_keep_alive=max(5, min(config.timeout, 600)))
    server = uvicorn.Server(uv_config)
    exit_code = 0

    def load() -> None:
        nonlocal exit_code
        try:
            state.runtime = load_runtime(config)
            log.info("server listening on http://%s:%d", config.host, config.port)
        except Exception as exc:  # reported and turned into exit code 1
            state.load_error = str(exc)
            log.error("failed to load the model: %s", exc)
            exit_code = 1
            server.should_exit = True

    threading.Thread(target=load, name="llamaserve-load", daemon=True).start()
    try:
        asyncio.run(server.serve())
    except KeyboardInterrupt:
        pass
    finally:
        if state.runtime is not None:
            state.runtime.close()
    return exit_code
