"""Handing freed heap memory back to the operating system (glibc's malloc_trim)."""

from __future__ import annotations

import ctypes
import sys


def malloc_trim() -> bool:
    """Hand free heap pages back to the OS; True when glibc did release some.

    Why: freeing the model and the KV cache returns most memory at once (the
    big ggml buffers are mmap'ed and munmap'ed), but many smaller allocations
    (tokenizer tables, compute-graph metadata, Python objects from the
    scheduler and worker threads) live in glibc's malloc arenas. glibc keeps
    freed chunks in those arenas for reuse and only shrinks the top of the main
    heap by itself, so RSS would stay high while the server sleeps.
    `malloc_trim(0)` walks every arena and releases all whole free pages.
    It is glibc-only: musl, macOS and Windows have no such symbol (or no
    CDLL(None)), and there we simply skip it.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))
