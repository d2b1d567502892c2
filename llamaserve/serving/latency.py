"""Latency histograms llama-server lacks: time to first token, inter-token latency,
request duration. Observed where events reach the HTTP side, so they measure
what clients experience, queueing included.

The inter-token histogram is observed once per streamed token on the event loop
thread, which every stream shares, so it is a plain list of bucket counts rather
than prometheus_client's Histogram (a lock, a value object per bucket and a
method call chain per observation); `/metrics` renders it through a collector.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SLOW = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_ITL = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class LatencyHistogram(Collector):
    """A Prometheus histogram observed from one thread (the event loop's)."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        # A bucket holds the values up to its bound (Prometheus' `le`): the first bound >= seconds.
        self._counts[bisect_left(self._bounds, seconds)] += times
        self._sum += seconds * times

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative = list(accumulate(self._counts))
        les = [repr(float(b)) for b in self._bounds] + ["+Inf"]  # as prometheus_client spells them
        yield HistogramMetricFamily(
            self.name, self.documentation, buckets=list(zip(les, cumulative, strict=True)), sum_value=self._sum
        )


REGISTRY = CollectorRegistry(auto_describe=True)
TIME_TO_FIRST_TOKEN = LatencyHistogram(
    "llamaserve:time_to_first_token_seconds",
    "Time from request submission to the first generated text.",
    _FAST,
)
INTER_TOKEN_LATENCY = LatencyHistogram(
    "llamaserve:inter_token_latency_seconds",
    "Time between consecutive generated tokens of one request.",
    _ITL,
)
REQUEST_DURATION = LatencyHistogram(
    "llamaserve:request_duration_seconds",
    "Time from request submission to its last event.",
    _SLOW,
)
for _histogram in (TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, REQUEST_DURATION):
    REGISTRY.register(_histogram)


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
            # An event carrying n tokens (speculative decoding) is n gaps of the mean length.
            INTER_TOKEN_LATENCY.observe((now - self.last) / n, min(n, 16))
        self.last = now

    def done(self) -> None:
        REQUEST_DURATION.observe(time.perf_counter() - self.start)
