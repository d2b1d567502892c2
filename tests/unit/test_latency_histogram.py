"""The latency histograms' buckets and sums, as /metrics renders them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from llamaserve.serving.latency import LatencyHistogram


def rendered(histogram: LatencyHistogram) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(histogram)
    out: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_value_counts_in_every_bucket_whose_bound_it_does_not_exceed() -> None:
    h = LatencyHistogram("t:latency_seconds", "test", (0.01, 0.1, 1.0))
    h.observe(0.01)  # on a bound: inside it (le)
    h.observe(0.05)
    h.observe(0.5, times=3)  # an event of three tokens: three gaps
    h.observe(7.0)  # past the last bound: +Inf only
    m = rendered(h)
    assert m['t:latency_seconds_bucket{le="0.01"}'] == 1
    assert m['t:latency_seconds_bucket{le="0.1"}'] == 2
    assert m['t:latency_seconds_bucket{le="1.0"}'] == 5
    assert m['t:latency_seconds_bucket{le="+Inf"}'] == 6
    assert m["t:latency_seconds_count"] == 6
    assert abs(m["t:latency_seconds_sum"] - (0.01 + 0.05 + 1.5 + 7.0)) < 1e-9
