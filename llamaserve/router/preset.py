"""Model presets: INI sections of flags, and a model's flags rendered as a child's argv.

A key is a flag without its dashes (`ctx-size`, `c`, `no-mmap`) or its environment
variable (`LLAMA_ARG_CACHE_RAM`), as in llama-server's presets; `load-on-startup`,
`stop-timeout` and `dedup-cache-models` belong to the router itself. A `[*]` section
applies to every model, a model's own section over it. Settings are kept per flag, so a
later source replaces an earlier one's value of the same flag.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llamaserve.cli.options import BY_SPELLING, OPTIONS, Opt
from llamaserve.config import ConfigError

ROUTER_KEYS = ("load-on-startup", "stop-timeout", "dedup-cache-models")
_BY_ENV = {opt.env: opt for opt in OPTIONS if opt.env}
_TRUE = {"1", "true", "on", "yes", "enabled"}
_FALSE = {"0", "false", "off", "no", "disabled"}

# Flags the router decides for each child (address, name, where the weights are) or keeps
# to itself (keys, TLS, the router's own settings): never passed down from the router's
# command line. A preset may still name the weights (`model`, `hf-repo`).
ROUTER_ONLY_DESTS = frozenset(
    {
        "host",
        "port",
        "reuse_port",
        "api_key",
        "api_key_file",
        "api_keys_config",
        "usage_db",
        "ssl_key_file",
        "ssl_cert_file",
        "models_dir",
        "models_preset",
        "models_max",
        "models_autoload",
        "models_memory_max",
        "log_file",
        "api_prefix",
        # The agent tools and the MCP proxy are the router's own (it answers /tools itself).
        "tools",
        "agent",
        "ui_mcp_proxy",
        "tools_runtime",
        "tools_runtime_header",
        "mcp_servers_config",
        "mcp_servers_json",
    }
)
MODEL_DESTS = frozenset({"model", "hf_repo", "hf_file", "model_url", "docker_repo", "alias", "tags"})


def truthy(text: str) -> bool:
    return text.strip().lower() in _TRUE


@dataclass(frozen=True)
class Setting:
    opt: Opt
    value: str | bool  # bool for switches, the text otherwise

    def argv(self) -> list[str]:
        opt = self.opt
        if opt.kind in ("flag", "preset"):
            return [opt.names[0]] if self.value else []
        if opt.kind == "pair":
            if self.value:
                return [opt.names[0]]
            return [opt.neg[0]] if opt.neg else []
        text = str(self.value)
        if opt.kind == "two":
            return [opt.names[0], *text.split(None, 1)]
        return [opt.names[0], text]


@dataclass
class Preset:
    """One model's settings: flags by their first spelling, plus the router's own keys."""

    settings: dict[str, Setting] = field(default_factory=dict)
    router: dict[str, str] = field(default_factory=dict)

    def over(self, base: Preset) -> Preset:
        """This preset's settings over `base`'s."""
        return Preset({**base.settings, **self.settings}, {**base.router, **self.router})

    def get(self, spelling: str) -> str | None:
        """The value of the flag `spelling` names (any of its spellings), None when not set."""
        setting = self.settings.get(BY_SPELLING[spelling][0].names[0])
        return None if setting is None else str(setting.value)

    def set(self, spelling: str, value: str | bool) -> None:
        opt, _ = BY_SPELLING[spelling]
        self.settings[opt.names[0]] = Setting(opt, value)

    def drop(self, spelling: str) -> None:
        self.settings.pop(BY_SPELLING[spelling][0].names[0], None)

    def argv(self, skip_dests: Iterable[str] = ()) -> list[str]:
        skipped = set(skip_dests)
        out: list[str] = []
        for setting in self.settings.values():
            if setting.opt.dest not in skipped:
                out += setting.argv()
        return out

    def ini_text(self, name: str) -> str:
        """The section as llama-server's /models shows a preset (the router's own keys too)."""
        lines = [f"[{name}]"]
        for setting in self.settings.values():
            if setting.opt.dest in ROUTER_ONLY_DESTS or setting.opt.dest in ("alias", "tags"):
                continue
            key = setting.opt.names[-1].lstrip("-")
            value = setting.value
            lines.append(f"{key} = {('true' if value else 'false') if isinstance(value, bool) else value}")
        lines += [f"{k} = {v}" for k, v in self.router.items()]
        return "\n".join(lines) + "\n"


def _opt_for(key: str) -> tuple[Opt, bool] | None:
    if key in _BY_ENV:
        return _BY_ENV[key], True
    for spelling in (f"--{key}", f"-{key}"):
        found = BY_SPELLING.get(spelling)
        if found is not None:
            return found
    return None


def add_setting(preset: Preset, key: str, value: str, where: str) -> None:
    if key in ROUTER_KEYS:
        preset.router[key] = value
        return
    found = _opt_for(key)
    if found is None:
        raise ConfigError(f"{where}: unknown preset key '{key}'")
    opt, positive = found
    if opt.kind == "action":
        raise ConfigError(f"{where}: '{key}' is not a setting")
    if opt.kind in ("flag", "pair", "preset"):
        low = value.strip().lower()
        if low not in _TRUE and low not in _FALSE and low != "":
            raise ConfigError(f"{where}: '{key}' takes true or false, got '{value}'")
        on = True if low == "" else low in _TRUE
        preset.settings[opt.names[0]] = Setting(opt, on if positive else not on)
        return
    try:
        opt.type(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: '{key}': {exc}") from exc
    preset.settings[opt.names[0]] = Setting(opt, value)


def parse_ini(text: str, path: str) -> tuple[Preset, dict[str, Preset]]:
    """(the `[*]` section, the model sections by name); keys before any section are ignored
    (llama-server's `version = 1`)."""
    glob = Preset()
    sections: dict[str, Preset] = {}
    current: Preset | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith((";", "#")):
            continue
        where = f"{path}:{number}"
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise ConfigError(f"{where}: bad section header {line!r}")
            name = line[1:-1].strip()
            current = glob if name == "*" else sections.setdefault(name, Preset())
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{where}: expected KEY = VALUE, got {line!r}")
        if current is None:
            continue
        add_setting(current, key.strip(), value.strip(), where)
    return glob, sections


def read_ini(path: str) -> tuple[Preset, dict[str, Preset]]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"--models-preset: cannot read {path}: {exc.strerror}") from exc
    return parse_ini(text, path)


