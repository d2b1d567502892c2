"""Choosing a server for each request: conversation affinity, then the longest cached prefix, then load.

The members are the servers behind one front (a static `--upstreams` list, or the replicas
of a Ray deployment). For each request, in order:

1. a conversation stays where it started: the `x-session-id` header, or the Responses
   chain (a `previous_response_id`, or a stored response's id in the path) names the
   member that answered before, as long as that member is healthy and not overloaded;
2. otherwise the member whose prefix index shares the most leading blocks with the prompt
   (ties: the less loaded), unless it is overloaded;
3. otherwise the least loaded member (in-flight requests), ties in turn.

Overloaded means more in-flight requests than `OVERLOAD_FACTOR` times the least loaded
member's plus `OVERLOAD_SLACK`: affinity is worth a cache hit, not an unbounded queue.
The chosen member's index then learns the prompt's blocks.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from llamaserve.scale.prefix_index import PrefixIndex

OVERLOAD_FACTOR = 2
OVERLOAD_SLACK = 2
_MAX_AFFINITY = 100_000  # sessions and response ids remembered, least recently used dropped


@dataclass
class Member:
    """One server: its base URL, health, in-flight count and recent prompts."""

    url: str
    healthy: bool = True
    inflight: int = 0
    served: int = 0
    index: PrefixIndex = field(default_factory=PrefixIndex)


@dataclass(frozen=True)
class Choice:
    member: Member
    reason: str  # "session", "response", "prefix" or "load", for the logs and the tests
    matched_blocks: int = 0


class _Affinity:
    """Bounded key → member URL map (sessions, response ids)."""

    def __init__(self) -> None:
        self._map: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        url = self._map.get(key)
        if url is not None:
            self._map.move_to_end(key)
        return url

    def put(self, key: str, url: str) -> None:
        self._map[key] = url
        self._map.move_to_end(key)
        while len(self._map) > _MAX_AFFINITY:
            self._map.popitem(last=False)

    def drop_member(self, url: str) -> None:
        for key in [k for k, v in self._map.items() if v == url]:
            del self._map[key]


class NoMember(Exception):
    """No healthy member to send a request to."""


class Balancer:
    def __init__(self, urls: Iterable[str]) -> None:
        self.members: dict[str, Member] = {}
        for url in urls:
            self.add(url)
        self.sessions = _Affinity()
        self.responses = _Affinity()
        self._turn = itertools.count()

    def add(self, url: str) -> Member:
        member = self.members.get(url)
        if member is None:
            member = self.members[url] = Member(url)
        return member

    def remove(self, url: str) -> None:
        self.members.pop(url, None)
        self.sessions.drop_member(url)
        self.responses.drop_member(url)

    def healthy(self) -> list[Member]:
        return [m for m in self.members.values() if m.healthy]

    def set_health(self, url: str, ok: bool) -> None:
        member = self.members.get(url)
        if member is None or member.healthy == ok:
            return
        member.healthy = ok
        if not ok:
            # Its caches are gone or stale once it comes back (a restart), so nothing is known there.
            member.index.clear()

    def _overloaded(self, member: Member, pool: list[Member]) -> bool:
        least = min(m.inflight for m in pool)
        return member.inflight > OVERLOAD_FACTOR * least + OVERLOAD_SLACK

    def choose(
        self,
        hashes: list[bytes],
        session: str = "",
        previous_response: str = "",
        exclude: frozenset[str] = frozenset(),
    ) -> Choice:
        pool = [m for m in self.healthy() if m.url not in exclude]
        if not pool:
            raise NoMember("no healthy upstream server")
        for key, table, reason in (
            (session, self.sessions, "session"),
            (previous_response, self.responses, "response"),
        ):
            url = table.get(key) if key else None
            member = self.members.get(url) if url else None
            if member is not None and member in pool and not self._overloaded(member, pool):
                return self._pick(Choice(member, reason, member.index.match(hashes)), hashes, session)
        best: Member | None = None
        best_len = 0
        for member in pool:
            matched = member.index.match(hashes) if hashes else 0
            if matched > best_len or (matched == best_len and best is not None and member.inflight < best.inflight):
                best, best_len = member, matched
        if best is not None and best_len > 0 and not self._overloaded(best, pool):
            return self._pick(Choice(best, "prefix", best_len), hashes, session)
        least = min(m.inflight for m in pool)
        idle = [m for m in pool if m.inflight == least]
        member = idle[next(self._turn) % len(idle)]
        return self._pick(Choice(member, "load", member.index.match(hashes)), hashes, session)

    def _pick(self, choice: Choice, hashes: list[bytes], session: str) -> Choice:
        choice.member.index.add(hashes)
        if session:
            self.sessions.put(session, choice.member.url)
        return choice

    def owner_of_response(self, response_id: str) -> Member | None:
        url = self.responses.get(response_id)
        member = self.members.get(url) if url else None
        return member if member is not None and member.healthy else None

    def record_response(self, response_id: str, url: str) -> None:
        self.responses.put(response_id, url)

    def started(self, member: Member) -> None:
        member.inflight += 1
        member.served += 1

    def finished(self, member: Member) -> None:
        member.inflight = max(0, member.inflight - 1)
