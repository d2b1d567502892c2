"""MCP servers over stdio, through the official `mcp` SDK's ClientSession (initialize,
tools/list, tools/call, request ids, notifications).

The child process is ours, not the SDK's `stdio_client`: a call that passes its server's
`timeout_ms` must kill the server at once, and the SDK's transport first waits for a polite
exit. Each child leads its own process group, so a kill also ends anything it started that
still holds its pipes. Lifecycle, as llama-server: every server is started once to list its
tools and stopped; a call starts it again on demand and keeps it for the calls that follow;
one that died (crashed, or killed after a timeout) is started afresh by the next call, and one
that cannot start is left alone for a few seconds. One server's trouble errors only its calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import mcp.types as mcp_types
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from llamaserve.tools.base import JSON, Call, Tool
from llamaserve.tools.mcp_config import McpServerConfig
from llamaserve.tools.proc import ChunkSink

log = logging.getLogger("llamaserve.tools")
T = TypeVar("T")

WARMUP_TIMEOUT_S = 10.0  # tool discovery at start, per server
COOLDOWN_S = 5.0  # after a failed start, before trying that server again
MAX_LINE = 8 * 1024 * 1024  # a longer line is dropped, so a child without newlines cannot grow us
_STDERR_TAIL = 4096


class McpUnavailable(Exception):
    pass


@dataclass(frozen=True)
class McpToolDef:
    server: str
    name: str
    description: str
    input_schema: JSON | None


class McpConnection:
    """One running MCP server: its process, the pumps between its pipes and the session."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.session: ClientSession | None = None
        self.pid: int | None = None
        self.stderr_tail = ""
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = anyio.Event()
        self._task = asyncio.ensure_future(self._run())

    @property
    def alive(self) -> bool:
        return self.session is not None and not self._closed.is_set()

    async def wait_ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except TimeoutError:
            await self.close()
            raise McpUnavailable("initialize timed out") from None

    async def close(self) -> None:
        self._closed.set()
        self._kill()
        await asyncio.wait([self._task])

    def _kill(self) -> None:
        if self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    async def _run(self) -> None:
        cfg = self.config
        try:
            process = await anyio.open_process(
                [cfg.command, *cfg.args],
                cwd=cfg.cwd or None,
                env={**os.environ, **cfg.env},
                start_new_session=True,
            )
        except OSError as exc:
            self._fail(McpUnavailable(f"failed to spawn '{cfg.command}': {exc.strerror or exc}"))
            return
        self.pid = process.pid
        to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        to_server, from_session = anyio.create_memory_object_stream[SessionMessage](16)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_stdout, process, to_session)
                tg.start_soon(self._write_stdin, process, from_session)
                tg.start_soon(self._read_stderr, process)
                info = mcp_types.Implementation(name="llamaserve", version="1.0")
                async with ClientSession(from_server, to_server, client_info=info) as session:
                    await session.initialize()
                    self.session = session
                    if not self._ready.done():
                        self._ready.set_result(None)
                    await self._closed.wait()
                tg.cancel_scope.cancel()
        except Exception as exc:
            self._fail(McpUnavailable(f"initialize failed: {exc}"))
        finally:
            self._closed.set()
            self._kill()
            with anyio.CancelScope(shield=True):
                await _reap(process)

    def _fail(self, exc: Exception) -> None:
        self._closed.set()
        if not self._ready.done():
            self._ready.set_exception(exc)
            self._ready.exception()  # retrieved here: a waiter may have given up already

    async def _read_stdout(self, process: Process, out: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        async with out:
            assert process.stdout is not None
            async for line in _lines(process.stdout):
                try:
                    message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError:
                    continue  # not a JSON-RPC message: skipped, as llama-server skips it
                await out.send(SessionMessage(message))
        # Its stdout is closed: the server is gone, and calls waiting on it end now.
        self._closed.set()

    async def _write_stdin(self, process: Process, messages: MemoryObjectReceiveStream[SessionMessage]) -> None:
        assert process.stdin is not None
        try:
            async with messages:
                async for message in messages:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self._closed.set()

    async def _read_stderr(self, process: Process) -> None:
        # Drained, or a chatty server blocks on a full pipe; the tail explains a death.
        assert process.stderr is not None
        async for line in _lines(process.stderr):
            log.debug("MCP '%s' stderr: %s", self.config.name, line)
            self.stderr_tail = (self.stderr_tail + line + "\n")[-_STDERR_TAIL:]


async def _lines(stream: ByteReceiveStream) -> Any:
    buf = b""
    skipping = False
    try:
        async for chunk in stream:
            buf += chunk
            while True:
                cut = buf.find(b"\n")
                if cut < 0:
                    break
                line, buf = buf[:cut], buf[cut + 1 :]
                if skipping:
                    skipping = False
                    continue
                text = line.rstrip(b"\r").decode("utf-8", "replace")
                if text:
                    yield text
            if len(buf) > MAX_LINE:
                buf, skipping = b"", True
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
        return


async def _reap(process: Process) -> None:
    with anyio.move_on_after(5):
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                try:
                    await stream.aclose()
                except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    pass
        await process.wait()


def _result_to_answer(result: mcp_types.CallToolResult) -> JSON:
    """llama-server's answer: the text parts joined, or `error` when the tool says it failed."""
    text = "\n".join(part.text for part in result.content if isinstance(part, mcp_types.TextContent))
    if result.is_error:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


class McpManager:
    def __init__(self, configs: list[McpServerConfig]) -> None:
        self.configs = {c.name: c for c in configs}
        self.tools: list[McpToolDef] = []
        self._conns: dict[str, McpConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._dead_until: dict[str, float] = {}
        self._stopping = False

    async def warmup(self) -> list[McpToolDef]:
        """Start each server, list its tools, stop it (all at once: one slow server does not
        hold up the others)."""
        found = await asyncio.gather(*(self._discover(c) for c in self.configs.values()))
        self.tools = [t for tools in found for t in tools]
        return self.tools

    async def _discover(self, config: McpServerConfig) -> list[McpToolDef]:
        conn = McpConnection(config)
        try:
            await conn.wait_ready(WARMUP_TIMEOUT_S)
            assert conn.session is not None
            listed = await asyncio.wait_for(conn.session.list_tools(), WARMUP_TIMEOUT_S)
        except (McpUnavailable, MCPError, TimeoutError, ValueError) as exc:
            log.warning("MCP warmup: '%s' failed: %s %s", config.name, exc, conn.stderr_tail.strip())
            return []
        finally:
            await conn.close()
        tools = [McpToolDef(config.name, t.name, t.description or "", t.input_schema) for t in listed.tools]
        log.info("MCP warmup: '%s' discovered %d tools", config.name, len(tools))
        return tools

    async def _connection(self, server: str) -> McpConnection:
        lock = self._locks.setdefault(server, asyncio.Lock())
        async with lock:
            if self._stopping:
                raise McpUnavailable(f"MCP server unavailable: {server}")
            conn = self._conns.get(server)
            if conn is not None and conn.alive:
                return conn
            if conn is not None:
                log.warning("MCP '%s' is no longer alive: %s", server, conn.stderr_tail.strip())
                self._conns.pop(server, None)
                await conn.close()
            if time.monotonic() < self._dead_until.get(server, 0.0):
                raise McpUnavailable(f"MCP server unavailable: {server}")
            conn = McpConnection(self.configs[server])
            try:
                await conn.wait_ready(self.configs[server].timeout_ms / 1000)
            except McpUnavailable as exc:
                log.warning("MCP '%s': failed to start: %s", server, exc)
                self._dead_until[server] = time.monotonic() + COOLDOWN_S
                raise McpUnavailable(f"MCP server unavailable: {server}") from exc
            self._conns[server] = conn
            return conn

    async def call(self, server: str, tool: str, arguments: JSON) -> JSON:
        try:
            conn = await self._connection(server)
        except McpUnavailable as exc:
            return {"error": str(exc)}
        assert conn.session is not None
        timeout = self.configs[server].timeout_ms / 1000
        try:
            result = await _until_closed(conn, conn.session.call_tool(tool, arguments), timeout)
        except TimeoutError:
            # A server past its timeout may never answer: it goes, and the next call starts a new one.
            log.warning("MCP '%s': %s timed out after %d ms, killing the server", server, tool, timeout * 1000)
            await conn.close()
            return {"error": "request timed out"}
        except McpUnavailable as exc:
            return {"error": str(exc)}
        except MCPError as exc:
            if not conn.alive:  # the SDK saw the pipe close before we did
                return {"error": f"MCP server '{server}' exited during the call"}
            return {"error": exc.error.message}
        except (ValueError, RuntimeError) as exc:  # an answer that breaks the protocol
            return {"error": f"invalid response from MCP server: {exc}"}
        if not isinstance(result, mcp_types.CallToolResult):
            return {"error": "invalid response from MCP server"}
        return _result_to_answer(result)

    async def close(self) -> None:
        self._stopping = True
        conns, self._conns = list(self._conns.values()), {}
        await asyncio.gather(*(c.close() for c in conns))


async def _until_closed(conn: McpConnection, work: Awaitable[T], timeout: float) -> T:
    """`work`, or McpUnavailable as soon as the server dies (a crash mid-call, a shutdown)."""
    task = asyncio.ensure_future(work)
    closed = asyncio.ensure_future(conn._closed.wait())
    try:
        done, _ = await asyncio.wait({task, closed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        if closed in done:
            raise McpUnavailable(f"MCP server '{conn.config.name}' exited during the call")
        raise TimeoutError
    finally:
        for t in (task, closed):
            if not t.done():
                t.cancel()


class McpTool(Tool):
    """One tool of an MCP server, offered as `<server>_<tool>`."""

    kind = "mcp"

    def __init__(self, definition: McpToolDef, manager: McpManager) -> None:
        self.tool = definition
        self.manager = manager
        self.name = self.display_name = f"{definition.server}_{definition.name}"

    def definition(self) -> JSON:
        schema = self.tool.input_schema if isinstance(self.tool.input_schema, dict) else {}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.tool.description, "parameters": schema},
        }

    def invoke(self, call: Call, sink: ChunkSink | None) -> JSON:
        raise NotImplementedError("MCP tools are called asynchronously")

    async def call(self, call: Call, sink: ChunkSink | None = None) -> JSON:
        return await self.manager.call(self.tool.server, self.tool.name, call.params)
