"""Elastic planner: which nodes form the next generation, who holds which rank, and where each
rank's state comes from.

Gang semantics: a generation is planned only when every rank can be placed on a healthy node;
otherwise the planner waits and says why. Survivors keep their ranks and a replacement takes a lost
node's ranks whole, so the world and the rank numbers stay the same (bitwise continuity). An
elastic job (`min_nodes`) short of nodes runs on fewer instead (`JobSpec.shrunk_nodes`): ranks
0..k*rpn-1 on k nodes, survivors first; every rank of such a job holds the same state, so a rank
with no snapshot of its own restores another rank's (`restore_world(replicated=...)`).
Where each rank's state comes from is policies/restore.py's answer (own RAM, buddy's RAM, the
object-store checkpoint: the recovery ladder), fed here with the committed snapshot's copies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter, ne, or_
from typing import cast

from ftsup.supervisor.core.config import JobSpec
from ftsup.supervisor.core.events import GenerationStarted, NodeRole, RankAssignment, RestoreKind
from ftsup.supervisor.core.plan_memo import Layouts, Shape
from ftsup.supervisor.core.policies import restore
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeRecord, SoftState, is_usable


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
    if state.failed is not None:
        return Plan(None, "job failed: restart budget spent")
    if state.generation is not None:
        return Plan(None, "")
    if len(state.nodes) < job.nodes and (not job.is_elastic or state.last_generation == 0):
        # Too few registered to plan at all: said without a pass over the fleet, so a fleet of
        # 12,500 registering does not cost a survey per Hello (quadratic in the fleet).
        if now - soft.started_at_s < spare_grace_s:
            return Plan(None, f"waiting for {job.nodes} active nodes ({len(state.nodes)} registered) before"
                              f" using spares, for up to {spare_grace_s:g}s after start")
        return Plan(None, f"need {job.nodes} healthy nodes, {len(state.nodes)} registered so far")
    fleet = _survey(state, soft)
    if fleet.suspects:
        suspects = [n for n in _previous_members(state) if n in fleet.suspects]
        if suspects:
            return Plan(None, f"waiting for a verdict on suspect node(s) {', '.join(sorted(suspects))}")
    healthy = fleet.healthy
    if now - soft.started_at_s < spare_grace_s:
        actives = sum(1 for n in healthy if n.role is NodeRole.ACTIVE)
        if actives < job.nodes:
            return Plan(
                None,
                f"waiting for {job.nodes} active nodes ({actives} ready) before using spares,"
                f" for up to {spare_grace_s:g}s after start",
            )
    full = job
    if len(healthy) < job.nodes:
        # The first generation waits for the whole world: a node still booting is no failure.
        shrunk = job.shrunk_nodes(len(healthy)) if state.last_generation > 0 else None
        if shrunk is None:
            allowed = f" (elastic down to {job.min_nodes}, a divisor of {job.nodes})" if job.is_elastic else ""
            return Plan(
                None,
                f"need {job.nodes} healthy nodes{allowed}, have {len(healthy)}"
                f" ({len(state.nodes)} registered, {_count_quarantined(state)} quarantined)",
            )
        job = dataclasses.replace(job, nodes=shrunk)
    members = _assign_ranks(state, soft, fleet, job)
    restore_plan = restore.plan_restore(restore_world(state, soft, members, unreadable=fleet.unreadable,
                                                      replicated=full.is_elastic), soft.plan_memo)
    restores, restore_step = restore_plan.restores, restore_plan.step
    from_ram = restore_step is not None and any(
        r.kind in (RestoreKind.LOCAL_SNAPSHOT, RestoreKind.PEER_SNAPSHOT) for r in restores
    )
    rank0_node = state.nodes[members[0].node_id]
    number = state.last_generation + 1
    reason = _reason(state, f"restoring {restore_plan.reason}" if restore_step is not None else restore_plan.reason)
    if job.nodes < full.nodes:
        reason += (f"; shrunk to {job.nodes} of {full.nodes} nodes (no spare): each rank accumulates"
                   f" {full.nodes // job.nodes} micro-batches, the global batch is unchanged")
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
            config_hash=full.config_hash,
            code_version=job.code_version,
            data_version=job.data_version,
        ),
        "",
    )


def grow_to(state: ClusterState, soft: SoftState, job: JobSpec) -> int | None:
    """Nodes a shrunk elastic generation could run on now, when more than it has (None: stay).
    Grown only from a snapshot committed in this generation: the restore then loses at most the
    steps since it, as after a failure."""
    generation, snapshot = state.generation, state.snapshot
    if not job.is_elastic or generation is None or not generation.is_running:
        return None
    if generation.world_size >= job.world_size or snapshot is None or snapshot.generation != generation.number:
        return None
    if len(state.nodes) <= len(generation.members):
        return None  # no node outside the generation at all: nothing to grow onto (no fleet pass)
    healthy = len(_survey(state, soft).healthy)
    target = job.nodes if healthy >= job.nodes else job.shrunk_nodes(healthy)
    if target is None or target * job.ranks_per_node <= generation.world_size:
        return None
    return target


@dataclass(frozen=True, slots=True)
class _Fleet:
    healthy: list[NodeRecord]  # alive, connected, in service: may hold ranks (registration order)
    unusable: list[str]  # every other node
    unreadable: list[str]  # RAM cannot be read: not alive, or no open stream (a subset of unusable)
    suspects: frozenset[str]


def _survey(state: ClusterState, soft: SoftState) -> _Fleet:
    """The fleet as a plan sees it: the last survey while neither the node map (persistent: a new
    map on any change of a record) nor which nodes have a stream open changed, else a new one."""
    memo = soft.plan_memo
    kept = memo.survey
    if kept is not None and kept[0] is state.nodes and kept[1] == soft.links:
        return cast(_Fleet, kept[2])
    fleet = _survey_anew(state, soft)
    memo.survey = (state.nodes, soft.links, fleet)
    return fleet


def _survey_anew(state: ClusterState, soft: SoftState) -> _Fleet:
    """The one pass over every node a plan needs (12,500 at 100k GPUs: keep it to one)."""
    healthy: list[NodeRecord] = []
    unusable: list[str] = []
    unreadable: list[str] = []
    suspects: list[str] = []
    alive, infos = Liveness.ALIVE, soft.nodes
    for node_id, node in state.nodes.items():
        info = infos.get(node_id)
        if node.liveness is alive and info is not None and info.stream_id is not None:
            if not (node.is_quarantined or node.is_drained):  # state.is_usable, inlined: the hot loop
                healthy.append(node)
                continue
        else:
            unreadable.append(node_id)
            if node.liveness is Liveness.SUSPECT:
                suspects.append(node_id)
        unusable.append(node_id)
    return _Fleet(healthy, unusable, unreadable, frozenset(suspects))


def _previous_members(state: ClusterState) -> list[str]:
    source = state.snapshot.members if state.snapshot else ()
    return [m.node_id for m in source]


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


def _count_quarantined(state: ClusterState) -> int:
    return sum(1 for n in state.nodes.values() if n.is_quarantined)


def _assign_ranks(state: ClusterState, soft: SoftState, fleet: _Fleet, job: JobSpec) -> tuple[RankAssignment, ...]:
    """Survivors of the last layout keep their rank blocks; free blocks go to active nodes, then spares."""
    last = state.snapshot.members if state.snapshot is not None else ()
    known = soft.plan_memo.layouts.get(last, _shape(job))
    if known is not None:
        return _replace_lost(state, soft, fleet, job, last, known)
    return _lay_out(state, fleet.healthy, job, last, soft.plan_memo.layouts)


def _lay_out(state: ClusterState, healthy: list[NodeRecord], job: JobSpec,
             last: tuple[RankAssignment, ...], layouts: Layouts) -> tuple[RankAssignment, ...]:
    """The general case, from any last layout (or none): every block is looked at."""
    if not last:  # every block is free: the head of one candidate order
        nodes = _candidate_order(healthy, "")[:job.nodes]
        buddies = nodes[1:] + nodes[:1] if len(nodes) > 1 else [""]
        members = _shared_members(nodes, layouts.block_ranks(_shape(job)), buddies, layouts)
        layouts.remember(members, _shape(job))
        return members
    usable = {n.node_id for n in healthy}
    blocks: dict[int, str | None] = {b: None for b in range(job.nodes)}
    for member in last:
        block = min(member.ranks) // job.ranks_per_node
        if member.node_id in usable and block in blocks and len(member.ranks) == job.ranks_per_node:
            blocks[block] = member.node_id
    taken = {n for n in blocks.values() if n is not None}
    previous = {min(m.ranks) // job.ranks_per_node: m.node_id for m in last}
    free = [b for b, n in blocks.items() if n is None]
    pool = [n for n in healthy if n.node_id not in taken] if free else []
    blocks.update(_pick(state, pool, free, previous, taken))
    nodes = cast(list[str], list(blocks.values()))  # blocks 0.. in order, every one now held
    buddies = nodes[1:] + nodes[:1] if len(nodes) > 1 else [""]
    members = _shared_members(nodes, layouts.block_ranks(_shape(job)), buddies, layouts)
    layouts.remember(members, _shape(job))
    return members


def _replace_lost(state: ClusterState, soft: SoftState, fleet: _Fleet, job: JobSpec,
                  last: tuple[RankAssignment, ...], block_of: dict[str, int]) -> tuple[RankAssignment, ...]:
    """The common case, in time proportional to what changed: `last` is a layout this planner
    returned for `job` (block b: ranks b*rpn.., distinct nodes; `block_of` indexes it), so the
    free blocks are those of unusable nodes, and only they and their ring predecessors (whose
    buddy changes) get new assignments. The same answer as `_lay_out`."""
    free = sorted(block_of[n] for n in fleet.unusable if n in block_of)
    if not free:
        return last
    outside = state.nodes.keys() - block_of.keys()  # the nodes holding no block: spares, mostly
    pool = [state.nodes[n] for n in outside if is_usable(state.nodes[n], soft)]
    picks = _pick(state, pool, free, {block: last[block].node_id for block in free}, set())
    count = len(last)

    def node_at(block: int) -> str:
        return picks.get(block) or last[block].node_id

    members = list(last)
    for block in sorted({*free, *((b - 1) % count for b in free)}):
        buddy = node_at((block + 1) % count) if count > 1 else ""
        members[block] = RankAssignment(node_id=node_at(block), ranks=last[block].ranks, buddy_node_id=buddy)
    out = tuple(members)
    index = block_of.copy()
    for block, node_id in picks.items():
        del index[last[block].node_id]
        index[node_id] = block
    soft.plan_memo.layouts.remember(out, _shape(job), index)
    return out


def _pick(state: ClusterState, pool: list[NodeRecord], free: list[int], previous: dict[int, str],
          taken: set[str]) -> dict[int, str]:
    """A node from `pool` for each free block (`previous`: the node that held it last); `taken`
    grows with the picks.

    One candidate order per lost failure domain, walked past taken nodes: the same pick as
    sorting the untaken nodes per block, without a sort per block (quadratic at 12.5k nodes)."""
    if previous:
        domain_of = {lost: _domain(state, lost) for lost in {previous.get(block, "") for block in free}}
        domains = [domain_of[previous.get(block, "")] for block in free]
    else:
        domains = [""] * len(free)
    picks: dict[int, str] = {}
    if len(set(domains)) == 1:  # one order to walk (no last layout, or one lost domain): its head
        picks = dict(zip(free, _candidate_order(pool, domains[0])))
        taken.update(picks.values())
        return picks
    orders: dict[str, tuple[list[str], list[int]]] = {}
    for block, lost_domain in zip(free, domains):
        if lost_domain not in orders:
            orders[lost_domain] = (_candidate_order(pool, lost_domain), [0])
        order, cursor = orders[lost_domain]
        while order[cursor[0]] in taken:
            cursor[0] += 1
        picks[block] = order[cursor[0]]
        taken.add(order[cursor[0]])
    return picks


def _domain(state: ClusterState, node_id: str) -> str:
    node = state.node(node_id)
    return node.failure_domain if node is not None else ""


def _candidate_order(pool: list[NodeRecord], lost_domain: str) -> list[str]:
    """Active nodes before spares, by id (a reproducible layout whatever order they registered
    in); among spares, another failure domain than the lost node's first (what took it down may
    take its neighbours), then the spare up longest. That is sorting by (is spare, is in the
    lost domain, spare's registered_order, node id), done per partition (ids sort in C)."""
    spare = NodeRole.SPARE
    groups = [pool] if not lost_domain else [
        [n for n in pool if n.failure_domain != lost_domain], [n for n in pool if n.failure_domain == lost_domain]
    ]
    actives = [sorted([n.node_id for n in group if n.role is not spare]) for group in groups]
    spares = [sorted([(n.registered_order, n.node_id) for n in group if n.role is spare]) for group in groups]
    return [*chain.from_iterable(actives), *(node_id for group in spares for _, node_id in group)]


def _shape(job: JobSpec) -> Shape:
    return (job.nodes, job.ranks_per_node)


def _shared_members(nodes: list[str], ranks: list[tuple[int, ...]], buddies: list[str],
                    layouts: Layouts) -> tuple[RankAssignment, ...]:
    """The layout, sharing the latest layout's RankAssignment objects where equal (building 12,500
    costs ~6 ms; with no last layout every block after a lost node moves, so half change)."""
    latest = layouts.latest
    if len(latest) != len(nodes):
        return tuple(map(RankAssignment, nodes, ranks, buddies))
    changed = map(or_, map(ne, map(attrgetter("node_id"), latest), nodes),
                  map(ne, map(attrgetter("buddy_node_id"), latest), buddies))
    if ranks is not layouts.latest_block_ranks():  # (the latest has these ranks: no compare)
        changed = map(or_, changed, map(ne, map(attrgetter("ranks"), latest), ranks))
    out = list(latest)
    for index in compress(range(len(nodes)), changed):
        out[index] = RankAssignment(nodes[index], ranks[index], buddies[index])
    return tuple(out)


def restore_world(
    state: ClusterState, soft: SoftState, members: tuple[RankAssignment, ...], *, unreadable: list[str] | None = None,
    replicated: bool = False,
) -> restore.RestoreWorld:
    """The restore planner's input: the committed snapshot's copies (each rank on its node and its
    buddy), the nodes whose RAM can be read, the last committed checkpoint and the SDC taint.
    `unreadable`: the nodes whose RAM cannot be read, when the caller already knows them.
    `replicated`: every rank holds the same state (an elastic job), so any rank's copy will do."""
    snapshot = state.snapshot
    holdings: tuple[restore.Holding, ...] | restore.SnapshotCopies = () if snapshot is None else (
        restore.SnapshotCopies(snapshot.step, snapshot.members, frozenset(snapshot.lost_holders))
    )
    if snapshot is None:
        reachable: frozenset[str] = frozenset()  # read only against holdings, and there are none
    else:
        if unreadable is None:
            unreadable = [n for n in state.nodes if not _holds_ram(state, soft, n)]
        reachable = frozenset(state.nodes).difference(unreadable)
    return restore.RestoreWorld(
        placement=members,
        holdings=holdings,
        reachable=reachable,
        checkpoint_step=state.checkpoint.step if state.checkpoint is not None else None,
        tainted_from_step=state.sdc_tainted_from_step,
        # Nothing left anywhere: start over rather than stall (the reason says what was lost).
        allow_fresh=True,
        replicated=replicated,
    )


def _reason(state: ClusterState, where: str) -> str:
    ended = state.last_ended
    if ended is None:
        return f"first generation, {where}"
    culprit = f" ({ended.node_id})" if ended.node_id else ""
    return f"generation {ended.number} ended: {ended.reason.value}{culprit}; {where}"
