"""The browser chat UI: static files under ``static/`` (no build step), served at ``/``.

Mount it after the API routes, so that they win over any file name::

    from llamaserve.webui import static_files
    app.mount("/", static_files(), name="webui")

The page talks to the same origin: ``GET /props``, ``GET /v1/models``, ``POST /v1/chat/completions``
(streaming), with ``Authorization: Bearer`` once the user gave a key after a 401. Its files must
stay reachable without a key. Bundled libraries and their versions: ``VENDORED.md``.
"""

from __future__ import annotations

import mimetypes
import os
from pathlib import Path
from typing import Any

STATIC_DIR = Path(__file__).resolve().parent / "static"

# Module scripts are refused unless served with a JavaScript type, and some systems' MIME tables
# map .js to text/plain: set the types the page needs explicitly.
for _ext, _type in (
    (".js", "text/javascript"),
    (".mjs", "text/javascript"),
    (".css", "text/css"),
    (".svg", "image/svg+xml"),
    (".woff2", "font/woff2"),
    (".json", "application/json"),
):
    mimetypes.add_type(_type, _ext)

# What the page needs and nothing more: its own scripts, styles and fonts; inline style attributes
# (KaTeX positions glyphs with them); fetch to the same origin; attached images and audio shown
# from their data: URLs.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "media-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)


def headers_for(path: str) -> dict[str, str]:
    """Response headers for one static file. The names carry no version, so every file is
    revalidated (``no-cache`` + the ETag/Last-Modified that StaticFiles sends: a 304 when unchanged)."""
    h = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    if path.endswith(".html"):
        h["Content-Security-Policy"] = CSP
        h["Referrer-Policy"] = "no-referrer"
    return h


def static_files() -> Any:
    """A Starlette ``StaticFiles`` app for ``STATIC_DIR`` (``/`` serves ``index.html``)."""
    from starlette.staticfiles import StaticFiles

    class UIStaticFiles(StaticFiles):
        def file_response(
            self, full_path: str | os.PathLike[str], stat_result: os.stat_result, scope: Any, status_code: int = 200
        ) -> Any:
            response = super().file_response(full_path, stat_result, scope, status_code)
            response.headers.update(headers_for(str(full_path)))
            return response

    return UIStaticFiles(directory=STATIC_DIR, html=True)
