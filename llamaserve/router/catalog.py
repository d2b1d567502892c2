"""The router's model list: the download cache, `--models-dir` and `--models-preset`.

As in llama-server: cached models are `ORG/NAME:TAG`; a models folder gives one model per
GGUF file (named without `.gguf`) and per sub-folder (its first split or its one model
file); a preset section of the same name as a listed model adds its settings to that
model, any other section is a model of its own and names its weights (`model` or
`hf-repo`). The `[*]` section lies under every model's own settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llamaserve.config import ConfigError, ServerConfig
from llamaserve.hub.cache import cache_dir
from llamaserve.hub.cache_list import list_cached_models
from llamaserve.hub.hub_layout import find_hub_model, list_hub_models
from llamaserve.router.preset import Preset, read_ini, truthy

DEFAULT_STOP_TIMEOUT = 10.0
_SIDE = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")


@dataclass
class ModelSpec:
    name: str
    source: str  # preset | models_dir | cache
    preset: Preset  # the model's own settings over the [*] section
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    load_on_startup: bool = False
    hidden: bool = False
    files: list[str] = field(default_factory=list)  # the weights, when known (memory estimate)

    @property
    def weights_bytes(self) -> int:
        total = 0
        for path in self.files:
            try:
                total += os.path.getsize(path)
            except OSError:
                pass
        return total


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(sorted({p.strip() for p in (text or "").split(",") if p.strip()}))


def _models_dir(folder: str) -> dict[str, Preset]:
    out: dict[str, Preset] = {}
    for entry in sorted(Path(folder).iterdir()):
        if entry.is_dir():
            ggufs = sorted(p for p in entry.iterdir() if p.name.endswith(".gguf") and p.is_file())
            models = [p for p in ggufs if not any(s in p.name for s in _SIDE)]
            first = [p for p in models if "-00001-of-" in p.name]
            if not (first or models):
                continue
            chosen = (first or models)[0]
            preset = Preset()
            preset.set("--model", str(chosen))
            out[entry.name] = preset
        elif entry.name.endswith(".gguf") and not any(s in entry.name for s in _SIDE):
            preset = Preset()
            preset.set("--model", str(entry))
            out[entry.name[: -len(".gguf")]] = preset
    return out


def _resolve_hf(preset: Preset, cache: Path) -> None:
    """A preset's `hf-repo` found in the hub-layout cache becomes its `-m` (children read the
    flat cache themselves, and may download with their own `-hf`)."""
    repo = preset.get("-hf")
    if not repo or preset.get("-m"):
        return
    hit = find_hub_model(cache, repo)
    if hit is not None:
        preset.drop("-hf")
        preset.set("-m", str(hit.path))


def _files(preset: Preset) -> list[str]:
    path = preset.get("-m")
    if not path:
        return []
    folder, name = os.path.split(path)
    if "-00001-of-" in name:
        stem = name.split("-00001-of-")[0]
        return sorted(os.path.join(folder, f) for f in os.listdir(folder or ".") if f.startswith(stem + "-"))
    return [path]


def load_catalog(config: ServerConfig, environ: Mapping[str, str]) -> dict[str, ModelSpec]:
    """Every model the router can serve, by name; ConfigError for a bad preset or clashing names."""
    cache = cache_dir(environ)
    sources: dict[str, tuple[str, Preset]] = {}
    cached_paths: dict[str, str] = {}
    for hub in list_hub_models(cache):
        p = Preset()
        p.set("-m", str(hub.path))
        sources[hub.id] = ("cache", p)
        cached_paths[hub.id] = os.path.abspath(hub.path)
    for model_id in list_cached_models(cache):
        if model_id not in sources:
            p = Preset()
            p.set("-hf", model_id)
            sources[model_id] = ("cache", p)
    if config.models_dir:
        for name, p in _models_dir(config.models_dir).items():
            sources[name] = ("models_dir", p)
    glob = Preset()
    if config.models_preset:
        glob, sections = read_ini(config.models_preset)
        for name, own in sections.items():
            if name in sources:
                sources[name] = ("preset", own.over(sources[name][1]))
            else:
                if not (own.get("-m") or own.get("-hf") or own.get("-mu") or own.get("-dr")):
                    raise ConfigError(f"{config.models_preset}: [{name}] names no model (set model or hf-repo)")
                sources[name] = ("preset", own)
    specs: dict[str, ModelSpec] = {}
    dedup: set[str] = set()
    for name, (source, own) in sources.items():
        preset = own.over(glob)
        _resolve_hf(preset, cache)
        router = preset.router
        try:
            stop_timeout = float(router.get("stop-timeout", DEFAULT_STOP_TIMEOUT))
        except ValueError:
            stop_timeout = DEFAULT_STOP_TIMEOUT
        spec = ModelSpec(
            name=name,
            source=source,
            preset=preset,
            aliases=_csv(preset.get("--alias")),
            tags=_csv(preset.get("--tags")),
            stop_timeout=stop_timeout,
            load_on_startup=truthy(router.get("load-on-startup", "")),
            files=_files(preset),
        )
        specs[name] = spec
        if source == "preset" and truthy(router.get("dedup-cache-models", "")):
            # llama-server hides the cache entries of the weights a preset already serves
            for spelling in ("-m", "--spec-draft-hf"):
                value = preset.get(spelling)
                if value:
                    hit = find_hub_model(cache, value) if spelling != "-m" else None
                    dedup.add(os.path.abspath(str(hit.path)) if hit else os.path.abspath(value))
    for name, path in cached_paths.items():
        if path in dedup and specs[name].source == "cache":
            specs[name].hidden = True
    _check_names(specs)
    return specs


def _check_names(specs: dict[str, ModelSpec]) -> None:
    owner: dict[str, str] = {name: name for name in specs}
    for name, spec in specs.items():
        for alias in spec.aliases:
            if alias in owner and owner[alias] != name:
                raise ConfigError(f"alias '{alias}' for model '{name}' conflicts with model '{owner[alias]}'")
            owner[alias] = name
