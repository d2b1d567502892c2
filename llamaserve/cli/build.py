"""What was read from the command line and the environment → a validated ServerConfig."""

from __future__ import annotations

import codecs
from dataclasses import fields, replace
from typing import Any

from llamaserve.cli.argv import Parsed, hardware_flags
from llamaserve.config import ConfigError, ServerConfig, embedded_default_model
from llamaserve.engine.sampling import (
    DEFAULT_SAMPLERS,
    SAMPLER_ALIASES,
    SAMPLER_LETTERS,
    SCALAR_KNOBS,
    SamplingParams,
)
from llamaserve.quota.policy import load_keys_config

# Destinations that only mark a flag as given (features not built yet) and set no config field.
_MARKERS = frozenset({"removed"})
_PARTS = {
    f.name
    for f in fields(ServerConfig)
    if f.name in ("load", "tuning", "cpu", "cpu_batch", "draft_cpu", "draft_cpu_batch", "spec")
}


def parse_samplers(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.replace(",", ";").split(";") if n.strip()]
    out: list[str] = []
    for name in names:
        canonical = SAMPLER_ALIASES.get(name.lower())
        if canonical is None:
            raise ConfigError(f"unknown sampler '{name}' (known: {', '.join(DEFAULT_SAMPLERS)}, infill, adaptive_p)")
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


def parse_logit_bias(items: list[str]) -> tuple[tuple[int, float], ...]:
    """`-l 15043+1`, `-l 15043-inf`: TOKEN_ID, a sign, then the size of the bias."""
    out: list[tuple[int, float]] = []
    for item in items:
        text = item.strip()
        digits = len(text) - len(text.lstrip("0123456789"))
        sign, rest = text[digits : digits + 1], text[digits + 1 :]
        try:
            if not digits or sign not in ("+", "-"):
                raise ValueError
            bias = float(rest)
        except ValueError:
            raise ConfigError(
                f"--logit-bias: invalid input format '{item}' (expected TOKEN_ID+BIAS or TOKEN_ID-BIAS)"
            ) from None
        out.append((int(text[:digits]), -bias if sign == "-" else bias))
    return tuple(out)


