"""--sleep-idle-seconds: unload the model after N idle seconds, reload on the next task.

llama-server's behaviour: after N seconds with no incoming task the model, its
context and the KV cache are freed; the next task reloads them transparently.
`/health`, `/props`, `/models`, `/v1/models` and `/metrics` are not tasks: they
neither wake the server nor restart the idle clock, and answer from a
`Snapshot` taken just before the model was freed.

`IdleSleeper` is the state machine; `api/middleware.IdleMiddleware` feeds it
(`begin`/`end` around every task, `awake` before the route runs). Everything
runs on the event loop thread except the slow parts (freeing, loading), which
go to worker threads. At most one transition (falling asleep or waking) runs
at a time and every task waits for it, so the two never race and concurrent
tasks arriving at a sleeping server share one reload.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from llamaserve.errors import APIError
from llamaserve.serving import info
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.serving.state import Loader, ServerState, Snapshot

log = logging.getLogger("llamaserve")

# How often the watcher looks again while the model is first loading (the idle
# clock starts when the load is done, not when the process started).
LOADING_POLL_S = 0.25


def rss_bytes() -> int | None:
    """This process's resident set size (Linux only; None elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 20):.0f}"


def _free(rt: ModelRuntime) -> None:
    """Worker thread: stop the scheduler, free the context and the model."""
    rt.close()


def _return_memory(trim: Callable[[], bool]) -> None:
    """Worker thread: collect Python cycles first so their memory is free too, then trim.

    Why the trim: freeing the model and the KV cache returns the big ggml
    buffers at once (they are mmap'ed), but many smaller allocations stay in
    the C allocator's arenas, which only shrink from the top by themselves;
    `state.trim_memory` (llama/memory.py) hands their free pages back.
    """
    gc.collect()
    trim()


class IdleSleeper:
    """Unloads the runtime after `idle_seconds` without tasks and reloads it on demand."""

    def __init__(self, state: ServerState, idle_seconds: float, loader: Loader | None = None) -> None:
        self.state = state
        self.idle_seconds = idle_seconds
        self.loader = loader or state.loader
        self.in_flight = 0  # tasks between begin() and end(): never sleep while > 0
        self.wakes = 0
        self._last_active = time.monotonic()
        self._transition: asyncio.Task[None] | None = None  # the sleep or wake in progress
        self._poke = asyncio.Event()  # something changed: the watcher recomputes its deadline
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ hooks
    def start(self) -> None:
        """Start the watcher on the running loop (once; called on every ASGI call, cheap)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="llamaserve-idle")

    def begin(self) -> None:
        """A task arrived. Counted until end(), so a long stream is never put to sleep."""
        self.in_flight += 1
        self._poke.set()

    def end(self) -> None:
        """A task's response is complete: the idle clock starts from here."""
        self.in_flight -= 1
        self._last_active = time.monotonic()
        self._poke.set()

    async def awake(self) -> None:
        """Return once the model is loaded, waiting for (or starting) the one reload.

        A transition in progress is awaited through `shield`: a task that is
        cancelled while waiting must not cancel a load other tasks wait for
        (nor leave a half-loaded model without an owner).
        """
        while True:
            task = self._transition
            if task is not None:
                await asyncio.shield(task)  # a failed wake raises its APIError to every waiter
                continue
            if self.state.asleep is None:
                return
            self._begin_transition(self._wake())

    # -------------------------------------------------------- internals
    def _begin_transition(self, body: Coroutine[Any, Any, None]) -> None:
        async def run() -> None:
            try:
                await body
            finally:
                # Cleared inside the task, so whoever the task's end wakes sees it gone.
                self._transition = None
                self._poke.set()

        task = asyncio.get_running_loop().create_task(run())
        # A failed wake whose waiters were all cancelled must not log "never retrieved".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._transition = task

    def _seconds_to_sleep(self) -> float | None:
        """Seconds left before falling asleep; None while that cannot happen."""
        if self._transition is not None or self.state.asleep is not None or self.in_flight > 0:
            return None
        if self.state.runtime is None or self.state.streams.producing():
            # Still loading at startup, or a resumable stream runs on after its client left
            # (no request counts it): keep the clock at zero and look again soon.
            self._last_active = time.monotonic()
            return LOADING_POLL_S
        return self._last_active + self.idle_seconds - time.monotonic()

    async def _watch(self) -> None:
        while True:
            try:
                self._poke.clear()
                delay = self._seconds_to_sleep()
                if delay is not None and delay <= 0 and self.state.runtime is not None:
                    self._fall_asleep(self.state.runtime)
                    continue
                try:
                    await asyncio.wait_for(self._poke.wait(), delay)
                except TimeoutError:
                    pass
            except Exception:
                log.exception("idle watcher")
                await asyncio.sleep(1.0)

    def _fall_asleep(self, rt: ModelRuntime) -> None:
        """Detach the runtime now (synchronously, so no task can pick it up), free it in a thread.

        Called only when no task is in flight; a task arriving from here on
        waits for the freeing to finish and then reloads.
        """
        self.state.asleep = Snapshot(
            props={**info.props(rt), "is_sleeping": True},
            models=info.models(rt),
            stats=rt.engine.stats,
            created=rt.created,
            lora_scales=list(rt.lora.scales),
            prompt_cache_bytes=self.state.prompt_cache_bytes(),
        )
        self.state.runtime = None
        idle = time.monotonic() - self._last_active

        async def release() -> None:
            before = rss_bytes()
            try:
                await asyncio.to_thread(_free, rt)
            except Exception:
                log.exception("freeing the model for sleep failed")
            await asyncio.to_thread(_return_memory, self.state.trim_memory)
            log.info(
                "sleeping after %.1f s idle: model and context freed (RSS %s -> %s MiB)",
                idle,
                _mib(before),
                _mib(rss_bytes()),
            )

        self._begin_transition(release())

    async def _wake(self) -> None:
        snapshot = self.state.asleep
        assert snapshot is not None
        t0 = time.perf_counter()
        try:
            rt = await asyncio.to_thread(self.loader, self.state.config)
        except Exception as exc:
            log.error("waking up failed: %s", exc)
            raise APIError(f"failed to reload the model after sleeping: {exc}", "unavailable_error") from exc
        rt.engine.stats = snapshot.stats
        rt.created = snapshot.created
        rt.lora.scales = snapshot.lora_scales or rt.lora.scales
        self.state.runtime = rt
        self.state.asleep = None
        self.wakes += 1
        self._last_active = time.monotonic()
        log.info("waking up: model reloaded in %.0f ms", (time.perf_counter() - t0) * 1000.0)
