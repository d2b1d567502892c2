"""Silence llama.cpp's loader chatter in tests that drive the ctypes API directly."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp.llama_cpp as C

_SILENT_LOG = C.llama_log_callback(lambda level, text, user_data: None)


@contextmanager
def silenced_llama_logs() -> Iterator[None]:
    """Install a no-op log callback and give back whatever logger was set before."""
    prev_cb = C.llama_log_callback()
    prev_ud = ctypes.c_void_p()
    C.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))
    C.llama_backend_init()
    C.llama_log_set(_SILENT_LOG, ctypes.c_void_p())
    try:
        yield
    finally:
        C.llama_log_set(prev_cb, prev_ud)
