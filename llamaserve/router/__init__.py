"""Router mode: many models behind one address, each in a child process of our own server.

Started when no model is named (`cli` decides). `catalog.py` lists the models (download
cache, `--models-dir`, `--models-preset`), `preset.py` reads INI presets and renders a
model's flags, `child.py` runs one model's process, `registry.py` keeps their states, the
load queue and eviction, `proxy.py` forwards a request to a base URL and streams the
answer back, `metrics.py` merges the children's `/metrics`, and `app.py` is the HTTP side.
The router never loads llama.cpp: a model's crash cannot take it down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamaserve.config import ServerConfig


def serve_router(config: ServerConfig, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from llamaserve.router.server import serve

    return serve(config, argv, environ)
