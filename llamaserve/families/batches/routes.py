"""OpenAI Batch API routes: /v1/files (upload, list, read, content, delete) and /v1/batches
(create, read, list, cancel), with the service that runs the batches over this app.

The store (store.py) is opened on first use; the runner (runner.py) starts with the server and
resumes the batches an earlier run left unfinished. Each line runs through this same app as a
sub-request to its route, with the credentials of the request that created the batch, so it
meets the key check, the body checks and the error envelopes a live request meets. None of
these routes needs the model, so they answer while it loads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from llamaserve.api.http import JSONUTF8Response, read_body, read_json
from llamaserve.errors import APIError
from llamaserve.families.batches.protocol import BatchCreateRequest, metadata_of
from llamaserve.families.batches.runner import BatchRunner, Dispatch
from llamaserve.families.batches.store import INPUT_PURPOSE, BatchStore, Conflict, NotFound, batch_dir
from llamaserve.serving.state import ServerState

log = logging.getLogger("llamaserve.batches")

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

# Lines of one batch in flight at once when --batch-concurrency is 0 (auto): half the slots, at
# most AUTO_CONCURRENCY_MAX. Always fewer than the slots, so an interactive request finds one
# free. On 2 CPU cores with 16 slots (benchmarks/batch_bench.py, 1,000 lines beside 4 streaming
# clients) 8 lines kept the clients' TTFT p50 at 1.00x and took 80% of the capacity they left,
# 4 lines 1.09-1.13x and 63-102%: a batch row sits out a step that prefills an interactive
# prompt, so more lines cost the clients little and fill more of each decode step.
AUTO_CONCURRENCY_MAX = 8
_CREDENTIAL_HEADERS = ("authorization", "x-api-key")
_FORM_FIELDS = ("purpose", "file")


def app_dispatch(app: ASGIApp, prefix: str) -> Dispatch:
    """A line sent through `app` as a POST to its route: (status, JSON body, Retry-After)."""

    async def dispatch(url: str, body: bytes, credentials: list[tuple[str, str]]) -> tuple[int, Any, float | None]:
        path = prefix + url
        headers = [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in credentials),
        ]
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("batch", 0),  # the access log names batch lines so
            "server": ("localhost", 0),
            "state": {},
        }
        sent = False
        status = 500
        retry_after: float | None = None
        chunks: list[bytes] = []

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # a batch line has no client to go away
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status, retry_after
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for key, value in message.get("headers", []):
                    if key.lower() == b"retry-after" and value.strip().isdigit():
                        retry_after = float(value)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await app(scope, receive, send)
        data = b"".join(chunks)
        try:
            return status, json.loads(data) if data else None, retry_after
        except ValueError:
            return (
                status,
                {"error": {"code": status, "message": data.decode("utf-8", "replace"), "type": "server_error"}},
                retry_after,
            )

    return dispatch


class BatchService:
    """The store, the runner and the routes of one server."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.store = BatchStore(batch_dir(state.config.batch_dir))
        self.runner: BatchRunner | None = None

    def bind(self, app: ASGIApp) -> None:
        """The app the lines run through (the whole app, middleware included)."""
        self.runner = BatchRunner(self.store, app_dispatch(app, self.state.config.api_prefix), self.concurrency)

    def concurrency(self) -> int:
        """--batch-concurrency (0: auto, see AUTO_CONCURRENCY_MAX), kept below the slot count."""
        rt = self.state.runtime
        asked = self.state.config.batch_concurrency
        if rt is None:  # not loaded yet: asked again when the runner starts a line
            return max(1, asked or 1)
        slots = rt.engine.n_slots
        if not asked:
            asked = min(AUTO_CONCURRENCY_MAX, slots // 2)
        return max(1, min(asked, slots - 1))

    def start(self) -> None:
        if self.runner is not None:
            self.runner.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
        await asyncio.to_thread(self.store.close)

    def routes(self) -> APIRouter:
        return _routes(self)


async def _call(fn: Callable[[], T], what: str) -> T:
    """A store call in a worker thread; its failures as the API's errors."""
    try:
        return await asyncio.to_thread(fn)
    except NotFound as exc:
        raise APIError(f"No such {what}: '{exc.args[0]}'", "not_found_error", status=404) from None
    except Conflict as exc:
        raise APIError(str(exc)) from None
    except (sqlite3.Error, OSError) as exc:
        log.exception("batch store")
        raise APIError(f"the batch store is unavailable: {exc}", "server_error") from None


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.lstrip("-").isdigit() or not low <= int(raw) <= high:
        raise APIError(f"{name}: expected an integer from {low} to {high}", extra={"param": name})
    return int(raw)


def _credentials(request: Request) -> list[list[str]]:
    return [[name, request.headers[name]] for name in _CREDENTIAL_HEADERS if name in request.headers]


def _routes(service: BatchService) -> APIRouter:
    router = APIRouter()
    store = service.store

    @router.post("/v1/files")
    async def upload_file(request: Request) -> Response:
        purpose, filename, data = await _read_upload(request)
        return JSONUTF8Response(await _call(lambda: store.add_file(filename, purpose, data), "file"))

    @router.get("/v1/files")
    async def list_files(request: Request) -> Response:
        limit = _int_param(request, "limit", 10_000, 1, 10_000)
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise APIError("order: expected 'asc' or 'desc'", extra={"param": "order"})
        purpose = request.query_params.get("purpose")
        after = request.query_params.get("after")
        return JSONUTF8Response(
            await _call(lambda: store.list_files(purpose, limit, "asc" if order == "asc" else "desc", after), "file")
        )

    @router.get("/v1/files/{file_id}")
    async def retrieve_file(file_id: str) -> Response:
        return JSONUTF8Response(await _call(lambda: store.file(file_id), "file"))

    @router.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str) -> Response:
        data = await _call(lambda: store.file_bytes(file_id), "file")
        return Response(data, media_type="application/octet-stream")

    @router.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str) -> Response:
        return JSONUTF8Response(await _call(lambda: store.delete_file(file_id), "file"))

    @router.post("/v1/batches")
    async def create_batch(request: Request) -> Response:
        req = await read_json(request, BatchCreateRequest)
        credentials = _credentials(request)
        obj = await _call(
            lambda: store.create_batch(req.input_file_id, req.endpoint, metadata_of(req), credentials), "file"
        )
        if service.runner is not None:
            service.runner.wake()
        return JSONUTF8Response(obj)

    @router.get("/v1/batches")
    async def list_batches(request: Request) -> Response:
        limit = _int_param(request, "limit", 20, 1, 100)
        after = request.query_params.get("after")
        return JSONUTF8Response(await _call(lambda: store.list_batches(limit, after), "batch"))

    @router.get("/v1/batches/{batch_id}")
    async def retrieve_batch(batch_id: str) -> Response:
        return JSONUTF8Response(await _call(lambda: store.batch(batch_id), "batch"))

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str) -> Response:
        obj = await _call(lambda: store.request_cancel(batch_id), "batch")
        if service.runner is not None and obj["status"] == "cancelling":
            service.runner.cancel(batch_id)
        return JSONUTF8Response(obj)

    return router


