"""GET /metrics: llama-server's `llamacpp:*` metrics plus our latency histograms.

Counters are read from the scheduler's stats at scrape time; the throughput
gauges are averaged over the window since the previous scrape, as
llama-server does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from llamaserve.serving.latency import REGISTRY as LATENCY_REGISTRY
from llamaserve.serving.state import ServerState


def _metric(name: str, doc: str, kind: str, value: float) -> Metric:
    # A counter family is named without `_total` (the text format adds it to the sample).
    family = name.removesuffix("_total") if kind == "counter" else name
    m = Metric(family, doc, kind)
    m.add_sample(name, {}, value)
    return m


@dataclass
class _Window:
    """Totals at the previous scrape, to turn counters into per-window rates (llama-server's
    buckets, reset by each scrape). It lives beside the collector, not in the scheduler, so a
    reload after sleep, which carries the counters over, reports no window twice."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_steps: int = 0
    predicted_seconds: float = 0.0


def _text(kind: str, items: list[tuple[str, str, int | float]]) -> list[str]:
    """llama-server's own text: HELP, TYPE and the value under the sample's exact name.

    Written by hand because prometheus_client names a counter's TYPE line without its
    `_total` suffix, and parsers that pair each sample with its TYPE then find none."""
    lines = []
    for name, doc, value in items:
        lines += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value!r}"]
    return lines


class LlamaCollector(Collector):
    """Our own `llamaserve:*` metrics through prometheus_client; `llamacpp_text` renders
    llama-server's."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.window = _Window()

    def llamacpp_text(self) -> str:
        s = self.state.engine_stats()  # while asleep (--sleep-idle-seconds): the counters the model had
        w = self.window
        d_prompt = s.prompt_tokens_total - w.prompt_tokens
        d_prompt_s = s.prompt_seconds_total - w.prompt_seconds
        d_steps = s.tokens_predicted_steps_total - w.predicted_steps
        d_pred_s = s.tokens_predicted_seconds_total - w.predicted_seconds
        self.window = _Window(
            s.prompt_tokens_total,
            s.prompt_seconds_total,
            s.tokens_predicted_steps_total,
            s.tokens_predicted_seconds_total,
        )
        counters: list[tuple[str, str, int | float]] = [
            (
                "prompt_tokens_total",
                "Number of prompt tokens processed, excluding cached tokens",
                s.prompt_tokens_total,
            ),
            (
                "prompt_tokens_cached_total",
                "Number of prompt tokens reused from the cache",
                s.prompt_tokens_cached_total,
            ),
            ("prompt_seconds_total", "Total time spent processing prompts", s.prompt_seconds_total),
            ("tokens_predicted_total", "Number of generation tokens processed", s.tokens_predicted_total),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", s.tokens_predicted_seconds_total),
            ("n_decode_total", "Total number of llama_decode() calls", s.n_decode_total),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", s.n_tokens_max),
            (
                "spec_decode_num_draft_tokens_total",
                "Speculative: Total draft tokens generated",
                s.spec_draft_tokens_total,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "Speculative: Total draft tokens accepted by the target model",
                s.spec_accepted_tokens_total,
            ),
            (
                "spec_decode_num_drafts_total",
                "Speculative: Total speculative decoding verification steps",
                s.spec_drafts_total,
            ),
        ]
        gauges: list[tuple[str, str, int | float]] = [
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s",
                d_prompt / d_prompt_s if d_prompt_s > 0 else 0.0,
            ),
            # Over decode steps, so each request's free first token does not inflate the rate.
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s",
                d_steps / d_pred_s if d_pred_s > 0 else 0.0,
            ),
            ("requests_processing", "Number of requests processing", s.requests_processing),
            ("requests_deferred", "Number of requests deferred", s.requests_deferred),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per llama_decode() call",
                s.n_busy_slots_total / max(s.n_decode_total, 1),
            ),
        ]
        return "\n".join(_text("counter", counters) + _text("gauge", gauges)) + "\n"

    def collect(self) -> Iterator[Metric]:
        s = self.state.engine_stats()
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
        yield _metric(
            "llamaserve:prompt_cache_bytes",
            "Bytes held by the host-memory prompt cache.",
            "gauge",
            self.state.prompt_cache_bytes(),
        )
        yield _metric(
            "llamaserve:prompt_tokens_shared_total",
            "Prompt tokens whose KV cells another sequence held or wrote, shared instead of computed.",
            "counter",
            s.prompt_tokens_shared_total,
        )
        yield _metric(
            "llamaserve:kv_cells_used",
            "KV cells the sequences hold (busy and idle), a cell shared by several counted once.",
            "gauge",
            s.kv_cells_used,
        )
        yield _metric(
            "llamaserve:cache_reuse_tokens_total",
            "Prompt tokens kept by moving KV chunks (--cache-reuse).",
            "counter",
            s.cache_reuse_tokens,
        )
        yield _metric(
            "llamaserve:queue_seconds_total",
            "Time requests waited for a slot before their prompt started.",
            "counter",
            s.queue_seconds_total,
        )
        yield _metric(
            "llamaserve:requests_rejected_total",
            "Requests refused with 429 by --max-queue or --max-queue-tokens.",
            "counter",
            s.requests_rejected,
        )
        yield _metric(
            "llamaserve:queue_tokens",
            "Prompt tokens of the requests waiting for a slot.",
            "gauge",
            self.state.queued_tokens(),
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
    return collector.llamacpp_text().encode() + generate_latest(registry) + generate_latest(LATENCY_REGISTRY)