def unescape(text: str) -> str:
    r"""llama-server's `-e`: \n, \t, \r, \', \", \\ and \xHH in flag values become the characters."""
    try:
        return codecs.decode(text.encode("latin-1", "backslashreplace"), "unicode_escape")
    except UnicodeDecodeError:
        return text


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _read_file(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read {path}: {exc.strerror}") from exc


def _api_keys(values: dict[str, Any]) -> tuple[str, ...]:
    keys: list[str] = []
    if "api_key" in values:
        keys += list(_csv(values.pop("api_key")))
    if "api_key_file" in values:
        text = _read_file(values.pop("api_key_file"), "--api-key-file")
        keys += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if values.get("api_keys_config"):
        # Read here too so a bad file stops the start with its message; the app reads it again.
        keys += load_keys_config(values["api_keys_config"]).secrets
    return tuple(keys)


def _sampling(values: dict[str, Any], escape: bool) -> SamplingParams:
    knobs: dict[str, Any] = {k: values.pop(k) for k in list(values) if k in SCALAR_KNOBS}
    if "samplers" in values:
        knobs["samplers"] = parse_samplers(values.pop("samplers"))
    if "sampler_seq" in values:
        knobs["samplers"] = parse_sampler_seq(values.pop("sampler_seq"))
    if "logit_bias" in values:
        knobs["logit_bias"] = parse_logit_bias(values.pop("logit_bias"))
    if "dry_breakers" in values:
        breakers = values.pop("dry_breakers")
        # "none" anywhere clears the list, as in llama-server.
        kept = [] if "none" in breakers else breakers
        knobs["dry_sequence_breakers"] = tuple(unescape(b) if escape else b for b in kept)
    return replace(SamplingParams(), **knobs)


def _nest(values: dict[str, Any]) -> dict[str, Any]:
    """`load.split_mode`-style keys become fields of the config's parts."""
    parts: dict[str, dict[str, Any]] = {}
    for key in [k for k in values if "." in k]:
        part, name = key.split(".", 1)
        parts.setdefault(part, {})[name] = values.pop(key)
    defaults = ServerConfig()
    for part, settings in parts.items():
        if part not in _PARTS:
            raise AssertionError(f"flag destination in an unknown part: {part}")
        for name in (
            "override_tensor",
            "draft_override_tensor",
            "override_kv",
            "control_vectors",
            "control_vectors_scaled",
        ):
            if name in settings:
                settings[name] = tuple(item for value in settings[name] for item in _csv(value))
        base = getattr(defaults, part)
        # One level deeper: `spec.ngram_simple.size_n` sets a field of the part's own part.
        inner: dict[str, dict[str, Any]] = {}
        for key in [k for k in settings if "." in k]:
            sub, name = key.split(".", 1)
            inner.setdefault(sub, {})[name] = settings.pop(key)
        for sub, sub_settings in inner.items():
            settings[sub] = replace(getattr(base, sub), **sub_settings)
        values[part] = replace(base, **settings)
    return values


def _leading_slash(route: str) -> str:
    return route if not route or route.startswith("/") else "/" + route


def _vertex_ai(environ: dict[str, str]) -> dict[str, Any]:
    """Vertex AI's custom-container variables, read as llama-server reads them: with
    AIP_MODE=PREDICTION the server listens on AIP_HTTP_PORT (default 8080, over --port),
    answers AIP_PREDICT_ROUTE (default /predict) and AIP_HEALTH_ROUTE beside /health."""
    if environ.get("AIP_MODE") != "PREDICTION":
        return {}
    port = environ.get("AIP_HTTP_PORT") or "8080"
    if not port.isdigit():
        raise ConfigError(f"AIP_HTTP_PORT: not a port number: {port!r}")
    return {
        "port": int(port),
        "gcp_predict_route": _leading_slash(environ.get("AIP_PREDICT_ROUTE") or "/predict"),
        "gcp_health_route": _leading_slash(environ.get("AIP_HEALTH_ROUTE") or ""),
    }


def _agent(parsed: Parsed, values: dict[str, Any], environ: dict[str, str]) -> None:
    """--tools, -ag/--agent and the CORS default they bring, as llama-server reads them.

    `--agent` is `--tools all --ui-mcp-proxy` (`--no-agent` clears both); like llama-server the
    flags apply in the order given, so the later of `--tools` and `--agent` wins. With built-in
    tools, MCP servers or the proxy on, `--cors-origins` defaults to `localhost` (an explicit one
    wins), as llama-server: that only keeps other sites' pages from reading the answers. What
    keeps them from running a tool is api/site_guard.py, which refuses their requests."""
    agent = values.pop("agent", None)
    if agent is not None:
        order = [g.opt.dest for g in parsed.given if g.opt.dest in ("tools", "agent", "ui_mcp_proxy")]
        last_tools = max((i for i, d in enumerate(order) if d == "tools"), default=-1)
        last_proxy = max((i for i, d in enumerate(order) if d == "ui_mcp_proxy"), default=-1)
        at = max(i for i, d in enumerate(order) if d == "agent")
        if at > last_tools:
            values["tools"] = "all" if agent else ""
        if at > last_proxy:
            values["ui_mcp_proxy"] = bool(agent)
    if "tools" in values:
        values["tools"] = _csv(values["tools"])
    if "tools_runtime" in values and values["tools_runtime"] in ("", "none"):
        values.pop("tools_runtime")
    for name in ("mcp_servers_config", "mcp_servers_json"):
        if not values.get(name):
            values.pop(name, None)
    root = environ.get("LLAMASERVE_TOOLS_ROOT")
    if root:
        values["tools_root"] = root
    on = values.get("tools") or values.get("mcp_servers_config") or values.get("mcp_servers_json")
    if (on or values.get("ui_mcp_proxy")) and "cors_origins" not in values:
        values["cors_origins"] = "localhost"


def _router_wanted(values: dict[str, Any], environ: dict[str, str]) -> bool:
    """No model named: a router when it has models to serve (a models folder, a preset, or
    models in the download cache), as llama-server; with none of them, the embedded model."""
    if values.get("models_dir") or values.get("models_preset"):
        return True
    from llamaserve.hub.cache import cache_dir  # deferred: the hub's modules only when no model is named
    from llamaserve.hub.cache_list import list_cached_models
    from llamaserve.hub.hub_layout import list_hub_models

    cache = cache_dir(environ)
    return bool(list_hub_models(cache) or list_cached_models(cache))


def build_config(parsed: Parsed, environ: dict[str, str]) -> ServerConfig:
    values = {k: v for k, v in parsed.values.items() if k not in _MARKERS}
    _agent(parsed, values, environ)
    escape = bool(values.get("escape", True))
    sampling = _sampling(values, escape)
    keys = _api_keys(values)
    if "load.rpc_servers" in values:
        values["load.rpc_servers"] = _csv(values["load.rpc_servers"])
    if "upstreams" in values:
        values["upstreams"] = tuple(u.rstrip("/") for u in _csv(values["upstreams"]))
    for name in ("cors_origins", "cors_methods", "cors_headers", "alias", "tags", "allowed_hosts"):
        if name in values:
            values[name] = _csv(values[name])
    if "alias" in values:
        # llama-server keeps the aliases in a std::set: sorted, each once, and the first names
        # the model (the "id" of /v1/models and the "model" of every answer).
        values["alias"] = tuple(sorted(set(values["alias"])))
    if "reverse_prompts" in values:
        values["reverse_prompts"] = tuple(unescape(p) if escape else p for p in values["reverse_prompts"])
    if "log_file" not in values and environ.get("LLAMA_LOG_FILE"):
        values["log_file"] = environ["LLAMA_LOG_FILE"]
    loras = parse_loras(values.pop("lora_plain", None), values.pop("lora_scaled", None))
    if loras:
        values["lora"] = loras
    if "default_grammar_file" in values:
        values["default_grammar"] = _read_file(values.pop("default_grammar_file"), "--grammar-file")
    if "default_json_schema_file" in values:
        values["default_json_schema"] = _read_file(values.pop("default_json_schema_file"), "--json-schema-file")
    no_model = not (values.get("hf_repo") or values.get("model_url") or values.get("docker_repo"))
    if "model" not in values and no_model and not values.get("upstreams"):
        default = embedded_default_model()
        if default is None or _router_wanted(values, environ):
            values["router"] = True
        else:
            values["model"] = default
    if values.get("verbose"):
        values["log_verbosity"] = 99
    values.update(_vertex_ai(environ))
    remote_media = environ.get("LLAMASERVE_REMOTE_MEDIA", "")
    values["remote_media"] = remote_media in ("1", "true", "private")
    values["remote_media_private"] = remote_media == "private"
    values = _nest(values)
    config = ServerConfig(**values, api_keys=keys, sampling=sampling, hardware_flags=tuple(hardware_flags(parsed)))
    config.validate()  # every other flag first: a typo should not wait for a download
    if config.hf_repo or config.model_url or config.docker_repo:
        from llamaserve.hub import resolve_model  # deferred: httpx only when downloading

        config = replace(config, model=resolve_model(config, environ))
    if config.mmproj_url or (config.hf_repo and config.mmproj_auto and not config.mmproj):
        from llamaserve.hub import resolve_mmproj  # deferred, as above

        config = replace(config, mmproj=resolve_mmproj(config, environ))
    if config.spec.draft_hf_repo:
        from llamaserve.hub import resolve_draft_model  # deferred, as above

        draft = resolve_draft_model(config, environ)
        config = replace(config, spec=replace(config.spec, draft_model=draft, draft_hf_repo=None, draft_hf_file=None))
    return config