async def _read_upload(request: Request) -> tuple[str, str, bytes]:
    """The multipart form of an upload, read within --body-limit: (purpose, filename, bytes)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError("expected a multipart/form-data body with 'purpose' and 'file'")
    raw = await read_body(request)

    async def body() -> AsyncGenerator[bytes, None]:
        yield raw

    try:
        form = await MultiPartParser(request.headers, body()).parse()
    except MultiPartException as exc:
        raise APIError(f"the form could not be read: {exc.message}") from None
    purpose: str | None = None
    filename = "upload.jsonl"
    data: bytes | None = None
    for key, value in form.multi_items():
        if key not in _FORM_FIELDS:
            raise APIError(f"{key}: not supported by this server's /v1/files", extra={"param": key})
        if isinstance(value, UploadFile):
            if key == "file":
                data = await value.read()
                filename = value.filename or filename
            await value.close()
        elif key == "purpose":
            purpose = value
    if purpose != INPUT_PURPOSE:
        raise APIError(f"purpose: only '{INPUT_PURPOSE}' is supported (got {purpose!r})", extra={"param": "purpose"})
    if data is None:
        raise APIError("file: the form has no 'file' part", extra={"param": "file"})
    if not data.strip():
        raise APIError("file: the file is empty", extra={"param": "file"})
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError("file: a batch input file is JSONL, UTF-8 text", extra={"param": "file"}) from None
    return purpose, filename, data
