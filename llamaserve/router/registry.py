"""The router's models and their processes: states, the load queue, eviction, status events.

Everything runs on the router's event loop, so no lock is needed: a change of state
wakes every waiter (`_changed`), which then looks again.

A request takes a lease on a loaded model (`acquire`), released when its answer has
been relayed. A model that is not running is loaded by the request at the head of a
FIFO queue once there is room: `--models-max` children at most, and with
`--models-memory-max` the children's measured resident memory (plus an estimate for the
newcomer: its last measured size, else its weights' size) within the limit. Requests
for the same model share one queue entry, so they need one load and one eviction. Room
is made by stopping idle models, least recently used first (by their last POST); a model
serving a request, loading, or wanted by a queued request is never a victim, so a
waiter may wait until a busy model's request ends. A child that exits is reported with
its exit code and the tail of its log, and a model whose load failed is tried again only
when a request asks for it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamaserve.config import ServerConfig
from llamaserve.errors import APIError
from llamaserve.router.catalog import ModelSpec
from llamaserve.router.child import CHILD_HOST, Child, child_env, free_port, server_command
from llamaserve.router.preset import ROUTER_ONLY_DESTS, Preset

log = logging.getLogger("llamaserve.router")

UNLOADED, LOADING, LOADED, SLEEPING = "unloaded", "loading", "loaded", "sleeping"
RUNNING = (LOADING, LOADED, SLEEPING)
MiB = 1024 * 1024
# LLAMA_SERVER_DEBUG_FAKE_TIMING (llama.cpp's test hook): a load and each proxied request
# first wait this long, so tests can see a model busy and a queue form.
FAKE_DELAY_S = 2.0


@dataclass
class Instance:
    spec: ModelSpec
    status: str = UNLOADED
    args: list[str] = field(default_factory=list)
    child: Child | None = None
    last_used: float = 0.0
    req_count: int = 0
    stopping: bool = False
    exit_code: int = 0
    failed: bool = False
    log_tail: list[str] = field(default_factory=list)
    loaded_info: dict[str, Any] = field(default_factory=dict)
    rss: int = 0  # last measured resident bytes

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    @property
    def base_url(self) -> str:
        assert self.child is not None
        return self.child.base_url


@dataclass
class _Entry:
    name: str
    waiters: int = 1
    loading: bool = False


class Registry:
    def __init__(
        self,
        config: ServerConfig,
        base: Preset,
        specs: dict[str, ModelSpec],
        environ: Mapping[str, str],
        client: httpx.AsyncClient,
    ) -> None:
        self.config = config
        self.base = base  # the router's own flags, under every model's settings
        self.environ = dict(environ)
        self.client = client
        self.models: dict[str, Instance] = {name: Instance(spec) for name, spec in specs.items()}
        self.queue: list[_Entry] = []
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self.fake_timing = bool(environ.get("LLAMA_SERVER_DEBUG_FAKE_TIMING"))
        self._event = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch: asyncio.Task[None] | None = None

    # ---- lookup and events

    def resolve(self, name: str) -> Instance | None:
        inst = self.models.get(name)
        if inst is not None:
            return inst
        return next((i for i in self.models.values() if name in i.spec.aliases), None)

    def _changed(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def _wait_change(self, timeout: float = 0.2) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)

    def _notify(self, inst: Instance) -> None:
        data: dict[str, Any] = {"status": inst.status}
        if inst.status == UNLOADED:
            data["exit_code"] = inst.exit_code
            if inst.failed:
                data["failed"] = True
                data["log_tail"] = inst.log_tail
        self.broadcast({"model": inst.name, "event": "model_status", "data": data})

    def broadcast(self, event: dict[str, Any]) -> None:
        """One event to every `/models/sse` client."""
        for queue in list(self.subscribers):
            queue.put_nowait(event)

    def _set_status(self, inst: Instance, status: str) -> None:
        inst.status = status
        self._notify(inst)
        self._tick()
        self._changed()

    # ---- capacity

    def _running(self) -> list[Instance]:
        return [i for i in self.models.values() if i.running]

    def _measure(self) -> int:
        used = 0
        for inst in self._running():
            if inst.child is not None:
                rss = inst.child.rss()
                if rss:
                    inst.rss = rss
            used += inst.rss
        return used

    def _estimate(self, inst: Instance) -> int:
        return inst.rss or int(inst.spec.weights_bytes * 1.1) + 64 * MiB

    def _memory_fits(self, inst: Instance, used: int) -> bool:
        limit = self.config.models_memory_max * MiB
        if limit <= 0 or not self._running():
            return True  # one model always may run, however large
        return used + self._estimate(inst) <= limit

    def _has_capacity(self, inst: Instance) -> bool:
        n_max = self.config.models_max
        if n_max > 0 and len(self._running()) >= n_max:
            return False
        return self._memory_fits(inst, self._measure())

    def _queued(self, name: str) -> _Entry | None:
        return next((e for e in self.queue if e.name == name), None)

    def _victim(self) -> Instance | None:
        idle = [
            i
            for i in self.models.values()
            if i.status in (LOADED, SLEEPING) and i.req_count == 0 and not i.stopping and self._queued(i.name) is None
        ]
        return min(idle, key=lambda i: i.last_used) if idle else None

    def _tick(self) -> None:
        """Stop idle models while queued requests need more room than is free or being freed."""
        if not self.queue:
            return
        running = self._running()
        stopping = [i for i in running if i.stopping]
        needed = [e for e in self.queue if not e.loading]
        n_max = self.config.models_max
        if n_max > 0:
            free = n_max - len(running) + len(stopping)
            while free < len(needed):
                victim = self._victim()
                if victim is None:
                    break
                log.info("evicting idle model %s for a queued request", victim.name)
                self._stop(victim)
                free += 1
        head = next((self.models[e.name] for e in needed[:1]), None)
        if head is not None and self.config.models_memory_max > 0:
            used = self._measure() - sum(i.rss for i in self._running() if i.stopping)
            while not self._memory_fits(head, used):
                victim = self._victim()
                if victim is None:
                    break
                log.info("evicting idle model %s: %d MiB in use", victim.name, used // MiB)
                self._stop(victim)
                used -= victim.rss

    # ---- the queue and leases

    def _join(self, name: str) -> None:
        entry = self._queued(name)
        if entry is not None:
            entry.waiters += 1
        else:
            self.queue.append(_Entry(name))

    def _leave(self, name: str) -> None:
        entry = self._queued(name)
        if entry is not None:
            entry.waiters -= 1
            if entry.waiters <= 0:
                self.queue.remove(entry)

    def _try_claim(self, inst: Instance) -> bool:
        if not self.queue or self.queue[0].name != inst.name or self.queue[0].loading:
            return False
        if not self._has_capacity(inst):
            return False
        self.queue[0].loading = True
        return True

    async def acquire(self, inst: Instance, gone: Callable[[], Awaitable[bool]], *, touch: bool) -> None:
        """Wait until `inst` is loaded (loading it when its turn comes) and take a lease on it."""
        joined = False
        spawned = False
        saw_loading = False
        try:
            while True:
                if inst.status in (LOADED, SLEEPING) and not inst.stopping:
                    inst.req_count += 1
                    if touch:
                        inst.last_used = time.monotonic()
                    return
                if inst.status == LOADING:
                    saw_loading = True
                elif inst.status == UNLOADED and not inst.stopping:
                    if spawned or saw_loading:
                        raise self._load_error(inst)
                    if not joined:
                        self._join(inst.name)
                        joined = True
                        self._tick()
                    if self._try_claim(inst):
                        self._spawn(inst)
                        spawned = True
                        continue
                elif not joined:  # stopping: the next instance will serve this request
                    self._join(inst.name)
                    joined = True
                    self._tick()
                if await gone():
                    raise APIError(f"request cancelled while waiting for model '{inst.name}'", status=499)
                await self._wait_change()
        finally:
            if joined:
                self._leave(inst.name)
                self._tick()
                self._changed()

    def release(self, inst: Instance, child: Child | None) -> None:
        """End a lease taken on `child`; a lease on a process that has since exited is already gone."""
        if child is inst.child and inst.req_count > 0:
            inst.req_count -= 1
            if inst.req_count == 0:
                self._tick()
                self._changed()

    async def exited(self, inst: Instance, child: Child, timeout: float = 5.0) -> bool:
        """Whether `child` has exited, waiting up to `timeout` s for the registry to see it go (then
        `inst` is unloaded and the next request loads it again). False when it still runs."""
        deadline = time.monotonic() + timeout
        while inst.child is child:
            if time.monotonic() > deadline or (child.alive and time.monotonic() > deadline - timeout + 1.0):
                return False  # still running a second later: it refused for another reason
            await self._wait_change(0.05)
        return True

    def _load_error(self, inst: Instance) -> APIError:
        if inst.failed:
            tail = " | ".join(inst.log_tail[-3:])
            return APIError(
                f"model '{inst.name}' failed to load (exit code {inst.exit_code}): {tail}",
                "unavailable_error",
            )
        return APIError(f"model '{inst.name}' was unloaded while it was loading", "unavailable_error")

    # ---- starting and stopping children

    def child_argv(self, inst: Instance, port: int) -> list[str]:
        own = inst.spec.preset.over(self.base)  # the model's settings over the router's flags
        # The router names each child after its model, and keeps its address and secrets to itself.
        argv = own.argv(skip_dests={"alias", "tags"} | ROUTER_ONLY_DESTS)
        return [*argv, "--host", CHILD_HOST, "--port", str(port), "--alias", inst.name]

    def _spawn(self, inst: Instance) -> None:
        port = free_port()
        inst.args = ["llama-server", *self.child_argv(inst, port)]
        inst.exit_code = 0
        inst.failed = False
        inst.log_tail = []
        inst.loaded_info = {}
        inst.last_used = time.monotonic()
        log.info("loading model %s on port %d: %s", inst.name, port, " ".join(inst.args[1:]))
        self._set_status(inst, LOADING)
        task = asyncio.create_task(self._run_child(inst, port))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_child(self, inst: Instance, port: int) -> None:
        if self.fake_timing:
            await asyncio.sleep(FAKE_DELAY_S)
        child = Child(inst.name, [*server_command(), *inst.args[1:]], child_env(self.environ), port)
        try:
            await child.start()
        except OSError as exc:
            inst.exit_code, inst.failed, inst.log_tail = -1, True, [f"cannot start: {exc}"]
            inst.stopping = False
            self._set_status(inst, UNLOADED)
            return
        inst.child = child
        ready = asyncio.create_task(self._await_ready(inst, child))
        code = await child.wait()
        ready.cancel()
        inst.log_tail = list(child.tail)
        inst.exit_code = code
        inst.failed = code != 0 and not inst.stopping
        inst.stopping = False
        inst.child = None
        inst.req_count = 0  # its requests ended with the process
        inst.rss = 0 if not inst.failed else inst.rss
        if inst.failed:
            log.error("model %s exited with code %d; last lines:\n%s", inst.name, code, "\n".join(inst.log_tail))
        else:
            log.info("model %s stopped (exit code %d)", inst.name, code)
        self._set_status(inst, UNLOADED)

    async def _await_ready(self, inst: Instance, child: Child) -> None:
        if not await child.wait_healthy(self.client):
            return
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
            listing = (await self.client.get(child.base_url + "/v1/models", timeout=10.0)).json()
            info = dict(listing["data"][0])
            inst.loaded_info = {k: v for k, v in info.items() if k not in ("id", "object", "owned_by", "created")}
        inst.rss = child.rss()
        if inst.status == LOADING and child is inst.child:
            self._set_status(inst, LOADED)

    def _stop(self, inst: Instance) -> None:
        if inst.stopping or inst.child is None:
            return
        inst.stopping = True
        if inst.status == LOADING:
            inst.child.kill()  # nothing to drain yet
        else:
            inst.child.stop(inst.spec.stop_timeout)
        self._changed()

    # ---- what the routes ask for

    async def load(self, inst: Instance) -> None:
        """POST /models/load: make room (stopping the least recently used idle model), then start it."""
        if self.fake_timing:
            await asyncio.sleep(FAKE_DELAY_S)
        deadline = time.monotonic() + max(30.0, inst.spec.stop_timeout + 10.0)
        while not self._has_capacity(inst):
            victim = self._victim()
            if victim is None or time.monotonic() > deadline:
                raise APIError("model limit reached, try again later", "unavailable_error")
            log.info("models limit reached: unloading %s", victim.name)
            self._stop(victim)
            while victim.running and time.monotonic() < deadline:
                await self._wait_change()
        if inst.status == UNLOADED and not inst.stopping:
            self._spawn(inst)

    def unload(self, inst: Instance) -> None:
        self._stop(inst)

    async def forget(self, inst: Instance, timeout: float = 30.0) -> None:
        """`DELETE /models`: stop `inst` if it runs, wait for its process to end, and drop it from
        the list (with a `model_remove` event). APIError when it will not stop in time."""
        self._stop(inst)
        deadline = time.monotonic() + timeout
        while inst.child is not None:
            if time.monotonic() > deadline:
                raise APIError(f"model '{inst.name}' did not stop; try again", "unavailable_error")
            await self._wait_change()
        self.models.pop(inst.name, None)
        self.broadcast({"model": inst.name, "event": "model_remove"})
        self._changed()

    async def reload(self, specs: dict[str, ModelSpec]) -> None:
        """`GET /models?reload=1`: a running model whose source changed or went away is unloaded;
        the others take their new settings (a failed load is forgotten), new models are added."""
        changed = [
            inst
            for name, inst in self.models.items()
            if inst.running and (name not in specs or specs[name].preset.argv() != inst.spec.preset.argv())
        ]
        for inst in changed:
            self._stop(inst)
        deadline = time.monotonic() + 30.0
        while any(i.running for i in changed) and time.monotonic() < deadline:
            await self._wait_change()
        for name in [n for n, i in self.models.items() if n not in specs and not i.running]:
            del self.models[name]
        for name, spec in specs.items():
            known = self.models.get(name)
            if known is None:
                self.models[name] = Instance(spec)
            else:
                known.spec = spec  # a running one's flags are unchanged (else it was stopped above)
                if not known.running:
                    known.failed, known.exit_code = False, 0
        self.broadcast({"model": "*", "event": "models_reload"})
        self._changed()

    def start_watch(self) -> None:
        """Startup models, and with --models-memory-max the periodic check of the children's memory."""
        for inst in self.models.values():
            if inst.spec.load_on_startup and inst.status == UNLOADED:
                self._spawn(inst)
        if self.config.models_memory_max > 0:
            self._watch = asyncio.create_task(self._memory_watch())

    async def _memory_watch(self) -> None:
        limit = self.config.models_memory_max * MiB
        while True:
            await asyncio.sleep(1.0)
            used = self._measure()
            while used > limit and len([i for i in self._running() if not i.stopping]) > 1:
                victim = self._victim()
                if victim is None:
                    break
                log.info("evicting idle model %s: %d MiB over the limit", victim.name, (used - limit) // MiB)
                self._stop(victim)
                used -= victim.rss

    async def shutdown(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for inst in self.models.values():
            if inst.child is not None:
                inst.stopping = True
                inst.child.stop(min(inst.spec.stop_timeout, 10.0))
        deadline = time.monotonic() + 15.0
        while any(i.child is not None for i in self.models.values()) and time.monotonic() < deadline:
            await self._wait_change(0.1)
        for inst in self.models.values():
            if inst.child is not None:
                inst.child.kill()

    def pids(self) -> dict[str, int]:
        return {i.name: i.child.pid for i in self.models.values() if i.child is not None and i.child.pid}
