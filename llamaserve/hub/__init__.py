"""Model sources other than a local path: `-hf` repos, `--model-url` and `-dr` Docker models.

`resolve_model(config, environ)` turns the first two into a local GGUF path
before the server starts, `resolve_docker(spec, ...)` the third;
`list_cached_models` / `format_cache_list` are `--cache-list`. Every failure is
a `DownloadError` with a message for stderr.
"""

from llamaserve.hub.cache_list import format_cache_list, list_cached_models
from llamaserve.hub.docker import resolve_docker
from llamaserve.hub.errors import DownloadError
from llamaserve.hub.resolve import resolve_model

__all__ = ["DownloadError", "format_cache_list", "list_cached_models", "resolve_docker", "resolve_model"]
