"""Model sources other than a local path: `-hf` repos, `--model-url` and `-dr` Docker models.

`resolve_model(config, environ)` turns them into a local GGUF path before the server
starts; `fetch_model(ModelSource(...), environ)` does the same from plain values
(`llama download`); `list_cached_models` / `format_cache_list` are `--cache-list`.
Every failure is a `DownloadError` with a message for stderr.

The names below load their module on first use (PEP 562): a server started without `-hf`
reads only the download cache's listing (`cache`, `cache_list`, `hub_layout`) and never
imports httpx, which the download modules need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llamaserve.hub.cache_list import format_cache_list, list_cached_models
    from llamaserve.hub.docker import resolve_docker
    from llamaserve.hub.errors import DownloadError
    from llamaserve.hub.mmproj import resolve_mmproj
    from llamaserve.hub.resolve import ModelSource, fetch_model, resolve_draft_model, resolve_model

_HOME = {
    "DownloadError": "errors",
    "ModelSource": "resolve",
    "fetch_model": "resolve",
    "format_cache_list": "cache_list",
    "list_cached_models": "cache_list",
    "resolve_docker": "docker",
    "resolve_draft_model": "resolve",
    "resolve_mmproj": "mmproj",
    "resolve_model": "resolve",
}

__all__ = [
    "DownloadError",
    "ModelSource",
    "fetch_model",
    "format_cache_list",
    "list_cached_models",
    "resolve_docker",
    "resolve_draft_model",
    "resolve_mmproj",
    "resolve_model",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
