"""Speculative decoding at load time: the draft model's own context and the `Speculator`.

Kept beside `compose.py` (the composition root, which calls it) because it puts llama.cpp
objects under the engine's seams.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import replace

from llamaserve.config import ConfigError, ServerConfig
from llamaserve.engine.speculative import DRAFT_MODEL, Speculator
from llamaserve.llama.context import Context, ContextSettings
from llamaserve.llama.draft import DraftModel
from llamaserve.llama.load_params import LoadSettingsError, ModelLoadSettings
from llamaserve.llama.model import Model

log = logging.getLogger("llamaserve")


def build_speculator(
    config: ServerConfig, model: Model, settings: ContextSettings, undo: ExitStack
) -> Speculator | None:
    """The server's drafters, or None without --spec-type; a draft model is loaded here."""
    spec = config.spec
    if spec.draft_model and DRAFT_MODEL not in spec.active_types:
        log.warning("a draft model was given but --spec-type has no draft-simple: the draft model is not used")
    if not spec.enabled:
        return None
    draft = None
    if DRAFT_MODEL in spec.active_types and spec.draft_model:
        draft = _load_draft(config, model, settings, undo)
    log.info("speculative decoding: %s", ", ".join(spec.active_types))
    return Speculator(spec, draft)


def _load_draft(config: ServerConfig, target: Model, settings: ContextSettings, undo: ExitStack) -> DraftModel:
    spec = config.spec
    assert spec.draft_model is not None
    try:
        model = Model(spec.draft_model, ModelLoadSettings(n_gpu_layers=spec.draft_ngl, devices=config.load.devices))
    except LoadSettingsError as exc:
        raise ConfigError(str(exc)) from exc
    undo.callback(model.close)
    if model.n_vocab != target.n_vocab:
        raise ConfigError(
            f"the draft model's vocabulary ({model.n_vocab} tokens) is not the target model's ({target.n_vocab}): "
            "speculative decoding needs the same tokenizer"
        )
    threads = spec.draft_threads if spec.draft_threads > 0 else settings.n_threads
    threads_batch = spec.draft_threads_batch if spec.draft_threads_batch > 0 else threads
    draft_settings = replace(
        settings,
        n_threads=threads,
        n_threads_batch=threads_batch,
        cache_type_k=spec.draft_cache_type_k,
        cache_type_v=spec.draft_cache_type_v,
        # The target's RoPE overrides are the target's: the draft keeps its own.
        rope_scaling=None,
        rope_freq_base=0.0,
        rope_freq_scale=0.0,
        yarn_orig_ctx=0,
    )
    context = Context(model, draft_settings)
    undo.callback(context.close)
    log.info("draft model loaded: %s", spec.draft_model)
    return DraftModel(model, context)
