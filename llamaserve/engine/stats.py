"""Counters the scheduler keeps for /metrics (llama-server's names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass

from llamaserve.engine.types import Timings


@dataclass
class SchedulerStats:
    prompt_tokens_total: int = 0  # prompt tokens decoded (cache hits excluded)
    prompt_tokens_cached_total: int = 0
    # Of those, the ones whose KV cells another sequence held (or its prefill wrote) and this
    # request shared instead of computing (engine/kv/sharing.py).
    prompt_tokens_shared_total: int = 0
    kv_cells_used: int = 0  # cells the sequences hold, each shared cell counted once (set when read)
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    # Decode steps those tokens took (each request's first token is free): the rate's numerator.
    tokens_predicted_steps_total: int = 0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0  # summed over decodes; divided by n_decode for the gauge
    n_tokens_max: int = 0
    requests_processing: int = 0
    requests_deferred: int = 0
    prompt_cache_saves: int = 0  # slot KV states parked in the host-memory cache
    prompt_cache_hits: int = 0  # prompts started from a parked state
    cache_reuse_tokens: int = 0  # tokens kept by moving chunks (--cache-reuse)
    context_shifts: int = 0
    idle_slots_cleared: int = 0  # idle slots moved to the host-memory cache (--cache-idle-slots)
    queue_seconds_total: float = 0.0  # time requests waited for a slot
    requests_rejected: int = 0  # refused with 429 by --max-queue / --max-queue-tokens
    spec_draft_tokens_total: int = 0  # tokens drafted and sent for verification
    spec_accepted_tokens_total: int = 0  # of those, the ones the target model agreed with
    spec_drafts_total: int = 0  # verification rows (one per draft)

    def count_finished(self, timings: Timings, n_tokens: int) -> None:
        """A request ended: its generated tokens count towards the rates; ``n_tokens`` is the
        most its slot held (prompt and answer), for llamacpp:n_tokens_max."""
        self.tokens_predicted_total += timings.predicted_n
        self.tokens_predicted_seconds_total += timings.predicted_ms / 1000.0
        self.tokens_predicted_steps_total += timings.predicted_steps
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)
