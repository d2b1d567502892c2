"""Log output as llama-server shapes it (common/log.cpp), on Python logging.

- `--log-prefix` (on by default, as llama-server's common_init sets it): each line starts
  with its time (when `--log-timestamps`), level letter and source; `--no-log-prefix`
  leaves the bare message.
- `--log-jsonl`: one JSON object per line on stdout, llama.cpp's keys (`type`, `time` in
  microseconds since start or 0 without timestamps, `level`, `msg`) plus `source`; never
  coloured. `--log-file` gets the same lines.
- `--log-colors`, `--log-file`, `--log-disable`, `-lv`/`-v` as before.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import ClassVar

from llamaserve.config import ServerConfig

_LEVELS = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO}
_JSON_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn"}


class _ColorFormatter(logging.Formatter):
    COLORS: ClassVar[dict[int, str]] = {
        logging.ERROR: "\033[31m",
        logging.WARNING: "\033[33m",
        logging.DEBUG: "\033[90m",
    }

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        color = self.COLORS.get(record.levelno)
        return f"{color}{text}\033[0m" if color else text


class JSONLFormatter(logging.Formatter):
    def __init__(self, timestamps: bool) -> None:
        super().__init__()
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        level = _JSON_LEVELS.get(record.levelno, "error" if record.levelno > logging.WARNING else "debug")
        return json.dumps(
            {
                "type": "log",
                "time": int(record.relativeCreated * 1000) if self.timestamps else 0,
                "level": level,
                "msg": message,
                "source": record.name,
            },
            ensure_ascii=False,
        )


def _formatter(config: ServerConfig, colors: bool) -> logging.Formatter:
    if config.log_jsonl:
        return JSONLFormatter(config.log_timestamps)
    fmt = "%(message)s"
    if config.log_prefix:
        fmt = ("%(asctime)s " if config.log_timestamps else "") + "%(levelname).1s %(name)s: " + fmt
    return _ColorFormatter(fmt) if colors else logging.Formatter(fmt)


def setup_logging(config: ServerConfig, route_native_logs: Callable[[bool], None]) -> None:
    """-lv/-v pick the level; the other --log-* flags shape the lines (see the module doc)."""
    root = logging.getLogger()
    for handler in list(root.handlers):  # a second call (the model's load sets logging up first) replaces them
        root.removeHandler(handler)
        handler.close()  # a --log-file handler's file; a stream handler leaves its stream open
    if config.log_disable:
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL + 1)
        route_native_logs(False)
        return
    level = _LEVELS.get(config.log_verbosity, logging.DEBUG)
    stream = sys.stdout if config.log_jsonl else sys.stderr
    colors = not config.log_jsonl and (config.log_colors == "on" or (config.log_colors == "auto" and stream.isatty()))
    stream_handler = logging.StreamHandler(stream)
    stream_handler.setFormatter(_formatter(config, colors))
    root.addHandler(stream_handler)
    if config.log_file:
        file_handler = logging.FileHandler(config.log_file, encoding="utf-8")
        file_handler.setFormatter(_formatter(config, False))
        root.addHandler(file_handler)
    root.setLevel(level)
    route_native_logs(config.log_verbosity > 3)
