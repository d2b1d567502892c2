"""Model sources other than a local path: `-hf` repos, `--model-url` and `-dr` Docker models.

`resolve_model(config, environ)` turns them into a local GGUF path before the server
starts; `fetch_model(ModelSource(...), environ)` does the same from plain values
(`llama download`); `list_cached_models` / `format_cache_list` are `--cache-list`.
Every failure is a `DownloadError` with a message for stderr.
"""

from llamaserve.hub.cache_list import format_cache_list, list_cached_models
from llamaserve.hub.docker import resolve_docker
from llamaserve.hub.errors import DownloadError
from llamaserve.hub.mmproj import resolve_mmproj
from llamaserve.hub.resolve import ModelSource, fetch_model, resolve_draft_model, resolve_model

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
