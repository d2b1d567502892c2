"""A router's child exits when the router does.

The router starts each model's server with `LLAMASERVE_ROUTER_CHILD=1` and a pipe on its
stdin that it never writes to. The pipe closes when the router exits, however it exits
(SIGKILL included), and the child then shuts down, so no orphan keeps a model in memory.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

CHILD_ENV = "LLAMASERVE_ROUTER_CHILD"
# A shutdown that a stuck request holds up must still end: the router is gone.
HARD_EXIT_AFTER_S = 15.0

log = logging.getLogger("llamaserve.http")


def is_router_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def exit_when_stdin_closes(shutdown: Callable[[], None]) -> None:
    """Call `shutdown` once stdin reaches end of file; exit the process if that has not ended it soon after."""

    def watch() -> None:
        # The raw descriptor, not sys.stdin: a daemon thread blocked inside a buffered reader
        # holds its lock, and the interpreter aborts at exit when it cannot take that lock.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        log.info("the router is gone (stdin closed): shutting down")
        shutdown()
        timer = threading.Timer(HARD_EXIT_AFTER_S, lambda: os._exit(1))
        timer.daemon = True
        timer.start()

    threading.Thread(target=watch, name="llamaserve-parent-watch", daemon=True).start()
