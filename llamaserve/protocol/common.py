"""Request fields shared by every generating endpoint: llama.cpp's sampling knobs.

llama-server accepts its native sampling parameters on the OpenAI routes too,
so all request models inherit these. Every number is range-checked here so
a bad value is a 400 naming the field, never a crash in C.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr

LogitBias = dict[str, float | bool] | list[list[Any]]


class SamplingFields(BaseModel):
    # Unknown fields are accepted and ignored, as llama-server does: clients
    # send vendor extensions (user, metadata, store, …) that change nothing.
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    temperature: float | None = Field(None, ge=0.0, le=100.0)
    dynatemp_range: float | None = Field(None, ge=0.0, le=100.0)
    dynatemp_exponent: float | None = Field(None, ge=0.0, le=100.0)
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    typical_p: float | None = Field(None, ge=0.0, le=1.0)
    top_n_sigma: float | None = Field(None, ge=-1.0, le=100.0)
    xtc_probability: float | None = Field(None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(None, ge=0.0, le=1.0)
    repeat_last_n: int | None = Field(None, ge=-1, le=1_000_000)
    repeat_penalty: float | None = Field(None, ge=0.0, le=100.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    dry_multiplier: float | None = Field(None, ge=0.0, le=100.0)
    dry_base: float | None = Field(None, ge=1.0, le=100.0)
    dry_allowed_length: int | None = Field(None, ge=0, le=10_000)
    dry_penalty_last_n: int | None = Field(None, ge=-1, le=1_000_000)
    dry_sequence_breakers: list[str] | None = Field(None, max_length=64)
    mirostat: int | None = Field(None, ge=0, le=2)
    mirostat_tau: float | None = Field(None, ge=0.0, le=100.0)
    mirostat_eta: float | None = Field(None, ge=0.0, le=10.0)
    # llama-server: the target at most 1 (negative: off), the decay within [0, 0.99].
    adaptive_target: float | None = Field(None, ge=-1e30, le=1.0)
    adaptive_decay: float | None = Field(None, ge=0.0, le=0.99)
    seed: int | None = Field(None, ge=-1, le=2**32 - 1)
    min_keep: int | None = Field(None, ge=0, le=1000)
    ignore_eos: bool | None = None
    logit_bias: LogitBias | None = None
    samplers: list[str] | str | None = None
    n_probs: int | None = Field(None, ge=0, le=100)
    post_sampling_probs: bool | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None

    # llama-server request extras
    cache_prompt: bool | None = None
    id_slot: int | None = Field(None, ge=-1)
    t_max_predict_ms: int | None = Field(None, ge=0)
    # Code completion (llama.vim, llama.vscode): after the first newline, a line indented by
    # fewer spaces or tabs ends the answer, without that line's text.
    n_indent: int | None = Field(None, ge=0)
    n_keep: int | None = Field(None, ge=-1)
    # Tokens a context shift drops; 0: half of what follows n_keep. A negative value
    # crashed llama-server (CVE-2026-21869): refused here with a 400.
    n_discard: int | None = Field(None, ge=0)
    n_cache_reuse: int | None = Field(None, ge=0)
    lora: list[Any] | None = None  # [{"id": 0, "scale": 0.5}]: per-request adapter scales
    n_predict: int | None = Field(None, ge=-1)
    # Debugging and progress extras: `verbose` adds `__verbose` (the native answer) to OpenAI
    # answers (None: on with -v); `timings_per_token` puts timings on every streamed chunk;
    # `return_progress` streams prompt-processing progress before the first token.
    verbose: bool | None = None
    timings_per_token: bool | None = None
    return_progress: bool | None = None
    # llama-server's per-request --sse-ping-interval for a streamed answer: seconds of quiet
    # before a `:` comment line, -1 (or 0) for none; unset, the server's setting.
    sse_ping_interval: int | None = Field(None, ge=-1, le=2**31 - 1)
    # Ours (vLLM's convention): lower values are admitted and prefilled first; 0 by default.
    priority: int | None = Field(None, ge=-(2**31), le=2**31 - 1)


class LazyGrammarFields(BaseModel):
    """llama-server's lazy grammar on its completion routes (serving/lazy_grammar.py checks the
    entries, so that a bad one is a 400 naming it)."""

    grammar_lazy: bool = False
    grammar_triggers: list[Any] | None = Field(None, max_length=256)
    preserved_tokens: list[StrictStr] | None = Field(None, max_length=1024)
