"""Who may store which snapshots on this node and fetch which from it: the peer service's authorizer.

Modelled on Kubernetes' node authorizer: a node acts only on what the current assignment ties it
to. The supervisor's directive lists, per other node, the ranks it may store here (this node is
its buddy) and the ranks it may fetch from here (it restores them, or verifies an SDC check on
them); everything else is refused. On top of the grants a store must
- come from the snapshot's owner (the caller is the header's `owner_node_id`),
- never name one of this node's own ranks (its copies are the owner's, not a buddy's),
- belong to the generation this node runs (an older one is refused; a newer one answers
  UNAVAILABLE, which the sender retries: its directive simply arrived first),
- carry a step within `MAX_STEP_LEAD` of what this generation has reached (the highest of the
  directive's committed/restore step and the steps this node's own ranks reported); a step near
  2^64 would otherwise make retention evict every real snapshot of the rank.

Identity: with mTLS the caller's node id is its certificate's (common/tls.py `peer_identity`),
and a claimed id that differs is refused. Without TLS (`--insecure`, a lab) the ids are the
caller's own claims (the header's owner, the fetch request's `node_id`): the rules still stop
accidents, not an attacker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import grpc

from ftsup.v1 import agent_pb2, peer_pb2

MAX_STEP_LEAD = 1024  # steps a buddy copy may be ahead of the progress this node knows of


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a peer request is refused, and the status that says whether retrying can help."""

    code: grpc.StatusCode
    message: str


@dataclass(frozen=True, slots=True)
class Grants:
    """What the current directive lets other nodes do here (empty: nothing)."""

    generation: int = 0
    own_ranks: frozenset[int] = frozenset()
    stores: Mapping[str, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    fetches: Mapping[str, frozenset[int]] = field(default_factory=lambda: MappingProxyType({}))
    step_floor: int = 0  # the committed (retained) or restore step: progress the job surely reached


def grants_of(directive: agent_pb2.Directive) -> Grants:
    stores: dict[str, frozenset[int]] = {}
    fetches: dict[str, frozenset[int]] = {}
    for grant in directive.peer_grants:
        if grant.store_ranks:
            stores[grant.node_id] = stores.get(grant.node_id, frozenset()) | frozenset(grant.store_ranks)
        if grant.fetch_ranks:
            fetches[grant.node_id] = fetches.get(grant.node_id, frozenset()) | frozenset(grant.fetch_ranks)
    restore_step = directive.restore_step if directive.HasField("restore_step") else 0
    own = frozenset(directive.ranks) if directive.action == agent_pb2.ACTION_RUN else frozenset()
    return Grants(directive.generation, own, MappingProxyType(stores), MappingProxyType(fetches),
                  max(directive.retain_from_step, restore_step))


class PeerAuthority:
    """The current grants (replaced by each directive) and the checks made against them."""

    def __init__(self, node_id: str, step_seen: Callable[[], int] = lambda: 0) -> None:
        self._node_id = node_id
        self._step_seen = step_seen  # the highest step this node's own ranks reported
        self.grants = Grants()

    def apply(self, directive: agent_pb2.Directive) -> None:
        """Takes the directive's grants; an older generation's directive (a stale one) changes nothing."""
        if directive.generation >= self.grants.generation:
            self.grants = grants_of(directive)

    def step_ceiling(self) -> int:
        return max(self.grants.step_floor, self._step_seen()) + MAX_STEP_LEAD

    def store_denial(self, caller: str, header: peer_pb2.SnapshotHeader) -> Denial | None:
        """None when `caller` may store the snapshot `header` names here."""
        what = f"snapshot of rank {header.rank} step {header.step} (generation {header.generation})"
        grants = self.grants
        if stale := self._generation_denial(header.generation, what):
            return stale
        if header.generation < grants.generation:
            return Denial(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{what}: generation {header.generation} is over, node {self._node_id} runs {grants.generation}")
        if header.owner_node_id != caller:
            return Denial(grpc.StatusCode.PERMISSION_DENIED,
                          f"{what}: node {caller!r} may store only its own snapshots (the header names owner "
                          f"{header.owner_node_id!r})")
        if header.rank in grants.own_ranks:
            return Denial(grpc.StatusCode.PERMISSION_DENIED,
                          f"{what}: rank {header.rank} is run by node {self._node_id} itself; a peer never replaces it")
        if header.rank not in grants.stores.get(caller, frozenset()):
            return Denial(grpc.StatusCode.PERMISSION_DENIED,
                          f"{what}: node {self._node_id} is not node {caller!r}'s buddy for rank {header.rank} "
                          f"in generation {grants.generation}")
        ceiling = self.step_ceiling()
        if header.step > ceiling:
            return Denial(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{what}: step {header.step} is beyond this generation's progress "
                          f"(at most {ceiling}: {MAX_STEP_LEAD} past the step reached)")
        return None

    def fetch_denial(self, caller: str, request: peer_pb2.FetchSnapshotRequest) -> Denial | None:
        """None when `caller` may fetch the snapshot `request` names from here."""
        what = f"snapshot of rank {request.rank} step {request.step}"
        if stale := self._generation_denial(request.generation, what):
            return stale
        if request.rank not in self.grants.fetches.get(caller, frozenset()):
            return Denial(grpc.StatusCode.PERMISSION_DENIED,
                          f"{what}: node {caller!r} neither restores nor verifies rank {request.rank} from node "
                          f"{self._node_id} in generation {self.grants.generation}")
        return None

    def _generation_denial(self, generation: int, what: str) -> Denial | None:
        if generation > self.grants.generation:  # the caller's directive came first: it retries
            return Denial(grpc.StatusCode.UNAVAILABLE,
                          f"{what}: node {self._node_id} has not applied generation {generation} yet "
                          f"(runs {self.grants.generation})")
        return None
