"""`--api-keys-config`: each key's limits enforced and its usage counted, as plain ASGI.

It sits inside the key check (so only a valid key gets here) in the process that holds the
keys: the single server, or the edge (router, `--upstreams` front) whose servers behind trust
it. Limits apply to POST requests (every call that makes the model work); GET, HEAD and
DELETE pass. In order, a request is refused:

- 403 in router mode when the body's `model` is not among the key's `models`;
- 400 when it asks for more than the key's `max_tokens` (`max_tokens`,
  `max_completion_tokens`, `max_output_tokens` or `n_predict`; a request naming none gets
  the cap written in): retrying cannot help, so not a 429 (SDKs retry those);
- 429 with `Retry-After` at `max_concurrent`, `requests_per_minute`, `tokens_per_minute`.

Every answer to a POST is counted per key name and model (quota/usage.py): the single
server reads the counts its routes noted (`scope["state"]["tokens"]`), the edge the report
its server sends back (quota/report.py). `GET /usage` answers the counts as JSON (an admin
key or a plain `--api-key`: every key; another key: its own), and `/metrics` gets the
`llamaserve:key_*` counters labelled by key name, never by the key.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI

from llamaserve.api.direct_body import without_direct_body
from llamaserve.api.middleware import ASGIApp, Message, Receive, Scope, Send, presented_key, send_json
from llamaserve.config import ServerConfig
from llamaserve.errors import APIError
from llamaserve.quota import report
from llamaserve.quota.limits import Limiter
from llamaserve.quota.policy import KeyPolicy, KeysConfig
from llamaserve.quota.setup import quota_parts
from llamaserve.quota.usage import Counts, UsageLedger

UNLISTED = "(unlisted)"  # the usage name of a plain --api-key, which has no limits
USAGE_PATHS = {"/usage", "/v1/usage"}
# The generation limit a route reads, written into a request that names none when its key has a cap.
_LIMIT_FIELD = {
    "/v1/chat/completions": "max_tokens",
    "/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/completion": "n_predict",
    "/completions": "n_predict",
    "/infill": "n_predict",
    "/v1/messages": "max_tokens",
    "/v1/responses": "max_output_tokens",
    "/responses": "max_output_tokens",
}
_ASKED_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


async def _error(send: Send, path: str, exc: APIError) -> None:
    body = exc.anthropic_body() if path.startswith("/v1/messages") else exc.openai_body()
    headers = tuple((k.lower().encode(), v.encode()) for k, v in exc.headers.items())
    await send_json(send, exc.status, json.dumps(body).encode(), headers)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then the client's own messages (disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _capped(policy: KeyPolicy, path: str, data: dict[str, Any]) -> APIError | bool:
    """A 400 when the request asks for more than the key's max_tokens; True when the cap was
    written in; False when the body is left as it is."""
    cap = policy.max_tokens
    if cap is None:
        return False
    asked = [(f, data[f]) for f in _ASKED_FIELDS if data.get(f) is not None]
    for field, value in asked:
        if isinstance(value, int) and not isinstance(value, bool) and (value < 0 or value > cap):
            shown = "unlimited" if value < 0 else str(value)
            return APIError(f"{field} is {shown}, over the max_tokens limit of {cap} of key '{policy.name}'")
    if asked or path not in _LIMIT_FIELD:
        return False
    data[_LIMIT_FIELD[path]] = cap
    return True


class QuotaMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        keys: KeysConfig,
        ledger: UsageLedger,
        *,
        model: str | None,
        check_models: bool,
        body_limit: int,
    ) -> None:
        """`model`: the single server's model name; None at an edge, whose servers report theirs.
        `check_models`: router mode, where a key's `models` apply."""
        self.app = app
        self.keys = keys
        self.ledger = ledger
        self.model = model
        self.check_models = check_models
        self.body_limit = body_limit
        self.limiter = Limiter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method"), scope.get("path", "")
        if method == "GET" and path in USAGE_PATHS:
            await self._usage(scope, send)
        elif method == "GET" and path == "/metrics":
            await self.app(scope, receive, self._with_key_metrics(send))
        elif method == "POST":
            await self._limited(scope, receive, send, path)
        else:
            await self.app(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        policy = self.keys.policy_for(presented_key(scope))
        name = policy.name if policy else UNLISTED
        asked_model = ""
        if policy is not None and (policy.max_tokens is not None or (self.check_models and policy.models is not None)):
            refused, receive, asked_model = await self._check_body(scope, receive, policy, path)
            if refused is not None:
                await _error(send, path, refused)
                await self.ledger.record(name, self.model or asked_model or "-", Counts(requests=1, errors=1))
                return
        if policy is not None:
            refusal = self.limiter.admit(policy, time.monotonic())
            if refusal is not None:
                error = APIError(
                    refusal.message, "rate_limit_error", headers={"Retry-After": str(refusal.retry_after_s)}
                )
                await _error(send, path, error)
                await self.ledger.record(name, self.model or asked_model or "-", Counts(requests=1, errors=1))
                return
        await self._counted(scope, receive, send, policy, name, asked_model)

    async def _counted(
        self, scope: Scope, receive: Receive, send: Send, policy: KeyPolicy | None, name: str, asked_model: str
    ) -> None:
        status = 0
        reader = report.ReportReader() if self.model is None else None
        if reader is not None:  # an edge asks its server for the counts (a client's own header is replaced)
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != report.HEADER]
            scope["headers"] = [*headers, (report.HEADER, report.ASK)]
            scope = without_direct_body(scope)  # the reader takes the report out of streamed chunks

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if reader is not None:
                    message["headers"] = reader.headers(list(message.get("headers", ())))
            elif reader is not None and reader.streamed and message["type"] == "http.response.body":
                message["body"] = reader.body(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            if reader is not None:
                got = reader.counts()
                prompt, cached, completion = got.prompt, got.cached, got.completion
                model = got.model or asked_model or "-"
            else:
                prompt, cached, completion = scope.get("state", {}).get("tokens") or (0, 0, 0)
                model = self.model or "-"
            if policy is not None:
                self.limiter.finish(policy.name, prompt + completion, time.monotonic())
            failed = 1 if status == 0 or status >= 400 else 0
            await self.ledger.record(name, model, Counts(1, prompt, cached, completion, failed))

    async def _check_body(
        self, scope: Scope, receive: Receive, policy: KeyPolicy, path: str
    ) -> tuple[APIError | None, Receive, str]:
        """The body read once for the model and max_tokens checks, then given to the route (the
        refusal if any, the receive that replays the body, the model the body names)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return APIError("the client closed the request", status=499), receive, ""
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.body_limit:
                error = APIError(f"request body too large (limit is {self.body_limit} bytes)", "request_too_large")
                return error, receive, ""
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            data = json.loads(body) if body else None
        except (ValueError, RecursionError):
            data = None  # the route answers what is wrong with it
        model = data.get("model") if isinstance(data, dict) else None
        asked_model = model if isinstance(model, str) else ""
        if self.check_models and policy.models is not None and asked_model not in policy.models:
            allowed = ", ".join(sorted(policy.models))
            named = f"model '{asked_model}'" if asked_model else "a request that names no model"
            error = APIError(f"key '{policy.name}' may not use {named}; it may use: {allowed}", "permission_error")
            return error, receive, asked_model
        if isinstance(data, dict):
            capped = _capped(policy, path, data)
            if isinstance(capped, APIError):
                return capped, receive, asked_model
            if capped:
                body = json.dumps(data).encode()
                headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-length"]
                scope["headers"] = [*headers, (b"content-length", str(len(body)).encode())]
        return None, _replay(body, receive), asked_model

    async def _usage(self, scope: Scope, send: Send) -> None:
        policy = self.keys.policy_for(presented_key(scope))
        own = None if policy is None or policy.admin else policy.name
        payload = {"object": "list", "data": self.ledger.rows(own)}
        await send_json(send, 200, json.dumps(payload).encode())

    def _with_key_metrics(self, send: Send) -> Send:
        """/metrics with the key counters after the server's own (its 200 only)."""
        start: Message | None = None
        parts: list[bytes] = []

        async def appending_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] == 200:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            text = b"".join(parts)
            body = text + (b"" if not text or text.endswith(b"\n") else b"\n") + self.ledger.prometheus()
            headers = [(k, v) for k, v in start.get("headers", ()) if k != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        return appending_send


def add_quota(app: FastAPI, config: ServerConfig, *, model: str | None, check_models: bool) -> None:
    """The quota middleware, when --api-keys-config is given; add it just before the key check."""
    parts = quota_parts(config)
    if parts is None:
        return
    keys, ledger = parts
    limit = config.body_limit_mib * 1024 * 1024
    app.add_middleware(
        QuotaMiddleware, keys=keys, ledger=ledger, model=model, check_models=check_models, body_limit=limit
    )
