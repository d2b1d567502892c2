"""Router mode: many models behind one address, each in a child process of our own server.

Started when no model is named (`cli` decides). `catalog.py` lists the models (download
cache, `--models-dir`, `--models-preset`), `preset.py` reads INI presets and renders a
model's flags, `child.py` runs one model's process, `registry.py` keeps their states, the
load queue and eviction, `app.py` and the `routes_*.py` modules are the HTTP side, and
`server.py` the process. Forwarding, the app shell and the `/metrics` merge come from
`llamaserve.edge`, which the `--upstreams` front shares.
The router never loads llama.cpp: a model's crash cannot take it down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llamaserve.config import ServerConfig


def serve_router(config: ServerConfig, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    from llamaserve.router.server import serve

    return serve(config, argv, environ)
