"""Stateful Responses: previous_response_id, store, and the GET/DELETE routes' bodies.

The routes call these; they call the ResponseStore (store.py)
in a worker thread each time, because SQLite blocks on the disk and the event
loop must not. Store problems become APIErrors in OpenAI's envelope:
an unknown id is a 404, a broken database a 500. A failed write never costs
the client its answer: the response goes out with `store: false` and the
failure is logged.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

from llamaserve.errors import APIError
from llamaserve.families.responses.protocol import ResponsesRequest
from llamaserve.families.responses.store import (
    Item,
    ResponseNotFound,
    ResponseStore,
    StoredResponse,
    UnknownCursor,
    normalise_input,
)

log = logging.getLogger("llamaserve.responses")

# What OpenAI stores: a finished response (a failed or cancelled stream is not).
_STORED_STATUSES = ("completed", "incomplete")


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(
        f"Response with id '{response_id}' not found.", "invalid_request_error", status=404, extra={"param": param}
    )


def _store_failed(exc: BaseException) -> APIError:
    return APIError(f"the responses store is unavailable: {exc}", "server_error")


async def history(store: ResponseStore, req: ResponsesRequest) -> list[Item]:
    """The stored conversation `previous_response_id` continues; [] without one."""
    previous = req.previous_response_id
    if previous is None:
        return []
    try:
        return await asyncio.to_thread(store.context, previous)
    except ResponseNotFound as exc:
        if exc.missing == previous:
            raise not_found(previous, "previous_response_id") from None
        raise APIError(
            f"Response with id '{previous}' continues response '{exc.missing}', which was deleted; "
            "the conversation cannot be rebuilt.",
            "invalid_request_error",
            status=404,
            extra={"param": "previous_response_id"},
        ) from None
    except (sqlite3.Error, OSError) as exc:
        raise _store_failed(exc) from exc


async def remember(store: ResponseStore, req: ResponsesRequest, body: dict[str, Any]) -> dict[str, Any]:
    """`body` after storing it when the request asked to; `store` says whether it was."""
    if not req.store or body.get("status") not in _STORED_STATUSES:
        return {**body, "store": False}
    stored = StoredResponse(
        id=body["id"],
        created_at=int(body["created_at"]),
        model=str(body["model"]),
        response=body,
        input_items=normalise_input(req.input),
        instructions=req.instructions,
        previous_response_id=req.previous_response_id,
    )
    try:
        await asyncio.to_thread(store.put, stored)
    except (sqlite3.Error, OSError):
        log.exception("could not store response %s in %s", body["id"], store.path)
        return {**body, "store": False}
    return body


async def retrieve(store: ResponseStore, response_id: str) -> dict[str, Any]:
    try:
        stored = await asyncio.to_thread(store.get, response_id)
    except (sqlite3.Error, OSError) as exc:
        raise _store_failed(exc) from exc
    if stored is None:
        raise not_found(response_id)
    return stored.response


async def delete(store: ResponseStore, response_id: str) -> dict[str, Any]:
    try:
        deleted = await asyncio.to_thread(store.delete, response_id)
    except (sqlite3.Error, OSError) as exc:
        raise _store_failed(exc) from exc
    if not deleted:
        raise not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise APIError("limit: expected an integer from 1 to 100", extra={"param": "limit"})
    return value


async def input_items(store: ResponseStore, response_id: str, query: Mapping[str, str]) -> dict[str, Any]:
    """GET /v1/responses/{id}/input_items: limit (1-100, 20), order (asc|desc, desc), after (an item id)."""
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError("order: expected 'asc' or 'desc'", extra={"param": "order"})
    after = query.get("after") or None
    try:
        page = await asyncio.to_thread(
            store.input_items, response_id, limit=limit, order="asc" if order == "asc" else "desc", after=after
        )
    except ResponseNotFound:
        raise not_found(response_id) from None
    except UnknownCursor as exc:
        raise APIError(str(exc), extra={"param": "after"}) from None
    except (sqlite3.Error, OSError) as exc:
        raise _store_failed(exc) from exc
    return page.to_dict()
