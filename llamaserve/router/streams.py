"""Resumable streams through the router: which model serves each `X-Conversation-Id`.

A POST that carries the header is remembered (conversation → model, with a ticket) before
it waits for its model, so `GET /v1/stream`, `POST /v1/streams/lookup` and `DELETE
/v1/stream` go straight to the owning child. A stop while the model is still loading
forgets the entry, which cancels the parked request (its ticket is no longer current)
instead of leaving an orphan generation; a waiting session request does not give up
when its client drops, since the session is what a later resume reads.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

CONV_HEADER = "x-conversation-id"


@dataclass(frozen=True)
class _Owner:
    model: str
    ticket: int


class ConversationOwners:
    def __init__(self) -> None:
        self._owners: dict[str, _Owner] = {}
        self._tickets = itertools.count(1)

    def remember(self, conv_id: str, model: str) -> int:
        """The ticket of this registration; 0 when there is nothing to remember."""
        if not conv_id or not model:
            return 0
        ticket = next(self._tickets)
        self._owners[conv_id] = _Owner(model, ticket)
        return ticket

    def alive(self, conv_id: str, ticket: int) -> bool:
        owner = self._owners.get(conv_id)
        return owner is not None and owner.ticket == ticket

    def model_of(self, conv_id: str) -> str | None:
        owner = self._owners.get(conv_id)
        return owner.model if owner else None

    def forget(self, conv_id: str) -> None:
        self._owners.pop(conv_id, None)
