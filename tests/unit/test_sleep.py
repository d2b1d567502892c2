"""IdleSleeper's state machine without a model: in-flight tasks, one shared reload, no sleep/wake race."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from llamaserve.config import ServerConfig
from llamaserve.engine.stats import SchedulerStats
from llamaserve.errors import APIError
from llamaserve.serving import sleep
from llamaserve.serving.lora import LoraScales
from llamaserve.serving.state import ServerState

IDLE = 0.2


class FakeEngine:
    """What IdleSleeper touches of the engine's front: the counters it carries over."""

    def __init__(self) -> None:
        self.stats = SchedulerStats()
        self.cache_bytes = 0

    def prompt_cache_bytes(self) -> int:
        return self.cache_bytes


class FakeRuntime:
    """What IdleSleeper touches of a ModelRuntime."""

    def __init__(self, close_delay: float = 0.0) -> None:
        self.engine = FakeEngine()
        self.created = int(time.time())
        self.lora = LoraScales(["adapter.gguf"], [1.0])
        self.closed = threading.Event()
        self.close_delay = close_delay

    def close(self) -> None:
        time.sleep(self.close_delay)
        self.closed.set()


class Loader:
    def __init__(self, delay: float = 0.05, fail: bool = False) -> None:
        self.calls = 0
        self.delay = delay
        self.fail = fail
        self.loaded: list[FakeRuntime] = []

    def __call__(self, config: ServerConfig) -> Any:
        self.calls += 1
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("disk gone")
        rt = FakeRuntime()
        self.loaded.append(rt)
        return rt


@pytest.fixture(autouse=True)
def _views(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sleep.info, "props", lambda rt: {"is_sleeping": False, "total_slots": 1})
    monkeypatch.setattr(sleep.info, "models", lambda rt: {"data": [{"id": "m"}]})


def make(loader: Loader, rt: FakeRuntime | None = None) -> tuple[ServerState, sleep.IdleSleeper]:
    state = ServerState(ServerConfig(model="m.gguf"))
    state.runtime = rt or FakeRuntime()  # type: ignore[assignment]
    return state, sleep.IdleSleeper(state, IDLE, loader=loader)


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def test_falls_asleep_after_idle_and_snapshots_the_views() -> None:
    async def main() -> None:
        first = FakeRuntime()
        first.engine.stats.tokens_predicted_total = 42
        first.engine.cache_bytes = 4096  # /metrics while asleep answers with it
        first.lora.scales = [0.25]  # as POST /lora-adapters left it
        state, sl = make(Loader(), first)
        sl.start()
        await until(lambda: state.asleep is not None and sl._transition is None)
        assert state.runtime is None and first.closed.is_set()
        assert state.asleep is not None
        assert state.asleep.props["is_sleeping"] is True and state.asleep.models["data"][0]["id"] == "m"
        assert state.prompt_cache_bytes() == 4096 and state.engine_stats().tokens_predicted_total == 42
        sl.begin()
        await sl.awake()
        sl.end()
        rt = state.runtime
        assert isinstance(rt, FakeRuntime) and rt is not first and state.asleep is None
        assert rt.engine.stats.tokens_predicted_total == 42 and rt.created == first.created
        assert rt.lora.scales == [0.25]

    asyncio.run(main())


def test_a_task_in_flight_is_never_put_to_sleep() -> None:
    async def main() -> None:
        state, sl = make(Loader())
        sl.start()
        sl.begin()
        await sl.awake()
        await asyncio.sleep(IDLE * 3)  # a long stream
        assert state.asleep is None
        sl.end()
        t_end = time.monotonic()
        await until(lambda: state.asleep is not None)
        assert time.monotonic() - t_end >= IDLE * 0.9, "the clock starts at the end of the task"

    asyncio.run(main())


def test_concurrent_tasks_share_one_reload() -> None:
    async def main() -> None:
        loader = Loader(delay=0.2)
        state, sl = make(loader)
        sl.start()
        await until(lambda: state.asleep is not None and sl._transition is None)

        async def task() -> None:
            sl.begin()
            try:
                await sl.awake()
                assert state.runtime is not None
            finally:
                sl.end()

        await asyncio.gather(*(task() for _ in range(5)))
        assert loader.calls == 1 and sl.wakes == 1

    asyncio.run(main())


def test_a_task_arriving_while_falling_asleep_waits_then_wakes_it() -> None:
    async def main() -> None:
        loader = Loader()
        first = FakeRuntime(close_delay=0.3)
        state, sl = make(loader, first)
        sl.start()
        await until(lambda: sl._transition is not None)  # freeing has begun
        assert state.runtime is None and not first.closed.is_set()
        sl.begin()
        await sl.awake()
        assert first.closed.is_set(), "the reload waited for the freeing"
        assert loader.calls == 1 and state.runtime is loader.loaded[0]
        sl.end()

    asyncio.run(main())


def test_a_failed_reload_fails_the_waiting_tasks_and_the_next_task_retries() -> None:
    async def main() -> None:
        loader = Loader(fail=True)
        state, sl = make(loader)
        sl.start()
        await until(lambda: state.asleep is not None and sl._transition is None)
        sl.begin()
        with pytest.raises(APIError) as err:
            await sl.awake()
        sl.end()
        assert err.value.status == 503 and state.asleep is not None and state.runtime is None
        loader.fail = False
        sl.begin()
        await sl.awake()
        sl.end()
        assert loader.calls == 2 and state.runtime is loader.loaded[0]

    asyncio.run(main())


def test_falling_asleep_trims_memory_once_the_runtime_is_freed() -> None:
    async def main() -> None:
        rt = FakeRuntime(close_delay=0.05)
        state, sl = make(Loader(), rt)
        trimmed_after_close: list[bool] = []
        state.trim_memory = lambda: trimmed_after_close.append(rt.closed.is_set()) or True
        sl.start()
        await until(lambda: state.asleep is not None and sl._transition is None)
        assert trimmed_after_close == [True]

    asyncio.run(main())
