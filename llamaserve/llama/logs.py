"""Routes llama.cpp's own log lines into Python logging (logger "llama.cpp").

llama.cpp prints hundreds of lines while loading; by default only its
warnings and errors pass, and -v lets everything through.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp.llama_cpp as C

_log = logging.getLogger("llama.cpp")
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_state = {"verbose": False, "last": logging.INFO}
_partial: list[str] = []


def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # Level 5 (CONT) continues the previous line at its level.
    py_level = _state["last"] if level == 5 else _LEVELS.get(level, logging.INFO)
    _state["last"] = py_level
    if not _state["verbose"] and py_level < logging.WARNING:
        return
    _partial.append(text.decode("utf-8", errors="replace") if text else "")
    joined = "".join(_partial)
    if not joined.endswith("\n"):
        return  # llama.cpp sometimes writes a line in pieces
    _partial.clear()
    for line in joined.rstrip("\n").splitlines():
        _log.log(py_level, "%s", line)


# Module-level, so the C callback outlives every call into llama.cpp.
_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_on_log)


def route_llama_logs(verbose: bool) -> None:
    """Install the callback (kept referenced at module level so it is never freed)."""
    _state["verbose"] = verbose
    C.llama_log_set(_callback, ctypes.c_void_p(0))
