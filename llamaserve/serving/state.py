"""What every route sees: the config, the runtime once loaded, and how to (re)load it.

The loader and the memory trim are handed in by the composition root
(`llamaserve/compose.py`), so `serving/` never imports llama.cpp; tests hand
in fakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llamaserve.config import ServerConfig
from llamaserve.engine.stats import SchedulerStats
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.serving.stream_sessions import StreamSessions

Loader = Callable[[ServerConfig], ModelRuntime]


@dataclass(frozen=True)
class Snapshot:
    """What the exempt routes answer from while --sleep-idle-seconds has unloaded the model."""

    props: dict[str, Any]  # /props, with is_sleeping true
    models: dict[str, Any]  # /v1/models and /models
    # Carried into the reloaded scheduler so the /metrics counters stay monotonic
    # (Prometheus reads a drop as a process restart).
    stats: SchedulerStats
    created: int  # /v1/models `created`: the same model, the same timestamp
    lora_scales: list[float] = field(default_factory=list)  # set by POST /lora-adapters; kept across sleep
    # /metrics while asleep answers as it did just before (llama-server's cached metrics).
    prompt_cache_bytes: int = 0


def _no_loader(config: ServerConfig) -> ModelRuntime:
    raise RuntimeError("this server state was built without a model loader")


def _no_trim() -> bool:
    return False


@dataclass
class ServerState:
    """What every route can see: the config and, once loaded, the runtime."""

    config: ServerConfig
    runtime: ModelRuntime | None = None
    load_error: str | None = None
    started: float = field(default_factory=time.time)
    # Set while --sleep-idle-seconds has unloaded the model (serving/sleep.py):
    # `runtime` is then None and /props, /v1/models and /metrics answer from this.
    asleep: Snapshot | None = None
    loader: Loader = _no_loader  # builds a runtime from the config (at start and on waking)
    trim_memory: Callable[[], bool] = _no_trim  # hands freed heap pages back to the OS after a sleep
    # Streams a client can reattach to (X-Conversation-Id; serving/stream_sessions.py).
    streams: StreamSessions = field(default_factory=StreamSessions)

    def prompt_cache_bytes(self) -> int:
        """Bytes in the host-memory prompt cache (as they were, while asleep)."""
        if self.runtime is not None:
            return self.runtime.engine.prompt_cache_bytes()
        return self.asleep.prompt_cache_bytes if self.asleep is not None else 0

    def queued_tokens(self) -> int:
        """Prompt tokens of the requests waiting for a slot (none while asleep)."""
        return self.runtime.engine.queued_tokens() if self.runtime is not None else 0

    def engine_stats(self) -> SchedulerStats:
        """The live counters, those kept while asleep, or zeros while the model first loads."""
        if self.runtime is not None:
            return self.runtime.engine.stats
        if self.asleep is not None:
            return self.asleep.stats
        return SchedulerStats()
