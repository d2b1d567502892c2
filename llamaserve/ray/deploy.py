"""The Ray Serve application: one ingress deployment in front of N replicas of our engine.

`build_app(argv, replicas=N)` or `build_app(argv, autoscale=(MIN, MAX))` gives the
application; `app` (in `llamaserve/ray/__init__.py`) is the builder `serve run` calls.
Each replica reserves as many Ray CPUs as its `-t` threads, so Ray places replicas on the
nodes that have the cores. Autoscaling is on queue depth: Ray counts each replica's ongoing
requests (running in its slots plus waiting in its engine's queue) and keeps them near the
slot count (`-np`, `target_ongoing_requests`), so a replica is added while requests wait.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any, cast

from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.requests import Request
from starlette.responses import Response

from llamaserve.ray.ingress import Ingress
from llamaserve.ray.replica import Engine

ROUTER_CLASS = "llamaserve.ray.routing.PrefixRouter"
HEALTH_PERIOD_S = 2.0
DEFAULT_SLOTS = 4


@serve.deployment(health_check_period_s=HEALTH_PERIOD_S, health_check_timeout_s=20, graceful_shutdown_timeout_s=10)
class LlamaReplica:
    def __init__(self, argv: list[str]) -> None:
        self.engine = Engine(argv, serve.get_replica_context().replica_id.unique_id)

    async def forward(
        self, hint: dict[str, Any], method: str, path: str, query: str, headers: list[tuple[str, str]], body: bytes
    ) -> AsyncIterator[Any]:
        async for item in self.engine.forward(method, path, query, headers, body):
            yield item

    async def check_health(self) -> None:
        await self.engine.check_health()

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


@serve.deployment(num_replicas=1, max_ongoing_requests=10_000, ray_actor_options={"num_cpus": 0})
class LlamaIngress:
    def __init__(self, replicas: Any) -> None:
        self.ingress = Ingress(replicas)

    async def __call__(self, request: Request) -> Response:
        return await self.ingress.handle(request)


def _flag(argv: list[str], names: tuple[str, ...], default: int) -> int:
    """An integer flag's last value in a llama-server command line (`-t 2`, `--threads=2`)."""
    value = default
    for i, arg in enumerate(argv):
        name, eq, attached = arg.partition("=")
        if name in names:
            raw = attached if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if raw.lstrip("-").isdigit():
                value = int(raw)
    return value


def build_app(argv: list[str], replicas: int = 1, autoscale: tuple[int, int] | None = None) -> Any:
    threads = _flag(argv, ("-t", "--threads"), int(os.environ.get("LLAMA_ARG_THREADS", "0") or 0))
    slots = _flag(argv, ("-np", "--parallel"), DEFAULT_SLOTS)
    slots = slots if slots > 0 else DEFAULT_SLOTS
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": threads if threads > 0 else 1},
        # Above the slots, requests wait in the engine's own queue (llamacpp:requests_deferred).
        "max_ongoing_requests": 4 * slots,
        "request_router_config": RequestRouterConfig(request_router_class=ROUTER_CLASS),  # type: ignore[arg-type]
    }
    if autoscale is not None:
        low, high = autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "initial_replicas": low,
            "target_ongoing_requests": slots,
            "upscale_delay_s": 2.0,
            "downscale_delay_s": float(os.environ.get("LLAMASERVE_RAY_DOWNSCALE_DELAY_S", "60")),
            "metrics_interval_s": 1.0,
            "look_back_period_s": 4.0,
        }
    else:
        options["num_replicas"] = replicas
    # serve.deployment turns the classes into Deployment objects, which mypy sees as the classes.
    replica = cast(Any, LlamaReplica).options(**options).bind(argv)
    return cast(Any, LlamaIngress).bind(replica)
