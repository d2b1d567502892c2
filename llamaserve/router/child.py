"""One model's process: our single-model server on a loopback port, watched by the router.

The child's stdin is a pipe the router never writes to: when the router dies the pipe
closes and the child exits (`LLAMASERVE_ROUTER_CHILD`, see `api/parent_watch.py`), so
no orphan keeps a model in memory. Its output is read line by line into the router's log
and a short tail kept for a failed load's report. A stop is SIGTERM (the child drains
its requests and exits 0), then SIGKILL after the model's `stop-timeout`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import sys
from collections.abc import Mapping

import httpx

from llamaserve.api.parent_watch import CHILD_ENV

log = logging.getLogger("llamaserve.router")

CHILD_HOST = "127.0.0.1"

TAIL_LINES = 20
# The router's own settings and secrets: a child gets its address and name on its command line.
_RESERVED_ENV = (
    "LLAMA_ARG_HOST",
    "LLAMA_ARG_PORT",
    "LLAMA_API_KEY",
    "LLAMA_ARG_API_KEY_FILE",
    "LLAMA_ARG_SSL_KEY_FILE",
    "LLAMA_ARG_SSL_CERT_FILE",
    "LLAMA_ARG_MODELS_DIR",
    "LLAMA_ARG_MODELS_PRESET",
    "LLAMA_ARG_MODELS_MAX",
    "LLAMA_ARG_MODELS_AUTOLOAD",
    "LLAMA_ARG_MODELS_MEMORY_MAX",
    "LLAMA_ARG_ALIAS",
    "LLAMA_ARG_MODEL",
    "LLAMA_ARG_HF_REPO",
    "LLAMA_ARG_API_PREFIX",
    "LLAMA_ARG_REUSE_PORT",
    "LLAMA_LOG_FILE",
    "LLAMA_ARG_LOG_FILE",
    "LLAMA_ARG_TOOLS",
    "LLAMA_ARG_AGENT",
    "LLAMA_ARG_UI_MCP_PROXY",
    "LLAMA_ARG_TOOLS_RUNTIME",
    "LLAMA_ARG_TOOLS_RUNTIME_HEADER",
    "LLAMA_ARG_MCP_SERVERS_CONFIG",
    "LLAMA_ARG_MCP_SERVERS_JSON",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((CHILD_HOST, 0))
        return int(s.getsockname()[1])


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in _RESERVED_ENV}
    env[CHILD_ENV] = "1"
    return env


def server_command() -> list[str]:
    """How to start our own server: this interpreter, this package."""
    return [sys.executable, "-m", "llamaserve"]


def rss_bytes(pid: int) -> int:
    """Resident memory of a process from /proc (0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.port = port
        self.base_url = f"http://{CHILD_HOST}:{port}"
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._killer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
        )
        self._reader = asyncio.create_task(self._read_output())

    async def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue  # an over-long line: dropped
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self.tail.append(text)
                log.info("[%s:%d] %s", self.name, self.port, text)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def rss(self) -> int:
        return rss_bytes(self.proc.pid) if self.alive and self.proc is not None else 0

    async def wait_healthy(self, client: httpx.AsyncClient) -> bool:
        """True once /health answers 200; False when the process ended first."""
        while self.alive:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(self.base_url + "/health", timeout=2.0)).status_code == 200:
                    return True
            await asyncio.sleep(0.05)
        return False

    async def wait(self) -> int:
        """The exit code (a negative signal number when killed), once the output is read too."""
        assert self.proc is not None
        code = await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._reader, 2.0)
        if self._killer is not None:
            self._killer.cancel()
        return code

    def stop(self, timeout: float) -> None:
        """SIGTERM now, SIGKILL after `timeout` seconds if it is still running."""
        if not self.alive or self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        if self._killer is None:
            self._killer = asyncio.create_task(self._kill_after(timeout))

    def kill(self) -> None:
        if self.alive and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def _kill_after(self, timeout: float) -> None:
        await asyncio.sleep(timeout)
        if self.alive:
            log.warning("model %s did not stop within %.0f s: killing it", self.name, timeout)
            self.kill()