def from_argv(argv: Sequence[str]) -> Preset:
    """The router's own command line as a preset, its router-only and model flags left out."""
    out = Preset()
    i = 0
    while i < len(argv):
        arg = argv[i]
        spelling = arg.replace("_", "-") if arg.startswith("--") else arg
        attached: str | None = None
        if spelling not in BY_SPELLING and spelling.startswith("--") and "=" in spelling:
            spelling, attached = spelling.split("=", 1)
        found = BY_SPELLING.get(spelling)
        i += 1
        if found is None:
            continue  # the parse already refused anything unknown
        opt, positive = found
        if opt.kind in ("value", "list", "two"):
            needed = 2 if opt.kind == "two" else 1
            words = [attached] if attached is not None else []
            while len(words) < needed and i < len(argv):
                words.append(argv[i])
                i += 1
            value: str | bool = " ".join(words)
        elif opt.kind == "pair":
            value = positive
        else:
            value = True
        if opt.kind == "action" or opt.dest in ROUTER_ONLY_DESTS or opt.dest in MODEL_DESTS:
            continue
        key = opt.names[0]
        if opt.kind == "list" and key in out.settings:
            key = f"{key}#{i}"  # several -r/--lora: each kept, under its own key
        out.settings[key] = Setting(opt, value)
    return out
