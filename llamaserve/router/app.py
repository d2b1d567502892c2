"""The router's HTTP side: its own routes, and every other route forwarded to a model.

The router answers `/health`, `/props` (without `?model=`), `/models` and `/v1/models`,
`POST /models` (a download) and `DELETE /models` (a removal from the cache),
`/models/load`, `/models/unload`, `/models/sse`, `/metrics` (without `?model=`: every loaded
model's, labelled), the resumable-stream routes, the agent tools (`/tools`, the MCP proxy
`/cors-proxy`: the single server's routes, api/edge_tools.py) and the web UI's files; everything else is
forwarded by the model the request names. API keys are checked here once, the children
have none. The handlers live in the route modules, one per concern: routes_models.py,
routes_streams.py, routes_ops.py, routes_forward.py (the forwarding, and the catch-all).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from llamaserve.api.edge_tools import EdgeTools
from llamaserve.config import ServerConfig
from llamaserve.edge.app import edge_app
from llamaserve.edge.proxy import Upstream
from llamaserve.errors import APIError
from llamaserve.router import routes_forward, routes_models, routes_ops, routes_streams
from llamaserve.router.catalog import ModelSpec
from llamaserve.router.context import RouterContext
from llamaserve.router.downloads import Downloads
from llamaserve.router.registry import Registry
from llamaserve.webui import STATIC_DIR

log = logging.getLogger("llamaserve.router")

_ALL_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]

# (path, methods, handler), in the order they match: the catch-all forward comes last.
ROUTES: list[tuple[str, list[str], Callable[..., Awaitable[Response]]]] = [
    ("/v1/stream", ["GET"], routes_streams.stream_get),
    ("/v1/stream", ["DELETE"], routes_streams.stream_delete),
    ("/v1/streams/lookup", ["POST"], routes_streams.streams_lookup),
    ("/health", ["GET"], routes_ops.health),
    ("/v1/health", ["GET"], routes_ops.health),
    ("/props", ["GET"], routes_ops.props),
    ("/models", ["GET"], routes_models.models),
    ("/v1/models", ["GET"], routes_models.models),
    ("/models/load", ["POST"], routes_models.load),
    ("/models/unload", ["POST"], routes_models.unload),
    ("/models", ["POST"], routes_models.download),
    ("/models", ["DELETE"], routes_models.remove),
    ("/models/sse", ["GET"], routes_models.models_sse),
    ("/metrics", ["GET"], routes_ops.metrics),
]
# After the agent tools' routes, which the router serves itself: everything else is forwarded.
CATCH_ALL = ("/{path:path}", _ALL_METHODS, routes_forward.any_route)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown method, ...) in llama-server's envelope."""
    assert isinstance(exc, StarletteHTTPException)  # registered for that class only (Starlette types it wider)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    body: Any = APIError(str(exc.detail), kind, status=exc.status_code).openai_body()
    return JSONResponse(body, status_code=exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return JSONResponse(
        APIError(f"internal error: {type(exc).__name__}", "server_error").openai_body(), status_code=500
    )


def create_router_app(
    config: ServerConfig,
    registry: Registry,
    upstream: Upstream,
    reload_catalog: Callable[[], dict[str, ModelSpec]],
    tools: EdgeTools,
    downloads: Downloads,
) -> FastAPI:
    """`tools`: `/tools` and `/cors-proxy`, answered here (403 when off, as llama-server's router)."""
    app = edge_app("llamaserve router", config)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    static_root = Path(config.static_path).resolve() if config.static_path else STATIC_DIR
    app.state.router = RouterContext(config, registry, upstream, reload_catalog, static_root, downloads)
    for path, methods, handler in ROUTES:
        app.add_api_route(path, handler, methods=methods)
    for tool_routes in tools.routes(only_enabled=False):
        app.include_router(tool_routes)
    path, methods, handler = CATCH_ALL
    app.add_api_route(path, handler, methods=methods)
    return app
