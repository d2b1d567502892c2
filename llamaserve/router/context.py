"""What the router's route modules share: one `RouterContext` per app, kept on the app's state.

The routes are plain top-level functions (routes_*.py); each reads the context of the app it
serves through `context_of(request)`, so no handler closes over another's locals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request

from llamaserve.config import ServerConfig
from llamaserve.edge.proxy import Upstream
from llamaserve.router.catalog import ModelSpec
from llamaserve.router.downloads import Downloads
from llamaserve.router.registry import Registry
from llamaserve.router.streams import ConversationOwners


@dataclass
class RouterContext:
    config: ServerConfig
    registry: Registry
    upstream: Upstream
    reload_catalog: Callable[[], dict[str, ModelSpec]]  # ?reload=1 on /models reads the catalog again
    static_root: Path  # the web UI's files, or --path
    downloads: Downloads  # POST /models
    owners: ConversationOwners = field(default_factory=ConversationOwners)


def context_of(request: Request) -> RouterContext:
    ctx = request.app.state.router
    if not isinstance(ctx, RouterContext):  # only create_router_app builds apps these routes serve
        raise TypeError("router route on an app without a RouterContext")
    return ctx
