"""Model sources other than a local path: `-hf` repos and `--model-url` downloads.

`resolve_model(config, environ)` turns them into a local GGUF path before the
server starts; every failure is a `DownloadError` with a message for stderr.
"""

from llamaserve.hub.errors import DownloadError
from llamaserve.hub.resolve import resolve_model

__all__ = ["DownloadError", "resolve_model"]
