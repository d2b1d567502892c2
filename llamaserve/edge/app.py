"""The app shell of a process that forwards requests to our servers (the router, the
`--upstreams` front): the same middleware as the single server's app, in the same order (CORS
outermost, then `--api-prefix` stripped, then the site guard (api/site_guard.py) and the API
keys, checked once here, with their limits and usage (api/quota.py)), the access log, and
errors in the envelope of the API family asked (Anthropic's for /v1/messages, else
llama-server's). What is forwarded goes on unprefixed."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from llamaserve.api.cors import CORSMiddleware, CorsPolicy
from llamaserve.api.middleware import AccessLogMiddleware, APIKeyMiddleware
from llamaserve.api.prefix import PrefixMiddleware
from llamaserve.api.quota import add_quota
from llamaserve.api.site_guard import SiteGuardMiddleware, SitePolicy
from llamaserve.config import ServerConfig
from llamaserve.errors import APIError
from llamaserve.telemetry.tracing import request_tracer


def edge_app(title: str, config: ServerConfig) -> FastAPI:
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    # The keys' limits and usage are kept here, at the process that holds the keys; the servers
    # behind it report what each request used (api/usage_report.py) and enforce nothing.
    add_quota(app, config, model=None, check_models=config.router)
    app.state.body_limit = config.body_limit_mib * 1024 * 1024  # the agent tools' routes read it
    app.add_middleware(APIKeyMiddleware, keys=config.api_keys)
    app.add_middleware(SiteGuardMiddleware, policy=SitePolicy.from_config(config))
    if config.api_prefix:
        app.add_middleware(PrefixMiddleware, prefix=config.api_prefix)
    app.add_middleware(CORSMiddleware, policy=CorsPolicy.from_config(config))
    app.add_middleware(AccessLogMiddleware)
    tracer = request_tracer()
    if tracer is not None:  # outermost; the forwarded trace headers name this process's span
        from llamaserve.telemetry.middleware import TracingMiddleware

        app.add_middleware(TracingMiddleware, tracer=tracer, forward=True)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        anthropic = request.url.path.startswith("/v1/messages")
        body = exc.anthropic_body() if anthropic else exc.openai_body()
        return JSONResponse(body, status_code=exc.status, headers=exc.headers or None)

    return app
