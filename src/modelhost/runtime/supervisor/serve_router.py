"""Ray Serve's request router for modelhost's applications: a generation goes to the Serve replica that
holds its prompt's prefix, as the local backend's dispatcher sends it to the replica process that does.

On Ray one `RayServeReplica` stands for the whole application, and Serve's router, inside each
gateway's handle, picks the actor; its default (power of two random choices) is blind to prefixes. This
router (`request_router_class` of the application's deployment config) ranks the actors as
`runtime.gateway.routing` ranks local replicas: the request's affinity (`routing.affinity_of`: what the
client says, else the prompt's lead) hashed with each actor's replica ID, rendezvous style. Every
gateway's handle, on any server of the cluster, sees the same replica IDs from Serve's controller, so
all of them send one prefix to the same actor with nothing shared but that.

The bound is Serve's own view of each actor's load: the requests it holds for every gateway (its queue
length, probed and cached by the router). The preferred actor is passed over for the least loaded when
it holds `max_imbalance` or more requests beyond it. A request without an affinity (embeddings, a
batch call) is routed as Serve's default does.
"""

from __future__ import annotations

from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica

from modelhost.runtime.gateway import routing

ROUTER_CLASS = f"{__name__}.AffinityRouter"


class AffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Ranks the actor that a generation's affinity belongs to first (`choose_replicas`)."""

    max_imbalance = 2

    def initialize_state(self, max_imbalance: int = 2, **kwargs: Any) -> None:
        """`request_router_kwargs`: the bound, `MODELHOST_ROUTING_MAX_IMBALANCE`."""
        self.max_imbalance = max_imbalance

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        affinity = _affinity(pending_request)
        if not affinity or len(candidate_replicas) < 2:
            return list(await super().choose_replicas(candidate_replicas, pending_request))
        held = {r.replica_id: self._held(r) for r in candidate_replicas}
        preferred = max(candidate_replicas, key=lambda r: routing.weight(affinity, r.replica_id.unique_id))
        least = min(candidate_replicas, key=lambda r: held[r.replica_id])
        if held[preferred.replica_id] - held[least.replica_id] >= self.max_imbalance:
            return [[least], [r for r in candidate_replicas if r is not least]]
        # the preferred actor first; if it cannot take the request (its queue full), the others
        return [[preferred], [r for r in candidate_replicas if r is not preferred]]

    def _held(self, replica: RunningReplica) -> int:
        """Requests the actor holds, as Serve last measured them (0 where it has not yet)."""
        return int(self.replica_queue_len_cache.get(replica.replica_id) or 0)


def _affinity(pending_request: PendingRequest | None) -> str:
    """The affinity of a `generate` call (its first argument, the `GenerationRequest`); "" for others."""
    if pending_request is None or not pending_request.args:
        return ""
    return routing.affinity_of(pending_request.args[0])
