"""Ray Serve's choice of replica made by our balancer: conversation affinity, longest cached prefix, load.

Ray Serve runs a request router inside each caller of a deployment handle, here the
ingress. The ingress passes a routing hint as the first argument of every call (the
prompt's block hashes, the session key, a `previous_response_id` and the replica that
stored it); this router hands the hint and the replicas Ray considers available to a
`scale.Balancer`, whose members are the replica ids; a request counts as in flight on
its replica from this choice until the ingress has relayed its answer. The first rank
is the chosen replica; the others follow in case it is full, so a request is never
stuck behind its preferred replica.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

from llamaserve.scale.balancer import Balancer


def _hint(pending: PendingRequest | None) -> dict[str, Any] | None:
    if pending is None or not pending.args:
        return None
    first = pending.args[0]
    return first if isinstance(first, dict) and "hashes" in first else None


# The routers of this process (the ingress's handle has one): the ingress lists their members.
ROUTERS: list[PrefixRouter] = []


class PrefixRouter(FIFOMixin, RequestRouter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.balancer = Balancer([])
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        # Ray ships this class to the ingress pickled by value, with its own copy of this
        # module's globals: the list the ingress reads is the imported module's.
        importlib.import_module(__name__).ROUTERS.append(self)

    def initialize_state(self, **kwargs: Any) -> None:
        pass

    def _sync(self, replicas: Sequence[RunningReplica]) -> None:
        ids = {r.replica_id.unique_id for r in replicas}
        for gone in set(self.balancer.members) - ids:
            self.balancer.remove(gone)
        for rid in ids:
            self.balancer.add(rid)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._sync(replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.balancer.remove(replica_id.unique_id)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        hint = _hint(pending_request)
        if hint is None:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        for rid in by_id:
            self.balancer.add(rid)
        pinned = by_id.get(hint.get("pin", ""))
        if pinned is not None:  # the ingress asks one replica in particular (its /metrics)
            return [[pinned]]
        if hint.get("previous") and hint.get("previous_owner"):
            self.balancer.record_response(hint["previous"], hint["previous_owner"])
        exclude = frozenset(set(self.balancer.members) - set(by_id))
        choice = self.balancer.choose(hint["hashes"], hint.get("session", ""), hint.get("previous", ""), exclude)
        chosen = by_id[choice.member.url]
        # In flight until the ingress has relayed the answer (Ingress.finished).
        self.balancer.started(choice.member)
        return [[chosen]] + [[r] for r in candidate_replicas if r is not chosen]
