"""The composition root: the one module that wires llama.cpp under the server.

It builds a `ModelRuntime` from a `ServerConfig` (model, context, runner,
scheduler, template) and starts the HTTP server with the native hooks (the
log bridge, the loading bar, the memory trim). Everything below it is
written against plain types and protocols: `engine/` against the runner
seam, `serving/` against `engine/backend.py`, `api/` against `serving/`.
`cli.py` imports this module only after the flags are parsed, so `--help`
and a bad flag answer without loading libllama.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from llamaserve.api import server
from llamaserve.buildtag import build_tag
from llamaserve.chat.builtin_template import BuiltinTemplate
from llamaserve.chat.prompt_template import PromptTemplate
from llamaserve.chat.template import CHATML_TEMPLATE, ChatTemplate, TemplateError
from llamaserve.config import ConfigError, ContextTuning, CpuPlacement, ServerConfig
from llamaserve.engine.admission import QueueLimits
from llamaserve.engine.backend import Vocabulary
from llamaserve.engine.client import EngineClient
from llamaserve.engine.kv.files import SlotFiles
from llamaserve.engine.kv.policy import CachePolicy
from llamaserve.engine.prompt_log import PromptLoggingClient
from llamaserve.engine.scheduler import Scheduler
from llamaserve.llama import control_vectors
from llamaserve.llama.buildinfo import build_info
from llamaserve.llama.builtin_templates import builtin_template_names, render_builtin
from llamaserve.llama.context import Context, ContextSettings, cpu_flash_attention_tile
from llamaserve.llama.devices import DeviceError, list_devices_text, pick_projector_device
from llamaserve.llama.embed import Embedder
from llamaserve.llama.load_params import LoadSettingsError
from llamaserve.llama.logs import route_llama_logs
from llamaserve.llama.lora import LoraError, load_adapters
from llamaserve.llama.media import MediaPrompter, MediaStore
from llamaserve.llama.memory import malloc_trim
from llamaserve.llama.model import LLAMA_CPP_VERSION, Model, gpu_offload_supported
from llamaserve.llama.progress import set_load_progress
from llamaserve.llama.runner import LlamaRunner
from llamaserve.llama.threads import ThreadPools, set_process_priority
from llamaserve.model_load import ModelLoad
from llamaserve.serving.lora import from_config as lora_from_config
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.serving.state import ServerState
from llamaserve.serving.structured import server_default_grammar
from llamaserve.serving.template_kwargs import server_template_kwargs
from llamaserve.spec_setup import build_speculator, pool_spec

log = logging.getLogger("llamaserve")

# Sequences per embedding decode. A non-causal encoder attends across the whole
# micro-batch (masked), so packing too many inputs wastes attention work: 16
# measured ~1.0-1.1x the C++ server on MiniLM where 64 gave ~0.85x.
EMBED_SEQUENCES = 16
# llama-server's `b<build>-<commit>` of the llama.cpp we run: /props' build_info, system_fingerprint.
BUILD_INFO = build_tag(LLAMA_CPP_VERSION)
VERSION = f"llamaserve-0.1.0 (llama-cpp-python {LLAMA_CPP_VERSION}, llama.cpp {BUILD_INFO})"


def _template_source(config: ServerConfig, model: Model) -> str:
    if config.chat_template_file:
        with open(config.chat_template_file, encoding="utf-8") as fh:
            return fh.read()
    if config.chat_template:
        # Our ChatML (Jinja) or inline Jinja; the other built-in names go to _chat_template.
        return CHATML_TEMPLATE if config.chat_template.strip() == "chatml" else config.chat_template
    return model.chat_template() or CHATML_TEMPLATE


def _builtin_name(config: ServerConfig) -> str | None:
    """The llama.cpp built-in that ``--chat-template`` names, matched exactly as llama.cpp does.

    ``chatml`` stays ours: the Jinja ChatML renders the same prompt for plain messages and, being
    Jinja, keeps the generic tool-call format working (llama.cpp's built-ins refuse tools).
    """
    name = config.chat_template
    if config.chat_template_file or not name or name.strip() == "chatml":
        return None
    return name if name in builtin_template_names() else None


def media_marker() -> str:
    """The text that stands for one media item in prompts: random per process, as llama-server
    makes it (so user text cannot forge one), unless LLAMA_MEDIA_MARKER pins it."""
    return os.environ.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_hex(8)}__>"


def _media(config: ServerConfig, model: Model, undo: ExitStack) -> MediaPrompter | None:
    """The multimodal projector (-mm), loaded beside the text model."""
    if not config.mmproj:
        return None
    if config.reranking:
        log.warning("--mmproj is ignored with --rerank: documents are text")
        return None
    from llamaserve.llama.mtmd import Projector, ProjectorLoadError, ProjectorSettings  # libmtmd: only with -mm

    device = None
    if config.mmproj_device is not None:
        try:
            device = pick_projector_device(config.mmproj_device)
        except DeviceError as exc:
            raise ConfigError(str(exc)) from exc
    settings = ProjectorSettings(
        # -mmdev none keeps the projector on the CPU, as --no-mmproj-offload does.
        use_gpu=config.mmproj_offload and not (config.mmproj_device is not None and device is None),
        device=device.handle if device is not None else 0,
        batch_max_tokens=config.mtmd_batch_max_tokens,
        video_fps=config.video_fps,
        video_timestamp_interval_ms=config.video_timestamp_interval_ms,
        video_ffmpeg_dir=config.video_ffmpeg_dir or "",
        n_threads=config.effective_threads,
        flash_attn=config.flash_attn,
        image_min_tokens=config.image_min_tokens,
        image_max_tokens=config.image_max_tokens,
        warmup=config.tuning.warmup,
        marker=media_marker(),
    )
    try:
        projector = Projector(config.mmproj, model, settings)
    except ProjectorLoadError as exc:
        raise ConfigError(str(exc)) from exc
    undo.callback(projector.close)
    if projector.mrope and (config.context_shift or config.cache_reuse):
        # llama-server turns both off for every projector; here only M-RoPE's positions (an
        # image takes fewer positions than tokens) cannot be shifted. The runner says so.
        log.warning("--context-shift and --cache-reuse are not supported with an M-RoPE projector; disabled")
    kinds = [
        k for k, on in (("vision", projector.vision), ("audio", projector.audio), ("video", projector.video)) if on
    ]
    log.info("multimodal projector loaded: %s (%s)", config.mmproj, ", ".join(kinds))
    return MediaPrompter(projector, MediaStore())


def _legacy_template(config: ServerConfig, model: Model, marker: str | None) -> tuple[PromptTemplate, str]:
    """--no-jinja: llama-server's non-Jinja path. llama.cpp's built-in formats render the chat;
    `llama_chat_apply_template` picks the format from the template it is handed (a built-in's
    name, or a template's text, recognised by its markers): --chat-template-file's text, else
    --chat-template, else the model's own template, else ChatML. A template llama.cpp has no
    format for is refused here: llama-server refuses such a --chat-template(-file) at start too,
    and with the model's own template starts and fails every chat request instead."""
    if config.chat_template_file:
        with open(config.chat_template_file, encoding="utf-8") as fh:
            source = fh.read()
    else:
        source = config.chat_template or model.chat_template() or "chatml"
    refusal = "tools param requires --jinja flag (this server runs with --no-jinja: llama.cpp's built-in templates)"
    template = BuiltinTemplate(source, render_builtin, media_marker=marker, tools_refusal=refusal)
    try:
        template.render([{"role": "user", "content": "test"}])
    except TemplateError:
        raise ConfigError(
            "--no-jinja: none of llama.cpp's built-in chat templates matches this chat template "
            "(only commonly used templates are supported without Jinja); drop --no-jinja, "
            "or name a built-in with --chat-template"
        ) from None
    return template, source


def _chat_template(config: ServerConfig, model: Model, marker: str | None = None) -> tuple[PromptTemplate, str]:
    """The runtime's template and what /props shows for it (a built-in's name, as llama-server)."""
    if not config.jinja:
        return _legacy_template(config, model, marker)
    name = _builtin_name(config)
    if name is not None:
        return BuiltinTemplate(name, render_builtin), name
    source = _template_source(config, model)
    bos = model.token_text(model.bos) if model.bos >= 0 else ""
    eos = model.token_text(model.eos) if model.eos >= 0 else ""
    try:
        return ChatTemplate(source, bos_token=bos, eos_token=eos, media_marker=marker), source
    except TemplateError as exc:
        raise ConfigError(f"the chat template does not compile: {exc}") from exc


def _json_object(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object")
    return value


def _ui_settings(config: ServerConfig) -> dict[str, Any]:
    """Web UI defaults: the file's settings, then --webui-config on top."""
    settings: dict[str, Any] = {}
    if config.webui_config_file:
        try:
            with open(config.webui_config_file, encoding="utf-8") as fh:
                settings.update(_json_object(fh.read(), "--webui-config-file"))
        except OSError as exc:
            raise ConfigError(f"--webui-config-file: {exc}") from exc
    if config.webui_config:
        settings.update(_json_object(config.webui_config, "--webui-config"))
    return settings


def cache_policy(config: ServerConfig, prefill_tile_rows: int = 0) -> CachePolicy:
    """The scheduler's KV-cache policy; prefill_tile_rows: `cpu_flash_attention_tile` of the context."""
    ram = config.cache_ram_mib
    idle = config.cache_idle_slots and ram != 0
    if config.cache_idle_slots and ram == 0:
        log.warning("--cache-idle-slots requires --cache-ram, disabling")
    elif idle:
        log.debug("idle slots are saved to the prompt cache when a task starts __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__")
    return CachePolicy(
        cache_reuse=config.cache_reuse,
        context_shift=config.context_shift,
        cache_ram_bytes=ram * 1024 * 1024 if ram > 0 else ram,
        cache_idle_slots=idle,
        kv_unified=config.effective_kv_unified,
        prefix_sharing=config.prefix_sharing,
        prefill_tile_rows=prefill_tile_rows,
    )


def context_tuning(config: ServerConfig) -> dict[str, Any]:
    """The ContextSettings fields that come straight from the flags."""
    t = config.tuning
    freq_scale = 1.0 / t.rope_scale if t.rope_scale > 0 else t.rope_freq_scale
    return {
        "cache_type_k": t.cache_type_k,
        "cache_type_v": t.cache_type_v,
        "rope_scaling": t.rope_scaling,
        "rope_freq_base": t.rope_freq_base,
        "rope_freq_scale": freq_scale,
        "yarn_orig_ctx": t.yarn_orig_ctx,
        "yarn_ext_factor": t.yarn_ext_factor,
        "yarn_attn_factor": t.yarn_attn_factor,
        "yarn_beta_slow": t.yarn_beta_slow,
        "yarn_beta_fast": t.yarn_beta_fast,
        "defrag_thold": t.defrag_thold,
        "offload_kqv": t.kv_offload,
        "op_offload": t.op_offload,
        "swa_full": t.swa_full,
        "perf": t.perf,
    }


def thread_pools(config: ServerConfig, context: Context) -> ThreadPools | None:
    """llama-server's thread pools, made only when a placement flag asks (else llama.cpp's own)."""
    if config.cpu.is_default and config.cpu_batch.is_default:
        return None
    gen = pool_spec(config.cpu, CpuPlacement(), config.effective_threads)
    batch = pool_spec(config.cpu_batch, config.cpu, config.effective_threads_batch)
    set_process_priority(gen.prio)
    log.info(
        "thread pools: %d threads on CPUs %s (poll %d, strict %s); batch %d threads on CPUs %s",
        gen.n_threads,
        sorted(gen.cpus) or "any",
        gen.poll,
        gen.strict,
        batch.n_threads,
        sorted(batch.cpus) or "any",
    )
    return ThreadPools(context.handle, gen, batch)


def control_vector_files(config: ServerConfig) -> list[tuple[str, float]]:
    """`--control-vector A,B` (scale 1) and `--control-vector-scaled A:0.5` as (path, scale)."""
    files = [(path, 1.0) for path in config.load.control_vectors]
    for item in config.load.control_vectors_scaled:
        path, sep, scale = item.rpartition(":")
        try:
            files.append((path, float(scale)))
        except ValueError:
            sep = ""
        if not sep or not path:
            raise ConfigError(f"--control-vector-scaled expects FNAME:SCALE, got '{item}'")
    return files


def apply_control_vectors(config: ServerConfig, context: Context, n_layer: int) -> None:
    files = control_vector_files(config)
    if not files:
        return
    start, end = (-1, -1)
    if config.load.control_vector_layers is not None:
        try:
            start, end = (int(x) for x in config.load.control_vector_layers)
        except ValueError as exc:
            raise ConfigError("--control-vector-layer-range expects two layer numbers") from exc
    # As llama-server: an unset (or non-positive) end of the range means the first or last layer.
    start = start if start > 0 else 1
    end = end if end > 0 else n_layer
    try:
        control_vectors.apply(context, control_vectors.load(files), start, end)
    except control_vectors.ControlVectorError as exc:
        raise ConfigError(str(exc)) from exc
    log.info("control vectors: %d file(s) on layers %d-%d", len(files), start, end)


def _announce_hardware_flags(config: ServerConfig) -> None:
    if config.hardware_flags and not gpu_offload_supported():
        log.warning(
            "no GPU backend in this build of llama.cpp: %s validated but have no effect",
            ", ".join(dict.fromkeys(config.hardware_flags)),
        )


def _announce_unused_tuning(config: ServerConfig) -> None:
    """--ctx-checkpoints / --checkpoint-min-step: validated, but we keep no context checkpoints.

    llama-server saves them for models whose KV cannot be cut back (recurrent, SWA); our
    prompt cache keeps whole KV states instead, so the settings have nothing to act on.
    """
    t, default = config.tuning, ContextTuning()
    given = [
        flag
        for flag, value, base in (
            ("--ctx-checkpoints", t.ctx_checkpoints, default.ctx_checkpoints),
            ("--checkpoint-min-step", t.checkpoint_min_step, default.checkpoint_min_step),
        )
        if value != base
    ]
    if given:
        log.warning("%s: llamaserve keeps no context checkpoints; the setting has no effect", ", ".join(given))


def context_size(config: ServerConfig, n_ctx_train: int) -> int:
    """-c, else n_parallel * --kv-unified-per-slot, else the model's training context."""
    if config.ctx_size:
        return config.ctx_size
    if config.kv_unified_per_slot > 0:
        return config.pool_slots * config.kv_unified_per_slot
    return n_ctx_train


def _announce_slot_cap(config: ServerConfig, n_ctx_seq: int) -> None:
    cap = config.kv_unified_per_slot
    if cap > n_ctx_seq:
        log.warning(
            "--kv-unified-per-slot (%d) exceeds the per-slot pool capacity (%d) - the cap has no effect "
            "(raise the KV pool with -c, or unset -c to size it to n_parallel * kv_unified_per_slot)",
            cap,
            n_ctx_seq,
        )
    elif 0 < cap < n_ctx_seq:
        log.info("capping the per-slot context (%d) to --kv-unified-per-slot (%d)", n_ctx_seq, cap)


def _announce_preserve(config: ServerConfig, template: PromptTemplate) -> None:
    """llama-server's note on --reasoning-preserve against what the template can do."""
    supported = template.caps.supports_preserve_reasoning
    if config.reasoning_preserve and not supported:
        log.warning("chat template does NOT support preserving reasoning, --reasoning-preserve has no effect")
    elif config.reasoning_preserve is None and supported:
        log.info("chat template supports preserving reasoning, consider enabling it via --reasoning-preserve")


def version_text() -> str:
    """`llama-server --version`: ours and what llama.cpp says of its build."""
    info = build_info()
    return f"version: {VERSION}\nllama.cpp: {info.llama_version}\nsystem: {info.system_info}\n"


def devices_text() -> str:
    return list_devices_text()


def load_runtime(config: ServerConfig, load: ModelLoad | None = None) -> ModelRuntime:
    """Load the model and build everything that serves it; the scheduler thread is running on return.

    `load` is the model's load when it began already (at start, before this module was
    imported: `model_load.py`); without one it begins here.
    A step that fails half-way (a template that does not compile, a bad adapter) frees the
    native memory already taken: a reload after sleeping must not leak a model per failure.
    """
    load = load or ModelLoad(config)
    try:
        with ExitStack() as undo:
            return _build_runtime(config, load, undo)
    finally:
        load.done()


def _build_runtime(config: ServerConfig, load: ModelLoad, undo: ExitStack) -> ModelRuntime:
    t0 = load.started
    _announce_hardware_flags(config)
    _announce_unused_tuning(config)
    try:
        model = load.take()
    except LoadSettingsError as exc:
        raise ConfigError(str(exc)) from exc
    undo.callback(model.close)
    info = model.info()
    n_slots = config.effective_parallel
    n_ctx = context_size(config, info.n_ctx_train)
    embedding_only = config.embedding or config.reranking
    settings = ContextSettings(
        n_ctx=n_ctx,
        n_batch=config.batch_size,
        n_ubatch=config.ubatch_size,
        # Embedding requests pack several inputs into one decode, one sequence each.
        n_seq_max=max(n_slots, EMBED_SEQUENCES) if embedding_only else n_slots,
        n_threads=config.effective_threads,
        n_threads_batch=config.effective_threads_batch,
        kv_unified=True if embedding_only else config.effective_kv_unified,
        embeddings=config.embedding or config.reranking,
        pooling="rank" if config.reranking else config.pooling,
        flash_attn=config.flash_attn,
        **context_tuning(config),
    )
    context = Context(model, settings)
    undo.callback(context.close)
    pools = thread_pools(config, context)
    if pools is not None:
        undo.callback(pools.close)
    apply_control_vectors(config, context, model.n_layer)
    try:
        adapters = load_adapters(model, [path for path, _ in config.lora])
    except LoraError as exc:
        raise ConfigError(str(exc)) from exc
    for adapter in adapters:
        undo.callback(adapter.close)
    media = _media(config, model, undo)
    tile_rows = cpu_flash_attention_tile(settings, gpu_offload_supported())
    runner = LlamaRunner(
        model,
        context,
        adapters,
        special=config.special,
        media=media.store if media else None,
        mrope=bool(media and media.projector.mrope),
        attention_tile_rows=tile_rows,
    )
    _announce_slot_cap(config, context.n_ctx_seq)
    scheduler = Scheduler(
        runner,
        n_slots,
        slot_prompt_similarity=config.slot_prompt_similarity,
        cache=cache_policy(config, tile_rows),
        n_ctx_slot=config.kv_unified_per_slot,
        cont_batching=config.tuning.cont_batching,
        show_special=config.special,
        queue_limits=QueueLimits(config.max_queue, config.max_queue_tokens),
        max_itl_ms=config.max_itl_ms,
        speculator=None if embedding_only else build_speculator(config, model, settings, load.settings, undo),
    )
    grammar = server_default_grammar(model, config.default_grammar, config.default_json_schema)
    if grammar is not None:
        # Requests start from config.sampling, so the default reaches every one that names no grammar.
        config = replace(config, sampling=replace(config.sampling, grammar=grammar))
    if not settings.embeddings and config.tuning.warmup:
        # One thread unless placement flags attached pools of their own, which set the thread counts.
        context.warm_up(model.bos if model.bos >= 0 else 0, one_thread=pools is None)
    slot_files = None
    if config.slot_save_path:
        slot_files = SlotFiles(
            scheduler,
            config.slot_save_path,
            {
                "file": os.path.basename(config.model),
                "size": os.path.getsize(config.model),
                "n_ctx_seq": context.n_ctx_seq,
                "n_slots": n_slots,
            },
        )
        if config.cache_persist:
            slot_files.load_all()  # before the scheduler thread starts: nothing else touches the KV yet
    template, source = _chat_template(config, model, media.marker if media else None)
    _announce_preserve(config, template)
    kwargs: dict[str, Any] = {}
    if config.chat_template_kwargs:
        kwargs = _json_object(config.chat_template_kwargs, "--chat-template-kwargs")
    kwargs = server_template_kwargs(config, kwargs)
    ui_settings = _ui_settings(config)
    scheduler.start()
    log.info(
        "model loaded in %.2f s: %s, %d slots x %d tokens of context",
        time.perf_counter() - t0,
        info.description,
        n_slots,
        scheduler.n_ctx_slot,
    )
    # Loaded: the runtime owns the native objects now, freed in reverse order (adapters,
    # context, model) when it closes.
    release = undo.pop_all().close
    return ModelRuntime(
        config=config,
        model=model,
        n_ctx_slot=scheduler.n_ctx_slot,
        engine=_engine_client(config, scheduler, model, slot_files),
        template=template,
        template_source=source,
        info=info,
        chat_template_kwargs=kwargs,
        ui_settings=ui_settings,
        embedder=(
            Embedder(context, media.store if media else None, mrope=bool(media and media.projector.mrope))
            if settings.embeddings
            else None
        ),
        media=media,
        lora=lora_from_config(config.lora, config.lora_init_without_apply),
        release=release,
        build_info=BUILD_INFO,
    )


def _engine_client(
    config: ServerConfig, scheduler: Scheduler, model: Vocabulary, slot_files: SlotFiles | None
) -> EngineClient:
    """The engine's front, all the routes see of it; with --log-prompts-dir, one that writes each prompt down."""
    persist = config.cache_persist  # the slots are written when the front stops (shutdown, sleep)
    if config.log_prompts_dir is None:
        return EngineClient(scheduler, slot_files=slot_files, persist_slots=persist)
    try:  # created up front, as llama-server does when it parses the flag
        os.makedirs(config.log_prompts_dir, exist_ok=True)
    except OSError as exc:
        log.warning("failed to create --log-prompts-dir '%s': %s", config.log_prompts_dir, exc)
    return PromptLoggingClient(scheduler, model, config.log_prompts_dir, slot_files=slot_files, persist_slots=persist)


def serve(config: ServerConfig, load: ModelLoad | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; the process exit code. `load`: the model's load, begun
    before this module was imported (cli); the first runtime is built on it, a reload after
    sleeping loads anew."""

    def loader(config: ServerConfig) -> ModelRuntime:
        return load_runtime(config, load if load is not None and load.pending else None)

    state = ServerState(config, loader=loader, trim_memory=malloc_trim)
    hooks = server.NativeHooks(route_logs=route_llama_logs, set_load_progress=set_load_progress)
    return server.serve(state, hooks)
