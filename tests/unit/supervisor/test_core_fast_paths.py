"""The core's fast paths (issue 9: 12,500 nodes per failure) give exactly the answers of the
straightforward code they replaced, kept here as the reference.

The planner: same members, buddies, restore sources, restore step and reason, over random fleets,
failures, repairs, quarantines, lost holders, checkpoints and SDC taints, generation after
generation (so that the incremental path, which starts from the layout the planner returned
last, is exercised as well as the general one). The failure detector: same verdicts, in order.
The snapshot commit's holding check, the SDC vote's grouping and the vote's evidence (made
when read): same answers."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core import frozen
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.config import DetectorConfig, JobSpec
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationStarted,
    NodeRole,
    QuarantineCause,
    RankAssignment,
    RankRestore,
    RestoreKind,
    SdcRankDigests,
    SnapshotCommitted,
)
from ftsup.supervisor.core.evolve import evolve
from ftsup.supervisor.core.plan_memo import PlanMemo
from ftsup.supervisor.core.policies import failure, planner, restore
from ftsup.supervisor.core.policies.restore import Holding, RestoreWorld, SnapshotCopies
from ftsup.supervisor.core.policies.sdc import SdcConfig, vote_by_rank
from ftsup.supervisor.core.state import (
    ClusterState,
    CommittedCheckpoint,
    Generation,
    Liveness,
    MemberIndex,
    NodeRecord,
    NodeSoft,
    SoftState,
)
from tests.support.reference_detectors import ref_vote_step

# ---- the reference: the planner and restore planner as they were before the fast paths ----


def ref_plan(state: ClusterState, soft: SoftState, job: JobSpec, now: float, spare_grace_s: float) -> planner.Plan:
    if state.completion is not None:
        return planner.Plan(None, "job completed")
    if state.generation is not None:
        return planner.Plan(None, "")
    if len(state.nodes) < job.nodes and (not job.is_elastic or state.last_generation == 0):
        if now - soft.started_at_s < spare_grace_s:
            return planner.Plan(None, f"waiting for {job.nodes} active nodes ({len(state.nodes)} registered) before"
                                      f" using spares, for up to {spare_grace_s:g}s after start")
        return planner.Plan(None, f"need {job.nodes} healthy nodes, {len(state.nodes)} registered so far")
    previous = [m.node_id for m in state.snapshot.members] if state.snapshot else []
    suspects = [n for n in previous if (state.node(n) and state.nodes[n].liveness) is Liveness.SUSPECT]
    if suspects:
        return planner.Plan(None, f"waiting for a verdict on suspect node(s) {', '.join(sorted(suspects))}")
    healthy = [n for n in state.nodes.values() if _usable(n, soft)]
    actives = [n for n in healthy if n.role is NodeRole.ACTIVE]
    if len(actives) < job.nodes and now - soft.started_at_s < spare_grace_s:
        return planner.Plan(None, f"waiting for {job.nodes} active nodes ({len(actives)} ready) before using"
                                  f" spares, for up to {spare_grace_s:g}s after start")
    if len(healthy) < job.nodes:
        quarantined = sum(1 for n in state.nodes.values() if n.is_quarantined)
        return planner.Plan(None, f"need {job.nodes} healthy nodes, have {len(healthy)}"
                                  f" ({len(state.nodes)} registered, {quarantined} quarantined)")
    members = ref_assign(state, healthy, job)
    snapshot = state.snapshot
    holdings = () if snapshot is None else tuple(
        Holding(node_id, rank, snapshot.step)
        for member in snapshot.members for rank in member.ranks
        for node_id in (member.node_id, member.buddy_node_id)
        if node_id and node_id not in snapshot.lost_holders
    )
    reachable = frozenset(n for n, node in state.nodes.items() if node.liveness is Liveness.ALIVE
                          and soft.nodes.get(n) is not None and soft.nodes[n].stream_id is not None)
    world = RestoreWorld(members, holdings, reachable, state.checkpoint.step if state.checkpoint else None,
                         state.sdc_tainted_from_step, True)
    step, restores, reason = ref_plan_restore(world)
    from_ram = step is not None and any(r.kind in (RestoreKind.LOCAL_SNAPSHOT, RestoreKind.PEER_SNAPSHOT)
                                        for r in restores)
    number = state.last_generation + 1
    where = f"restoring {reason}" if step is not None else reason
    ended = state.last_ended
    if ended is None:
        why = f"first generation, {where}"
    else:
        culprit = f" ({ended.node_id})" if ended.node_id else ""
        why = f"generation {ended.number} ended: {ended.reason.value}{culprit}; {where}"
    return planner.Plan(GenerationStarted(
        generation=number, members=members, world_size=job.world_size,
        master_addr=state.nodes[members[0].node_id].host,
        master_port=job.master_port_base + number % job.master_port_span, restore_step=step,
        restore_generation=snapshot.generation if (snapshot and from_ram) else 0, restores=restores,
        reason=why, config_hash=job.config_hash, code_version=job.code_version, data_version=job.data_version,
    ), "")


def _usable(node: NodeRecord, soft: SoftState) -> bool:
    info = soft.nodes.get(node.node_id)
    return node.liveness is Liveness.ALIVE and node.is_in_service and info is not None and info.stream_id is not None


def ref_assign(state: ClusterState, healthy: list[NodeRecord], job: JobSpec) -> tuple[RankAssignment, ...]:
    usable = {n.node_id for n in healthy}
    blocks: dict[int, str | None] = {b: None for b in range(job.nodes)}
    last = state.snapshot.members if state.snapshot is not None else ()
    for member in last:
        block = min(member.ranks) // job.ranks_per_node
        if member.node_id in usable and block in blocks and len(member.ranks) == job.ranks_per_node:
            blocks[block] = member.node_id
    taken = {n for n in blocks.values() if n is not None}
    previous = {min(m.ranks) // job.ranks_per_node: m.node_id for m in last}
    for block in sorted(b for b, n in blocks.items() if n is None):
        lost = state.node(previous.get(block, ""))
        domain = lost.failure_domain if lost is not None else ""
        order = sorted(healthy, key=lambda n: (n.role is NodeRole.SPARE, bool(domain) and n.failure_domain == domain,
                                               n.registered_order if n.role is NodeRole.SPARE else 0, n.node_id))
        pick = next(n.node_id for n in order if n.node_id not in taken)
        blocks[block] = pick
        taken.add(pick)
    order_ids = [blocks[b] for b in range(job.nodes)]
    return tuple(
        RankAssignment(node_id, tuple(range(i * job.ranks_per_node, (i + 1) * job.ranks_per_node)),
                       order_ids[(i + 1) % len(order_ids)] if len(order_ids) > 1 else "")
        for i, node_id in enumerate(order_ids)  # type: ignore[misc]
    )


def ref_plan_restore(world: RestoreWorld) -> tuple[int | None, tuple[RankRestore, ...], str]:
    node_of = {rank: m.node_id for m in world.placement for rank in m.ranks}
    ranks = sorted(node_of)
    by_step: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for h in world.holdings:
        is_tainted = world.tainted_from_step is not None and h.step >= world.tainted_from_step
        if h.node_id in world.reachable and not is_tainted:
            by_step[h.step][h.rank].add(h.node_id)
    held = {s: {r: tuple(sorted(n)) for r, n in rs.items()} for s, rs in by_step.items()}
    checkpoint = world.checkpoint_step
    if checkpoint is not None and world.tainted_from_step is not None and checkpoint >= world.tainted_from_step:
        checkpoint = None
    skipped: list[str] = []
    for step in sorted({*held, *(() if checkpoint is None else (checkpoint,))}, reverse=True):
        holders = held.get(step, {})
        missing = [r for r in ranks if not holders.get(r) and step != checkpoint]
        if missing:
            skipped.append(f"step {step} lacks rank(s) {_text(missing)}")
            continue
        restores = []
        for rank in ranks:
            hs = holders.get(rank, ())
            if node_of[rank] in hs:
                restores.append(RankRestore(rank, RestoreKind.LOCAL_SNAPSHOT, node_of[rank]))
            elif hs:
                restores.append(RankRestore(rank, RestoreKind.PEER_SNAPSHOT, hs[0]))
            else:
                restores.append(RankRestore(rank, RestoreKind.CHECKPOINT, ""))
        return step, tuple(restores), _ref_reason(step, restores, skipped)
    return None, tuple(RankRestore(r, RestoreKind.FRESH, "") for r in ranks), "starting from step 0: " + \
        _ref_why(world, ranks, checkpoint, skipped)


def _ref_reason(step: int, restores: list[RankRestore], skipped: list[str]) -> str:
    by_kind: dict[RestoreKind, list[int]] = defaultdict(list)
    peers = sorted({r.source_node_id for r in restores if r.kind is RestoreKind.PEER_SNAPSHOT})
    for r in restores:
        by_kind[r.kind].append(r.rank)
    parts = []
    if by_kind[RestoreKind.LOCAL_SNAPSHOT]:
        parts.append(f"rank(s) {_text(by_kind[RestoreKind.LOCAL_SNAPSHOT])} from their own node's RAM")
    if by_kind[RestoreKind.PEER_SNAPSHOT]:
        parts.append(f"rank(s) {_text(by_kind[RestoreKind.PEER_SNAPSHOT])} from a peer's RAM ({', '.join(peers)})")
    if by_kind[RestoreKind.CHECKPOINT]:
        parts.append(f"rank(s) {_text(by_kind[RestoreKind.CHECKPOINT])} from the object-store checkpoint")
    text = f"step {step}: " + "; ".join(parts)
    if skipped:
        text += f" (newer: {'; '.join(skipped[:3])}{'; ...' if len(skipped) > 3 else ''})"
    return text


def _ref_why(world: RestoreWorld, ranks: list[int], checkpoint: int | None, skipped: list[str]) -> str:
    holdings = list(world.holdings)
    if not holdings and world.checkpoint_step is None:
        return "no RAM snapshot or checkpoint exists yet"
    lost: dict[int, set[str]] = defaultdict(set)
    for h in holdings:
        lost[h.rank].add(h.node_id)
    gone = [r for r in ranks if not (lost[r] & world.reachable)]
    if gone:
        holders = sorted({n for r in gone for n in lost[r]})
        where = f" (held only by {', '.join(holders)}, unreachable)" if holders else " (never held)"
        text = f"every RAM copy of rank(s) {_text(gone)} is gone{where}"
    elif skipped:
        text = "no step is held for every rank: " + "; ".join(skipped[:3])
    else:
        text = "no RAM snapshot is held"
    if world.tainted_from_step is not None:
        text += f"; steps from {world.tainted_from_step} on are SDC-tainted"
    if checkpoint is None and world.checkpoint_step is not None:
        text += f"; the checkpoint at step {world.checkpoint_step} is tainted"
    return text


def _text(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    runs, start = [], 0
    for i, r in enumerate(ordered):
        if i == 0 or r != ordered[i - 1] + 1:
            if i:
                runs.append(f"{start}-{ordered[i - 1]}" if ordered[i - 1] > start else str(start))
            start = r
    if ordered:
        runs.append(f"{start}-{ordered[-1]}" if ordered[-1] > start else str(start))
    return ", ".join(runs)


# ---- random fleets and what happens to them between generations ----

DOMAINS = ("", "rack-a", "rack-b")
node_change = st.sampled_from(["dead", "dead", "dead", "quarantined", "drained", "disconnected", "suspect",
                               "lost_holder", "back", "back"])


@st.composite
def fleets(draw: st.DrawFn) -> tuple[JobSpec, ClusterState, SoftState]:
    job_nodes = draw(st.integers(1, 6))
    rpn = draw(st.integers(1, 3))
    spares = draw(st.integers(0, 6))
    extra_actives = draw(st.integers(0, 2))
    ids = [(f"n{i}", NodeRole.ACTIVE) for i in range(job_nodes + extra_actives)]
    ids += [(f"s{i}", NodeRole.SPARE) for i in range(spares)]
    order = draw(st.permutations(range(1, len(ids) + 1)))
    records = {
        node_id: NodeRecord(node_id, 1, role, "h", 9000, 8, failure_domain=draw(st.sampled_from(DOMAINS)),
                            registered_order=order[i])
        for i, (node_id, role) in enumerate(ids)
    }
    state = ClusterState(nodes=MappingProxyType(records), registrations=len(ids))
    soft = SoftState(started_at_s=0.0, nodes={n: NodeSoft(0.0, i + 1, 1) for i, n in enumerate(records)})
    return JobSpec(name="eq", nodes=job_nodes, ranks_per_node=rpn, argv=("t",)), state, soft


def _change(state: ClusterState, soft: SoftState, node_id: str, how: str) -> ClusterState:
    node = state.nodes[node_id]
    if how == "dead":
        node = frozen.replace(node, liveness=Liveness.DEAD)
    elif how == "quarantined":
        node = frozen.replace(node, is_quarantined=True, quarantine_reason="x")
    elif how == "drained":
        node = frozen.replace(node, is_drained=True)
    elif how == "suspect":
        node = frozen.replace(node, liveness=Liveness.SUSPECT)
    elif how == "disconnected":
        soft.nodes[node_id].stream_id = None
    elif how == "back":  # repaired: alive, in service, connected again, a spare
        node = frozen.replace(node, liveness=Liveness.ALIVE, is_quarantined=False, is_drained=False,
                              quarantine_reason="", role=NodeRole.SPARE, registered_order=state.registrations + 1)
        state = frozen.replace(state, registrations=state.registrations + 1)
        soft.nodes[node_id].stream_id = 99
    elif how == "lost_holder" and state.snapshot is not None:
        lost = tuple(sorted({*state.snapshot.lost_holders, node_id}))
        state = frozen.replace(state, snapshot=frozen.replace(state.snapshot, lost_holders=lost))
    return frozen.replace(state, nodes=MappingProxyType({**state.nodes, node_id: node}))


@settings(max_examples=400, deadline=None)
@given(fleets(), st.lists(st.tuples(
    st.booleans(),  # commit a snapshot in the generation
    st.lists(st.tuples(st.integers(0, 20), node_change), max_size=4),
    st.sampled_from([None, "old", "same", "newer"]),  # the committed checkpoint against the snapshot
    st.sampled_from([None, "before", "at"]),  # an SDC taint
    st.booleans(),  # forget the memos first (the general path)
), min_size=1, max_size=6))
def test_plans_equal_the_reference_planners_generation_after_generation(fleet, rounds):
    job, state, soft = fleet
    step = 0
    for commit, changes, checkpoint, taint, forget in rounds:
        if forget:
            soft.plan_memo = PlanMemo()
        plan = planner.plan_generation(state, soft, job, 100.0, 0.0)
        assert plan == ref_plan(state, soft, job, 100.0, 0.0)
        if plan.started is None:
            return
        state = evolve(state, plan.started)  # the planner's own objects: its next plan may start from them
        step += 10
        if commit:
            state = evolve(state, SnapshotCommitted(state.last_generation, step))
        state = evolve(state, GenerationEnded(state.last_generation, EndReason.NODE_LOST, "", step, ""))
        ids = list(state.nodes)
        for pick, how in changes:
            state = _change(state, soft, ids[pick % len(ids)], how)
        snapshot_step = state.snapshot.step if state.snapshot else step
        if checkpoint is not None:
            at = {"old": snapshot_step - 5, "same": snapshot_step, "newer": snapshot_step + 5}[checkpoint]
            state = frozen.replace(state, checkpoint=CommittedCheckpoint("c", max(at, 1), "k"))
        if taint is not None:
            state = frozen.replace(state, sdc_tainted_from_step=snapshot_step - (0 if taint == "at" else 3))


def test_snapshot_copies_iterate_as_the_holdings_they_stand_for():
    members = (RankAssignment("a", (0, 1), "b"), RankAssignment("b", (2, 3), "a"))
    copies = SnapshotCopies(7, members, frozenset({"b"}))
    assert list(copies) == [Holding("a", 0, 7), Holding("a", 1, 7), Holding("a", 2, 7), Holding("a", 3, 7)]
    assert copies and not SnapshotCopies(7, (RankAssignment("b", (0,), ""),), frozenset({"b"}))


def ref_judge(state: ClusterState, soft: SoftState, config: DetectorConfig, now: float) -> list[failure.Verdict]:
    verdicts = []
    for node in state.nodes.values():
        if node.liveness is Liveness.DEAD:
            continue
        info = soft.nodes.get(node.node_id)
        last_heard = max(info.last_heard_s if info is not None else soft.started_at_s, soft.started_at_s)
        silent_for = now - last_heard
        if info is None:
            if silent_for >= config.dead_after_s:
                verdicts.append(failure.Verdict(node.node_id, Liveness.DEAD,
                                                f"{failure.NEVER_HEARD} {config.dead_after_s:g}s", silent_for,
                                                QuarantineCause.DEAD_NEVER_HEARD))
            continue
        limit = f"no heartbeat for {silent_for:.1f}s (limit {config.dead_after_s:g}s)"
        if info.stream_id is None:
            closed_at = max(info.disconnected_at_s or soft.started_at_s, soft.started_at_s)
            if now - closed_at >= config.reconnect_grace_s:
                reason = f"{failure.STREAM_LOSS} within {config.reconnect_grace_s:g}s"
                verdicts.append(failure.Verdict(node.node_id, Liveness.DEAD, reason, silent_for,
                                                QuarantineCause.DEAD_STREAM_LOSS))
            elif silent_for >= config.dead_after_s:
                verdicts.append(failure.Verdict(node.node_id, Liveness.DEAD, limit, silent_for,
                                                QuarantineCause.DEAD_SILENT))
            elif node.liveness is Liveness.ALIVE:
                verdicts.append(failure.Verdict(node.node_id, Liveness.SUSPECT, "stream closed", silent_for))
            continue
        if silent_for >= config.dead_after_s:
            verdicts.append(failure.Verdict(node.node_id, Liveness.DEAD, limit, silent_for,
                                            QuarantineCause.DEAD_SILENT))
        elif silent_for >= 1.5 * config.heartbeat_interval_s and node.liveness is Liveness.ALIVE:
            verdicts.append(failure.Verdict(node.node_id, Liveness.SUSPECT, "heartbeat overdue", silent_for))
        elif silent_for < config.heartbeat_interval_s * 1.5 and node.liveness is Liveness.SUSPECT:
            verdicts.append(failure.Verdict(node.node_id, Liveness.ALIVE, "heard from again", silent_for))
    return verdicts


times = st.sampled_from([0.0, 3.0, 7.0, 9.0, 9.5, 10.0, 10.5, 11.0, float("nan")])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Liveness)), st.booleans(), times, st.sampled_from([None, 1, 2]),
                          st.sampled_from([None, 0.0, 8.0, 9.9])), min_size=1, max_size=6),
       st.sampled_from([0.5, 1.0, 2.0]), st.integers(1, 3), st.sampled_from([0.4, 1.0]),
       st.sampled_from([0.0, 5.0, 10.0]), st.sampled_from([10.0, 10.6, 11.0, 12.0, 15.0]))
def test_the_detector_gives_the_reference_verdicts_in_order(nodes, interval, misses, grace, started, now):
    records, soft = {}, SoftState(started_at_s=started)
    for i, (liveness, is_heard, heard_s, stream, closed_s) in enumerate(nodes):
        records[f"n{i}"] = NodeRecord(f"n{i}", 1, NodeRole.ACTIVE, "h", 9000, 8, liveness=liveness)
        if is_heard:
            soft.nodes[f"n{i}"] = NodeSoft(heard_s, stream, 1, closed_s)
    state = ClusterState(nodes=MappingProxyType(records))
    config = DetectorConfig(heartbeat_interval_s=interval, heartbeat_misses=misses, reconnect_grace_s=grace)
    assert repr(failure.judge(state, soft, config, now)) == repr(ref_judge(state, soft, config, now))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "", "a", "b"]),
                          st.sampled_from(["a", "b", "c", "", "b", "c"]), st.integers(0, 2)), min_size=1, max_size=4),
       st.dictionaries(st.integers(0, 8), st.frozensets(st.sampled_from(["a", "b", "c", "d"]))))
def test_the_commit_holding_check_equals_the_plain_loop(layout, held):
    members, rank = [], 0
    for node, buddy, width in layout:
        members.append(RankAssignment(node, tuple(range(rank, rank + width)), buddy))
        rank += width
    expected = all({m.node_id, m.buddy_node_id} - {""} <= held.get(r, frozenset()) for m in members for r in m.ranks)
    assert soft_state.is_held_twice(held, MemberIndex(tuple(members))) is expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "", "a"]), st.sampled_from(["a", "b", "c", ""]),
                          st.lists(st.integers(0, 6), max_size=3)), min_size=1, max_size=4))
def test_the_ranks_a_node_may_hold_are_those_whose_holders_name_it(layout):
    # `holdable` (node -> ranks, what admission checks a node's holdings against) is `may_hold`
    # (rank -> owner and buddy) turned around, whether each node and rank is listed once (the
    # per-member build) or some twice (the rank-by-rank one).
    index = MemberIndex(tuple(RankAssignment(node, tuple(ranks), buddy) for node, buddy, ranks in layout))
    expected: dict[str, set[int]] = {}
    for rank, holders in index.may_hold().items():
        for holder in holders:
            expected.setdefault(holder, set()).add(rank)
    assert {node: set(ranks) for node, ranks in index.holdable().items() if ranks} == expected


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 7), st.sampled_from(["", "x", "y", "z"]), min_size=1), st.integers(1, 3),
       st.integers(0, 2))
def test_the_sdc_vote_equals_the_reference_vote(digests, model_parallel, missing):
    config = SdcConfig(model_parallel_size=model_parallel)
    world = len(digests) + missing
    assert vote_by_rank(5, digests, world, config) == ref_vote_step(5, digests, world, config)


def test_vote_reports_are_the_records_of_every_rank_made_when_read():
    members = (RankAssignment("a", (0, 1), "b"), RankAssignment("b", (2,), "a"))
    generation = Generation(1, members, 3, "h", 1, None, 0, ())
    digests, grads = {2: "p2", 0: "p0", 1: "p1"}, {0: "g0", 2: "g2"}
    eager = tuple(SdcRankDigests(r, generation.node_of_rank(r) or "", grads.get(r, ""), d)
                  for r, d in sorted(digests.items()))
    lazy = soft_state.VoteReports.of_dicts(digests, grads, generation)
    assert lazy == eager and eager == lazy and tuple(lazy) == eager and len(lazy) == 3
    assert lazy[1] == SdcRankDigests(1, "a", "", "p1") and lazy[-1] == eager[-1] and lazy[:2] == eager[:2]
    assert [d for d in lazy if d.rank in {2}] == [SdcRankDigests(2, "b", "g2", "p2")]
    assert repr(lazy) == repr(eager) and hash(lazy) == hash(eager)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 5), st.integers(1, 2), st.data())
def test_the_restore_planners_fast_path_equals_its_general_path(count, width, data):
    # The snapshot's layout is a ring of blocks; the placement replaces some nodes by spares.
    nodes = [f"n{i}" for i in range(count)]
    members = tuple(RankAssignment(nodes[i], tuple(range(i * width, (i + 1) * width)),
                                   nodes[(i + 1) % count] if count > 1 else "") for i in range(count))
    replaced = data.draw(st.sets(st.integers(0, count - 1)))
    placement = tuple(
        RankAssignment(f"s{i}", m.ranks, m.buddy_node_id) if i in replaced else m for i, m in enumerate(members)
    )
    everyone = {*nodes, *(f"s{i}" for i in range(count))}
    reachable = frozenset(data.draw(st.sets(st.sampled_from(sorted(everyone)))))
    lost = frozenset(data.draw(st.sets(st.sampled_from(nodes))))
    step = 10
    checkpoint = data.draw(st.sampled_from([None, 5, 10, 15]))
    tainted = data.draw(st.sampled_from([None, 8, 10, 12]))
    replicated = data.draw(st.booleans())
    copies = SnapshotCopies(step, members, lost)
    fast = restore.plan_restore(RestoreWorld(placement, copies, reachable, checkpoint, tainted, True, replicated))
    general = restore.plan_restore(RestoreWorld(placement, tuple(copies), reachable, checkpoint, tainted, True,
                                                replicated))
    assert fast == general
