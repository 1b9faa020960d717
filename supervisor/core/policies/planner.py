"""Elastic planner: which nodes form the next generation, who holds which rank, and where each
rank's state comes from.

Gang semantics: a generation is planned only when every rank can be placed on a healthy node;
otherwise the planner waits and says why. Survivors keep their ranks and a replacement takes a lost
node's ranks whole, so the world and the rank numbers stay the same (bitwise continuity).
Where each rank's state comes from is policies/restore.py's answer (own RAM, buddy's RAM, the
object-store checkpoint: the recovery ladder), fed here with the committed snapshot's copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.config import JobSpec
from supervisor.core.events import GenerationStarted, NodeRole, RankAssignment, RestoreKind
from supervisor.core.policies import restore
from supervisor.core.state import ClusterState, Liveness, NodeRecord, SoftState


@dataclass(frozen=True, slots=True)
class Plan:
    started: GenerationStarted | None
    waiting_reason: str  # empty when a generation was planned


def plan_generation(state: ClusterState, soft: SoftState, job: JobSpec, now: float, spare_grace_s: float) -> Plan:
    """Plans the next generation, or says why not yet.

    Spares stand in for active nodes only after `spare_grace_s` of this supervisor's life, so
    active nodes that are still starting up are not displaced by a spare that answered first.
    """
    if state.completion is not None:
        return Plan(None, "job completed")
    if state.generation is not None:
        return Plan(None, "")
    previous = _previous_members(state)
    suspects = [n for n in previous if _liveness(state, n) is Liveness.SUSPECT]
    if suspects:
        return Plan(None, f"waiting for a verdict on suspect node(s) {', '.join(sorted(suspects))}")
    healthy = [n for n in state.nodes.values() if _is_usable(n, soft)]
    actives = [n for n in healthy if n.role is NodeRole.ACTIVE]
    if len(actives) < job.nodes and now - soft.started_at_s < spare_grace_s:
        return Plan(
            None,
            f"waiting for {job.nodes} active nodes ({len(actives)} ready) before using spares,"
            f" for up to {spare_grace_s:g}s after start",
        )
    if len(healthy) < job.nodes:
        return Plan(
            None,
            f"need {job.nodes} healthy nodes, have {len(healthy)}"
            f" ({len(state.nodes)} registered, {_count_quarantined(state)} quarantined)",
        )
    members = _assign_ranks(state, healthy, job)
    restore_plan = restore.plan_restore(restore_world(state, soft, members))
    restores, restore_step = restore_plan.restores, restore_plan.step
    from_ram = restore_step is not None and any(
        r.kind in (RestoreKind.LOCAL_SNAPSHOT, RestoreKind.PEER_SNAPSHOT) for r in restores
    )
    rank0_node = state.nodes[members[0].node_id]
    number = state.last_generation + 1
    reason = _reason(state, f"restoring {restore_plan.reason}" if restore_step is not None else restore_plan.reason)
    return Plan(
        GenerationStarted(
            generation=number,
            members=members,
            world_size=job.world_size,
            master_addr=rank0_node.host,
            master_port=job.master_port_base + number % job.master_port_span,
            restore_step=restore_step,
            restore_generation=state.snapshot.generation if (state.snapshot and from_ram) else 0,
            restores=restores,
            reason=reason,
            config_hash=job.config_hash,
            code_version=job.code_version,
            data_version=job.data_version,
        ),
        "",
    )


def _liveness(state: ClusterState, node_id: str) -> Liveness | None:
    node = state.node(node_id)
    return node.liveness if node else None


def _previous_members(state: ClusterState) -> list[str]:
    source = state.snapshot.members if state.snapshot else ()
    return [m.node_id for m in source]


def _is_usable(node: NodeRecord, soft: SoftState) -> bool:
    info = soft.nodes.get(node.node_id)
    return (
        node.liveness is Liveness.ALIVE
        and node.is_in_service
        and info is not None
        and info.stream_id is not None
    )


def _count_quarantined(state: ClusterState) -> int:
    return sum(1 for n in state.nodes.values() if n.is_quarantined)


def _assign_ranks(state: ClusterState, healthy: list[NodeRecord], job: JobSpec) -> tuple[RankAssignment, ...]:
    """Survivors of the last layout keep their rank blocks; free blocks go to active nodes, then spares."""
    usable = {n.node_id for n in healthy}
    blocks: dict[int, str | None] = {b: None for b in range(job.nodes)}
    if state.snapshot is not None:
        for member in state.snapshot.members:
            block = min(member.ranks) // job.ranks_per_node
            if member.node_id in usable and block in blocks and len(member.ranks) == job.ranks_per_node:
                blocks[block] = member.node_id
    taken = {n for n in blocks.values() if n is not None}
    previous = {min(m.ranks) // job.ranks_per_node: m.node_id for m in state.snapshot.members} if state.snapshot else {}
    # One candidate order per lost failure domain, walked past taken nodes (`taken` only grows):
    # the same pick as sorting the untaken nodes per block, without a sort per block (quadratic
    # at 12.5k nodes: minutes).
    orders: dict[str, tuple[list[NodeRecord], list[int]]] = {}
    for block in sorted(b for b, n in blocks.items() if n is None):
        lost = state.node(previous.get(block, ""))
        lost_domain = lost.failure_domain if lost is not None else ""
        if lost_domain not in orders:
            # Active nodes before spares, by id (a reproducible layout whatever order they registered
            # in); among spares, another failure domain than the lost node's first (what took it down
            # may take its neighbours), then the spare up longest.
            orders[lost_domain] = (sorted(
                healthy,
                key=lambda n: (n.role is NodeRole.SPARE, bool(lost_domain) and n.failure_domain == lost_domain,
                               n.registered_order if n.role is NodeRole.SPARE else 0, n.node_id),
            ), [0])
        order, cursor = orders[lost_domain]
        while order[cursor[0]].node_id in taken:
            cursor[0] += 1
        blocks[block] = order[cursor[0]].node_id
        taken.add(order[cursor[0]].node_id)
    order = [blocks[b] for b in range(job.nodes)]
    members: list[RankAssignment] = []
    for index, node_id in enumerate(order):
        assert node_id is not None
        ranks = tuple(range(index * job.ranks_per_node, (index + 1) * job.ranks_per_node))
        buddy = order[(index + 1) % len(order)] if len(order) > 1 else ""
        members.append(RankAssignment(node_id=node_id, ranks=ranks, buddy_node_id=buddy or ""))
    return tuple(members)


def restore_world(
    state: ClusterState, soft: SoftState, members: tuple[RankAssignment, ...]
) -> restore.RestoreWorld:
    """The restore planner's input: the committed snapshot's copies (each rank on its node and its
    buddy), the nodes whose RAM can be read, the last committed checkpoint and the SDC taint."""
    snapshot = state.snapshot
    holdings = () if snapshot is None else tuple(
        restore.Holding(node_id, rank, snapshot.step)
        for member in snapshot.members
        for rank in member.ranks
        for node_id in (member.node_id, member.buddy_node_id)
        if node_id and node_id not in snapshot.lost_holders
    )
    return restore.RestoreWorld(
        placement=members,
        holdings=holdings,
        reachable=frozenset(n for n in state.nodes if _holds_ram(state, soft, n)),
        checkpoint_step=state.checkpoint.step if state.checkpoint is not None else None,
        tainted_from_step=state.sdc_tainted_from_step,
        # Nothing left anywhere: start over rather than stall (the reason says what was lost).
        allow_fresh=True,
    )


def _holds_ram(state: ClusterState, soft: SoftState, node_id: str) -> bool:
    """A live, connected agent still has its RAM, even when quarantined (it can serve its copies)."""
    node = state.node(node_id)
    info = soft.nodes.get(node_id)
    return (
        node is not None
        and node.liveness is Liveness.ALIVE
        and info is not None
        and info.stream_id is not None
    )


def _reason(state: ClusterState, where: str) -> str:
    ended = state.last_ended
    if ended is None:
        return f"first generation, {where}"
    culprit = f" ({ended.node_id})" if ended.node_id else ""
    return f"generation {ended.number} ended: {ended.reason.value}{culprit}; {where}"
