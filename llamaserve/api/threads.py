"""--threads-http N: the worker threads for blocking work done for requests.

Two pools serve requests: anyio's thread limiter (Starlette's run_in_threadpool: static
files, sync handlers) and the event loop's default executor (asyncio.to_thread: schema
conversion, grammar checks, the stored-Responses database). N sizes both; -1 (or any
value < 1) keeps their defaults. Must run on the event loop, which owns both.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import anyio.to_thread


def size_worker_threads(n: int) -> None:
    if n < 1:
        return
    anyio.to_thread.current_default_thread_limiter().total_tokens = n
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=n, thread_name_prefix="llamaserve-http")
    )
