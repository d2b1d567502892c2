"""Model-loading progress: llama.cpp's progress callback, bridged to one Python reporter.

The reporter gets a fraction in [0, 1] and returns False to abort the load
(llama.cpp then returns no model), which lets a shutdown stop a long load.
Without a reporter llama.cpp's own callback stays in place.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import llama_cpp.llama_cpp as C

LoadReporter = Callable[[float], bool]
_reporter: list[LoadReporter | None] = [None]


def _on_progress(progress: float, _user: ctypes.c_void_p) -> bool:
    reporter = _reporter[0]
    if reporter is None:
        return True
    try:
        return bool(reporter(float(progress)))
    except Exception:  # a broken progress display must never fail a load
        return True


_callback = C.llama_progress_callback(_on_progress)  # module-level: outlives every load


def set_load_progress(reporter: LoadReporter | None) -> None:
    """Report every later model load of this process to `reporter` (None: llama.cpp's default)."""
    _reporter[0] = reporter


def apply_load_progress(params: Any) -> None:
    """Point a `llama_model_params` at the bridge when a reporter is set."""
    if _reporter[0] is not None:
        params.progress_callback = _callback  # module-level: outlives every load
        params.progress_callback_user_data = None
