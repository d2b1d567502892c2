"""The garbage collector tuned for a server that holds a large, long-lived heap.

Once the model is loaded and the app is built, the process holds hundreds of thousands of
objects that live as long as it does (the vocabulary's pieces, the chat templates, the
routes). CPython's cyclic collector walks them again on every older-generation pass, and
the youngest generation is collected every 700 new container objects: with 256 streams,
a few times per decode step. Both passes hold the GIL, so the scheduler thread, ready
to launch the next step, waits behind them (measured with benchmarks/serving_ceiling.py:
at 256 streams with 10 ms steps, the runner's return waited 0.7 ms a step for the GIL).

Freezing what exists at start-up takes it out of every later pass, and a larger first
threshold makes the passes over the young objects rarer; objects freed by reference
counting, nearly all of a stream's, never reach the collector at all.
"""

from __future__ import annotations

import gc

# New container objects between two passes over the youngest generation (CPython's default: 700).
YOUNG_THRESHOLD = 20_000


def settle_heap() -> None:
    """Freeze the objects alive now and make young collections rarer; call once serving can begin."""
    gc.collect()  # what the start-up left as garbage is freed, not frozen
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
