"""GET /metrics: llama-server's `llamacpp:*` metrics plus our latency histograms.

Counters are read from the scheduler's stats at scrape time; the throughput
gauges are averaged over the window since the previous scrape, as
llama-server does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llamaserve.serving.latency import REGISTRY as LATENCY_REGISTRY
from llamaserve.serving.state import ServerState


def _metric(name: str, doc: str, kind: str, value: float) -> Metric:
    m = Metric(name, doc, kind)
    m.add_sample(name, {}, value)
    return m


@dataclass
class _Window:
    """Totals at the previous scrape, to turn counters into per-window rates."""

    at: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    decodes: int = 0
    busy: int = 0


class LlamaCollector(Collector):
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.window = _Window()

    def collect(self) -> Iterator[Metric]:
        rt = self.state.runtime
        s = self.state.scheduler_stats()  # while asleep (--sleep-idle-seconds): the counters the model had
        w = self.window
        d_prompt = s.prompt_tokens_total - w.prompt_tokens
        d_prompt_s = s.prompt_seconds_total - w.prompt_seconds
        d_pred = s.tokens_predicted_total - w.predicted_tokens
        d_pred_s = s.tokens_predicted_seconds_total - w.predicted_seconds
        d_dec = s.n_decode_total - w.decodes
        d_busy = s.n_busy_slots_total - w.busy
        self.window = _Window(
            time.perf_counter(),
            s.prompt_tokens_total,
            s.prompt_seconds_total,
            s.tokens_predicted_total,
            s.tokens_predicted_seconds_total,
            s.n_decode_total,
            s.n_busy_slots_total,
        )
        yield _metric(
            "llamacpp:prompt_tokens_total", "Number of prompt tokens processed.", "counter", s.prompt_tokens_total
        )
        yield _metric(
            "llamacpp:prompt_tokens_cached_total",
            "Number of prompt tokens reused from the cache.",
            "counter",
            s.prompt_tokens_cached_total,
        )
        yield _metric("llamacpp:prompt_seconds_total", "Prompt process time", "counter", s.prompt_seconds_total)
        yield _metric(
            "llamacpp:tokens_predicted_total",
            "Number of generation tokens processed.",
            "counter",
            s.tokens_predicted_total,
        )
        yield _metric(
            "llamacpp:tokens_predicted_seconds_total",
            "Predict process time",
            "counter",
            s.tokens_predicted_seconds_total,
        )
        yield _metric("llamacpp:n_decode_total", "Total number of llama_decode() calls", "counter", s.n_decode_total)
        yield _metric("llamacpp:n_tokens_max", "Largest observed n_tokens.", "counter", s.n_tokens_max)
        yield _metric(
            "llamacpp:n_busy_slots_per_decode",
            "Average number of busy slots per llama_decode() call",
            "gauge",
            d_busy / d_dec if d_dec else 0.0,
        )
        yield _metric(
            "llamacpp:prompt_tokens_seconds",
            "Average prompt throughput in tokens/s.",
            "gauge",
            d_prompt / d_prompt_s if d_prompt_s > 0 else 0.0,
        )
        yield _metric(
            "llamacpp:predicted_tokens_seconds",
            "Average generation throughput in tokens/s.",
            "gauge",
            d_pred / d_pred_s if d_pred_s > 0 else 0.0,
        )
        yield _metric("llamacpp:requests_processing", "Number of requests processing.", "gauge", s.requests_processing)
        yield _metric("llamacpp:requests_deferred", "Number of requests deferred.", "gauge", s.requests_deferred)
        # Ours: how the KV-cache features are doing (llama-server has no metrics for them).
        yield _metric(
            "llamaserve:prompt_cache_saves_total",
            "Slot KV states copied to the host-memory cache.",
            "counter",
            s.prompt_cache_saves,
        )
        yield _metric(
            "llamaserve:prompt_cache_hits_total",
            "Prompts started from the host-memory cache.",
            "counter",
            s.prompt_cache_hits,
        )
        ram = rt.scheduler.kv.prompt_cache if rt is not None else None
        yield _metric(
            "llamaserve:prompt_cache_bytes",
            "Bytes held by the host-memory prompt cache.",
            "gauge",
            ram.bytes_used if ram is not None else 0,
        )
        yield _metric(
            "llamaserve:cache_reuse_tokens_total",
            "Prompt tokens kept by moving KV chunks (--cache-reuse).",
            "counter",
            s.cache_reuse_tokens,
        )
        yield _metric(
            "llamaserve:context_shifts_total",
            "Context shifts of full slots (--context-shift).",
            "counter",
            s.context_shifts,
        )


def render_metrics(state: ServerState, collector: LlamaCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry) + generate_latest(LATENCY_REGISTRY)
