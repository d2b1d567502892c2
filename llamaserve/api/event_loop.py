"""Which asyncio event loop serves HTTP: uvloop where it is installed (uvicorn[standard] brings it).

On 2 cores every CPU microsecond the event loop spends per streamed token is taken from
ggml's threads. uvloop's C loop (self-pipe wakeups, socket writes, the ready queue) costs a
fraction of the pure-Python one's. `LLAMASERVE_LOOP=asyncio` keeps the standard loop (for
comparing the two, or should uvloop misbehave on some platform).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any


def fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A loop factory for `asyncio.Runner`; None keeps asyncio's default loop."""
    if os.environ.get("LLAMASERVE_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_on_fast_loop(main: Coroutine[Any, Any, None]) -> None:
    """`asyncio.run(main)`, on uvloop where it is installed."""
    with asyncio.Runner(loop_factory=fast_loop_factory()) as runner:
        runner.run(main)
