"""Latency histograms llama-server lacks: time to first token, inter-token latency,
request duration. Observed where events reach the HTTP side, so they measure
what clients experience, queueing included."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SLOW = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

TIME_TO_FIRST_TOKEN = Histogram(
    "llamaserve:time_to_first_token_seconds",
    "Time from request submission to the first generated text.",
    buckets=_FAST,
    registry=REGISTRY,
)
INTER_TOKEN_LATENCY = Histogram(
    "llamaserve:inter_token_latency_seconds",
    "Time between consecutive generated tokens of one request.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "llamaserve:request_duration_seconds",
    "Time from request submission to its last event.",
    buckets=_SLOW,
    registry=REGISTRY,
)


class RequestClock:
    """Follows one request's events and records its latencies."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.last: float | None = None

    def tokens(self, n: int) -> None:
        now = time.perf_counter()
        if self.last is None:
            TIME_TO_FIRST_TOKEN.observe(now - self.start)
        elif n > 0:
            per_token = (now - self.last) / n
            for _ in range(min(n, 16)):
                INTER_TOKEN_LATENCY.observe(per_token)
        self.last = now

    def done(self) -> None:
        REQUEST_DURATION.observe(time.perf_counter() - self.start)
