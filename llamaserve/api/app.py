"""The HTTP application: middleware, error envelopes, and one router per API family.

Each API family's routes live in its folder under llamaserve/families/ (beside its request
models and serving code); the server's own routes (health, props, slots, metrics, LoRA,
resumable streams, tools, the MCP proxy) in this folder's routes_*.py; what routes share in
http.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamaserve.api.cors import CORSMiddleware, CorsPolicy
from llamaserve.api.cors_proxy import cors_proxy_routes
from llamaserve.api.http import JSONUTF8Response
from llamaserve.api.middleware import AccessLogMiddleware, APIKeyMiddleware, IdleMiddleware
from llamaserve.api.prefix import PrefixMiddleware
from llamaserve.api.quota import add_quota
from llamaserve.api.routes_ops import ops_routes
from llamaserve.api.routes_stream import stream_routes
from llamaserve.api.routes_tools import tools_routes
from llamaserve.api.site_guard import SiteGuardMiddleware, SitePolicy
from llamaserve.api.sse import ClientGone
from llamaserve.api.usage_report import UsageReportMiddleware
from llamaserve.api.vertex import add_predict_route
from llamaserve.errors import APIError
from llamaserve.families.anthropic.routes import anthropic_routes
from llamaserve.families.batches.routes import BatchService
from llamaserve.families.chat.routes import chat_routes
from llamaserve.families.completions.routes import completion_routes
from llamaserve.families.embeddings.routes import embedding_routes
from llamaserve.families.native.routes import native_routes
from llamaserve.families.responses.routes import responses_routes
from llamaserve.serving.sleep import IdleSleeper
from llamaserve.serving.state import ServerState
from llamaserve.telemetry.tracing import request_tracer

if TYPE_CHECKING:  # the tools' modules load only on a server whose tools are on
    from llamaserve.tools.registry import Toolbox

log = logging.getLogger("llamaserve.http")


def _add_middleware(app: FastAPI, state: ServerState) -> None:
    """Outermost last: with tracing on, the request's span covers everything below; the access
    log sees every answer; CORS answers preflights before
    anything else and marks every answer (unprefixed 404s and 401s too, as llama-server);
    the prefix is stripped before the site guard refuses what another site's page could
    send to the routes that act on the machine, and before the key check guards everything
    else; the key's limits (--api-keys-config) refuse before a task counts; and only authorised
    tasks reach the idle tracking (and may wake a sleeping model). Innermost, a request from an
    edge of ours gets what it used reported back (api/usage_report.py)."""
    config = state.config
    app.add_middleware(UsageReportMiddleware, model=config.model_alias)
    if config.sleep_idle_seconds > 0:
        app.add_middleware(IdleMiddleware, sleeper=IdleSleeper(state, config.sleep_idle_seconds))
    add_quota(app, config, model=config.model_alias, check_models=False)
    app.add_middleware(APIKeyMiddleware, keys=config.api_keys)
    app.add_middleware(SiteGuardMiddleware, policy=SitePolicy.from_config(config))
    if config.api_prefix:
        app.add_middleware(PrefixMiddleware, prefix=config.api_prefix)
    app.add_middleware(CORSMiddleware, policy=CorsPolicy.from_config(config))
    app.add_middleware(AccessLogMiddleware)
    tracer = request_tracer()
    if tracer is not None:  # outermost: the span covers every answer, to a stream's last chunk
        from llamaserve.telemetry.middleware import TracingMiddleware

        app.add_middleware(TracingMiddleware, tracer=tracer, model=config.model_alias)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in the OpenAI/native envelope (the Anthropic routes shape their own)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        return JSONUTF8Response(exc.openai_body(), status_code=exc.status, headers=exc.headers or None)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        error = APIError(str(exc.detail), kind, status=exc.status_code)
        return JSONUTF8Response(error.openai_body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s", request.url.path)
        error = APIError(f"internal error: {type(exc).__name__}", "server_error")
        return JSONUTF8Response(error.openai_body(), status_code=500)


def create_app(state: ServerState, toolbox: Toolbox | None = None) -> FastAPI:
    """`toolbox`: the agent tools (None: /tools answers 403)."""
    config = state.config
    app = FastAPI(title="llamaserve", version="0.1.0", docs_url=None, redoc_url=None)
    app.state.server = state
    app.state.body_limit = config.body_limit_mib * 1024 * 1024
    app.state.sse_ping_interval = config.sse_ping_interval
    _add_middleware(app, state)
    _add_error_handlers(app)
    # The Batch API runs its lines through this app; the server starts and stops its runner.
    batches = BatchService(state)
    batches.bind(app)
    app.state.batches = batches
    routers = [
        ops_routes(state),
        # llama-server's native routes before OpenAI's: Vertex AI's /predict gives an alias
        # (`completions`, `embeddings`) to the first route registered under it.
        native_routes(state),
        completion_routes(state),
        embedding_routes(state),
        chat_routes(state),
        anthropic_routes(state),
        responses_routes(state),
        batches.routes(),
        stream_routes(state),
        tools_routes(toolbox),
        cors_proxy_routes(config.ui_mcp_proxy),
    ]
    for router in routers:
        app.include_router(router)
    if config.gcp_predict_route:
        add_predict_route(app, routers, config.gcp_predict_route, config.gcp_health_route)
    # The web UI (or --path) last: "/" would otherwise shadow the API.
    if config.static_path:
        from starlette.staticfiles import StaticFiles

        app.mount("/", StaticFiles(directory=config.static_path, html=True), name="static")
    elif config.webui:
        from llamaserve.webui import static_files

        app.mount("/", static_files(), name="webui")
    return app
