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


_LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO}


class _ColorFormatter(logging.Formatter):
    COLORS = {logging.ERROR: "\033[31m", logging.WARNING: "\033[33m", logging.DEBUG: "\033[90m"}

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        color = self.COLORS.get(record.levelno)
        return f"{color}{text}\033[0m" if color else text


def setup_logging(config: ServerConfig) -> None:
    """-lv/-v pick the level; --log-file, --log-timestamps, --log-colors, --log-disable shape it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if config.log_disable:
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL + 1)
        route_llama_logs(verbose=False)
        return
    level = _LEVELS.get(config.log_verbosity, logging.DEBUG)
    fmt = ("%(asctime)s " if config.log_timestamps else "") + "%(levelname).1s %(name)s: %(message)s"
    stream_handler = logging.StreamHandler(sys.stderr)
    colors = config.log_colors == "on" or (config.log_colors == "auto" and sys.stderr.isatty())
    stream_handler.setFormatter(_ColorFormatter(fmt) if colors else logging.Formatter(fmt))
    root.addHandler(stream_handler)
    if config.log_file:
        file_handler = logging.FileHandler(config.log_file, encoding="utf-8")
        file_handler.setFormatter(logging.Formatter(fmt))
        root.addHandler(file_handler)
    root.setLevel(level)
    route_llama_logs(verbose=config.log_verbosity > 3)


def serve(config: ServerConfig) -> int:
    setup_logging(config)
    state = ServerState(config)
    app = create_app(state)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                               access_log=False, timeout_keep_alive=max(5, min(config.timeout, 600)),
                               ssl_keyfile=config.ssl_key_file, ssl_certfile=config.ssl_cert_file)
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
