"""Model sources other than a local path: `-hf` repos and `--model-url` downloads.

`resolve_model(config, environ)` turns them into a local GGUF path before the
server starts; `fetch_model(ModelSource(...), environ)` does the same from plain
values (`llama download`). Every failure is a `DownloadError` with a message for stderr.
"""

from llamaserve.hub.errors import DownloadError
from llamaserve.hub.resolve import ModelSource, fetch_model, resolve_model

__all__ = ["DownloadError", "ModelSource", "fetch_model", "resolve_model"]
