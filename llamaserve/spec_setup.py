"""Speculative decoding at load time: the draft model's own context and the `Speculator`.

Kept beside `compose.py` (the composition root, which calls it) because it puts llama.cpp
objects under the engine's seams. The draft model is placed as llama-server places it
(common_base_params_to_speculative): the target's load settings, with the draft's own layers,
devices (`-devd`, else `-dev`) and tensor overrides (`-otd`, `-cmoed`, `-ncmoed`, which replace
the target's), and thread pools of its own (`-Cd`, `--prio-draft`, ...).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import replace

from llamaserve.config import ConfigError, CpuPlacement, ServerConfig
from llamaserve.engine.ngram_cache import LookupCacheError
from llamaserve.engine.speculative import DRAFT_MODEL, Speculator
from llamaserve.llama.context import Context, ContextSettings
from llamaserve.llama.draft import DraftModel
from llamaserve.llama.load_params import LoadSettingsError, ModelLoadSettings
from llamaserve.llama.model import Model
from llamaserve.llama.threads import PoolSpec, ThreadPools
from llamaserve.model_load import moe_overrides

log = logging.getLogger("llamaserve")


def pool_spec(placement: CpuPlacement, fallback: CpuPlacement, n_threads: int) -> PoolSpec:
    """A thread pool's settings: each field the placement leaves unset is the fallback's."""
    cpus = placement.cpus() or fallback.cpus()
    strict = placement.strict if placement.strict is not None else bool(fallback.strict)
    prio = placement.prio if placement.prio is not None else (fallback.prio or 0)
    poll = placement.poll if placement.poll is not None else (fallback.poll if fallback.poll is not None else 50)
    return PoolSpec(n_threads=n_threads, cpus=cpus, strict=strict, prio=prio, poll=poll)


def _inherit(own: CpuPlacement, base: CpuPlacement) -> CpuPlacement:
    """`own`, its unset fields taken from `base` (the mask and range travel together)."""
    has_cpus = own.mask is not None or own.range is not None
    return CpuPlacement(
        mask=own.mask if has_cpus else base.mask,
        range=own.range if has_cpus else base.range,
        strict=own.strict if own.strict is not None else base.strict,
        prio=own.prio if own.prio is not None else base.prio,
        poll=own.poll if own.poll is not None else base.poll,
    )


def build_speculator(
    config: ServerConfig,
    model: Model,
    settings: ContextSettings,
    target_load: ModelLoadSettings,
    undo: ExitStack,
) -> Speculator | None:
    """The server's drafters, or None without --spec-type; a draft model is loaded here."""
    spec = config.spec
    if spec.draft_model and DRAFT_MODEL not in spec.active_types:
        log.warning("a draft model was given but --spec-type has no draft-simple: the draft model is not used")
    if (spec.lookup_cache_static or spec.lookup_cache_dynamic) and "ngram-cache" not in spec.active_types:
        log.warning("a lookup cache (-lcs/-lcd) was given but --spec-type has no ngram-cache: it is not used")
    if not spec.enabled:
        return None
    draft = None
    if DRAFT_MODEL in spec.active_types and spec.draft_model:
        draft = _load_draft(config, model, settings, target_load, undo)
    try:
        speculator = Speculator(spec, draft)
    except LookupCacheError as exc:
        raise ConfigError(str(exc)) from exc
    undo.callback(_close, speculator)
    log.info("speculative decoding: %s", ", ".join(spec.active_types))
    if speculator.lookup is not None:
        lookup = speculator.lookup
        log.info(
            "ngram-cache: static cache %s (%d n-grams), dynamic cache %s (%d n-grams)",
            spec.lookup_cache_static or "none",
            len(lookup.static),
            spec.lookup_cache_dynamic or "none",
            len(lookup.dynamic),
        )
    return speculator


def _close(speculator: Speculator) -> None:
    try:
        speculator.close()
    except OSError as exc:  # a full disk must not turn a clean stop into a crash
        log.error("could not write the dynamic lookup cache: %s", exc)


def draft_load_settings(config: ServerConfig, target_load: ModelLoadSettings) -> ModelLoadSettings:
    """The draft model's llama_model_params settings: the target's, with the draft's own placement."""
    spec = config.spec
    devices = spec.draft_devices if spec.draft_devices is not None else target_load.devices
    overrides = (*spec.draft_override_tensor, *moe_overrides(spec.draft_cpu_moe, spec.draft_n_cpu_moe))
    one_device = devices is not None and devices != "none" and len([d for d in devices.split(",") if d]) == 1
    return replace(
        target_load,
        n_gpu_layers=spec.draft_ngl,
        devices=devices,
        override_tensor=overrides,
        rpc_servers=(),  # the target's load added them as devices already
        # A draft pinned to one device needs no split across devices (llama-server does the same).
        split_mode="layer" if one_device else target_load.split_mode,
    )


def _draft_pools(config: ServerConfig, context: Context, n_threads: int, n_threads_batch: int) -> ThreadPools | None:
    """The draft context's thread pools: made when any placement flag, the target's or the draft's, asks."""
    placements = (config.cpu, config.cpu_batch, config.draft_cpu, config.draft_cpu_batch)
    if all(p.is_default for p in placements):
        return None
    gen = _inherit(config.draft_cpu, config.cpu)
    batch = _inherit(config.draft_cpu_batch, gen)
    gen_spec = pool_spec(gen, CpuPlacement(), n_threads)
    batch_spec = pool_spec(batch, gen, n_threads_batch)
    log.info(
        "draft thread pools: %d threads on CPUs %s (poll %d, strict %s, prio %d); batch %d threads on CPUs %s",
        gen_spec.n_threads,
        sorted(gen_spec.cpus) or "any",
        gen_spec.poll,
        gen_spec.strict,
        gen_spec.prio,
        batch_spec.n_threads,
        sorted(batch_spec.cpus) or "any",
    )
    return ThreadPools(context.handle, gen_spec, batch_spec)


def _load_draft(
    config: ServerConfig,
    target: Model,
    settings: ContextSettings,
    target_load: ModelLoadSettings,
    undo: ExitStack,
) -> DraftModel:
    spec = config.spec
    assert spec.draft_model is not None
    load = draft_load_settings(config, target_load)
    log.info(
        "loading draft model %s (devices: %s, tensor overrides: %s)",
        spec.draft_model,
        load.devices if load.devices is not None else "all",
        ", ".join(load.override_tensor) or "none",
    )
    try:
        model = Model(spec.draft_model, load)
    except LoadSettingsError as exc:
        # The message names the target's flag (--device, --override-tensor): the draft's twin is meant.
        raise ConfigError(f"draft model (-devd, -otd): {exc}") from exc
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
    pools = _draft_pools(config, context, threads, threads_batch)
    if pools is not None:
        undo.callback(pools.close)
    log.info("draft model loaded: %s", spec.draft_model)
    return DraftModel(model, context)
