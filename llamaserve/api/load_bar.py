"""The model's loading progress, drawn in place on a terminal: `loading model [####----]  45%`.

Its own module because two places draw it: the early load that `cli` starts before the server
module is imported (model_load.py: a small model is loaded before the server is up) and the
server, whose reporter also stops a load that a shutdown made pointless.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TextIO

from llamaserve.config import ServerConfig


def terminal_load_bar(stream: TextIO) -> Callable[[float], None]:
    """A drawer of progress fractions (0..1) onto `stream`; each percent is drawn once."""
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


@functools.cache
def _stderr_load_bar() -> Callable[[float], None]:
    """One bar per process: the early load's and the server's reporters share it."""
    return terminal_load_bar(sys.stderr)


def load_bar_for(config: ServerConfig) -> Callable[[float], None] | None:
    """The bar on stderr when it is a terminal and logging is on, else None. Every caller gets
    the same bar, so a reporter that replaces another mid-load does not draw a percent twice."""
    return _stderr_load_bar() if sys.stderr.isatty() and not config.log_disable else None
