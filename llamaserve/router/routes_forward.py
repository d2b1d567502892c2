"""The router's forwarding: which model a request names, the wait for it, and the relay.

A POST names its model in the body's `model` (a multipart body in its `model` field), a
GET or DELETE in `?model=`; aliases resolve to their model. `?autoload=true|false`
overrides `--models-autoload` for one request. Every route the router does not answer
itself ends here (`any_route`), the web UI's files excepted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpcore
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from llamaserve.errors import APIError
from llamaserve.router.child import Child
from llamaserve.router.context import RouterContext, context_of
from llamaserve.router.registry import FAKE_DELAY_S, Instance
from llamaserve.router.streams import CONV_HEADER
from llamaserve.webui import headers_for

log = logging.getLogger("llamaserve.router")

_STOPPED_WHILE_LOADING = "request cancelled by a stop while the model was loading"
# How a dead child's port answers: refused, or a kept-alive connection closed before any answer.
_UNSENT = (httpcore.ConnectError, httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError, OSError)


def _autoload(request: Request, default: bool) -> bool:
    value = request.query_params.get("autoload")
    if value is None or value == "":
        return default
    return value in ("true", "1")


def model_from_json(body: bytes) -> str:
    """The `model` of a JSON body; "" when there is none (a body that is not JSON is a 400)."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(f"invalid JSON body: {exc}") from exc
    value = parsed.get("model") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else ""


async def _model_of(request: Request, body: bytes) -> str:
    if request.method in ("GET", "DELETE", "HEAD"):
        return request.query_params.get("model", "")
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form()
        value = form.get("model")
        return value if isinstance(value, str) else ""
    return model_from_json(body)


def _validate(ctx: RouterContext, name: str, autoload: bool) -> Instance:
    if not name:
        raise APIError("model name is missing from the request")
    inst = ctx.registry.resolve(name)
    if inst is None:
        raise APIError(f"model '{name}' not found")
    if not autoload and not inst.running:
        raise APIError("model is not loaded")
    return inst


async def forward(
    ctx: RouterContext,
    request: Request,
    inst: Instance,
    body: bytes,
    *,
    touch: bool,
    gone: Callable[[], Awaitable[bool]],
    conv: tuple[str, int] | None = None,
) -> Response:
    """The request relayed to `inst`'s child once it runs; the lease ends with the relayed answer.

    A child that died since the router last looked (killed, crashed) refuses the connection
    before anything is sent: once the registry has seen it exit, the request loads the model
    again and is sent to the new process, so a client never meets the dead one.
    """
    registry = ctx.registry
    for attempt in (1, 2):
        child = await _lease(ctx, inst, touch=touch, gone=gone, conv=conv)
        try:
            return await ctx.upstream.forward(
                child.base_url,
                request.method,
                request.url.path,
                request.url.query,
                request.headers.items(),
                body,
                on_done=functools.partial(registry.release, inst, child),
            )
        except APIError as exc:  # the lease is released already
            if attempt == 2 or not isinstance(exc.__cause__, _UNSENT) or not await registry.exited(inst, child):
                raise
            log.warning("model %s: its process had exited; starting it again for this request", inst.name)
    raise AssertionError("unreachable")


async def _lease(
    ctx: RouterContext,
    inst: Instance,
    *,
    touch: bool,
    gone: Callable[[], Awaitable[bool]],
    conv: tuple[str, int] | None,
) -> Child:
    """Wait for `inst` to run and take a lease on its process."""
    registry = ctx.registry
    await registry.acquire(inst, gone, touch=touch)
    leased = inst.child  # the lease belongs to this process, not to a later one of the model
    try:
        if registry.fake_timing:
            await asyncio.sleep(FAKE_DELAY_S)
        if conv is not None and not ctx.owners.alive(*conv):
            raise APIError(_STOPPED_WHILE_LOADING)
        child = inst.child
        if child is None or child is not leased:
            raise APIError(f"model '{inst.name}' stopped", "unavailable_error")
    except BaseException:
        registry.release(inst, leased)
        raise
    return child


async def routed(request: Request, *, touch: bool) -> Response:
    """Forward by the model the request names; a request of a resumable stream is remembered first."""
    ctx = context_of(request)
    body = await request.body()
    inst = _validate(ctx, await _model_of(request, body), _autoload(request, ctx.config.models_autoload))
    request.state.trace_model = inst.name  # the request span's gen_ai.request.model (telemetry/middleware.py)
    conv_id = request.headers.get(CONV_HEADER, "") if request.method == "POST" else ""
    ticket = ctx.owners.remember(conv_id, inst.name)
    if not ticket:
        return await forward(ctx, request, inst, body, touch=touch, gone=request.is_disconnected)

    # A session request keeps waiting for its model when its client drops (a later resume
    # reads the session); only a stop of the conversation cancels it.
    async def stopped() -> bool:
        return not ctx.owners.alive(conv_id, ticket)

    try:
        return await forward(ctx, request, inst, body, touch=touch, gone=stopped, conv=(conv_id, ticket))
    except APIError as exc:
        if exc.status == 499 and not ctx.owners.alive(conv_id, ticket):
            raise APIError(_STOPPED_WHILE_LOADING) from exc
        raise


def _static(root: Path, path: str) -> Response | None:
    """A file of the web UI (or of --path), when `path` names one (`/` is the page)."""
    rel = path.lstrip("/") or "index.html"
    target = (root / rel).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return None
    return FileResponse(target, headers=headers_for(str(target)))


async def any_route(request: Request, path: str) -> Response:
    """Every other route: a web UI file for a GET without `?model=`, else forwarded."""
    config = context_of(request).config
    if request.method == "GET" and not request.query_params.get("model") and (config.webui or config.static_path):
        page = _static(context_of(request).static_root, request.url.path)
        if page is not None:
            return page
    return await routed(request, touch=request.method == "POST")
