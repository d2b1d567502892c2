"""A request's phases as spans: queue wait, prefill and decode of each choice, from the engine's
`Finished` (its `timings` and the moment it finished), with explicit start and end times.

The engine measures with `time.perf_counter()`; spans need wall-clock nanoseconds, so each
instant is shifted by the offset between the two clocks, read when the spans are built.
Attribute names follow OpenTelemetry's GenAI semantic conventions where they have one
(`gen_ai.usage.*`, `gen_ai.response.finish_reasons`); the rest are `llamaserve.*`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer

from llamaserve.engine.types import Finished

QUEUE, PREFILL, DECODE = "queue", "prefill", "decode"

# Attribute names (GenAI semantic conventions where one exists).
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHED_TOKENS = "gen_ai.usage.cache_read.input_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
SLOT_ID = "llamaserve.slot.id"
CHOICE_INDEX = "llamaserve.choice.index"
PROMPT_PROCESSED = "llamaserve.prompt.processed_tokens"  # prompt tokens decoded (not from the cache)
DRAFT_TOKENS = "llamaserve.draft.tokens"
DRAFT_ACCEPTED = "llamaserve.draft.accepted_tokens"


def clock_offset_ns() -> int:
    """Wall-clock nanoseconds minus perf_counter nanoseconds, now."""
    return time.time_ns() - time.perf_counter_ns()


def _ns(perf_seconds: float, offset_ns: int) -> int:
    return int(perf_seconds * 1e9) + offset_ns


def finish_reason(finished: Finished) -> str:
    """OpenAI's words for llama-server's stop types, as the chat answers use them."""
    return "length" if finished.stop_type == "limit" else "stop"


def phase_bounds(finished: Finished) -> tuple[float, float, float, float]:
    """(queued, prefill start, decode start, done) in perf_counter seconds: the phases are back to
    back and end when the request finished (a choice aborted during its prompt has no decode)."""
    t = finished.timings
    decode_start = finished.t_done - t.predicted_ms / 1e3
    prefill_start = decode_start - t.prompt_ms / 1e3
    return prefill_start - t.queue_ms / 1e3, prefill_start, decode_start, finished.t_done


def usage_attributes(choices: Sequence[tuple[int, Finished]]) -> dict[str, Any]:
    """The request span's token counts: the prompt once (the choices share it), the completions
    added up, the finish reasons in choice order, the first choice's slot."""
    ordered = [f for _, f in sorted(choices, key=lambda pair: pair[0])]
    first = ordered[0]
    return {
        INPUT_TOKENS: first.n_prompt_tokens,
        CACHED_TOKENS: first.n_cached,
        OUTPUT_TOKENS: sum(f.n_predicted for f in ordered),
        FINISH_REASONS: [finish_reason(f) for f in ordered],
        SLOT_ID: first.id_slot,
    }


def add_phase_spans(
    tracer: Tracer, parent: Context, choices: Sequence[tuple[int, Finished]], offset_ns: int | None = None
) -> None:
    """Each choice's queue, prefill and decode spans under `parent` (the request's span)."""
    offset = clock_offset_ns() if offset_ns is None else offset_ns
    several = len(choices) > 1
    for index, finished in choices:
        if not finished.t_done:  # made outside the engine (a test's stand-in): no times to place
            continue
        queued, prefill, decode, done = phase_bounds(finished)
        common: dict[str, Any] = {SLOT_ID: finished.id_slot}
        if several:
            common[CHOICE_INDEX] = index
        t = finished.timings
        phases: list[tuple[str, float, float, dict[str, Any]]] = [
            (QUEUE, queued, prefill, common),
            (
                PREFILL,
                prefill,
                decode,
                {
                    **common,
                    INPUT_TOKENS: finished.n_prompt_tokens,
                    CACHED_TOKENS: finished.n_cached,
                    PROMPT_PROCESSED: t.prompt_n,
                },
            ),
        ]
        if finished.n_predicted or done > decode:
            extra = {DRAFT_TOKENS: t.draft_n, DRAFT_ACCEPTED: t.draft_n_accepted} if t.draft_n else {}
            phases.append((DECODE, decode, done, {**common, OUTPUT_TOKENS: finished.n_predicted, **extra}))
        for name, start, end, attributes in phases:
            span = tracer.start_span(
                name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes, start_time=_ns(start, offset)
            )
            span.end(end_time=_ns(end, offset))
