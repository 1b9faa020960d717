"""What each node should be doing: a projection of the cluster state, never stored.

A new leader recomputes directives instead of remembering what was sent; agents apply them
idempotently (keyed by generation), so sending the same directive twice is harmless.
"""

from __future__ import annotations

import enum
from collections import ChainMap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ftsup.supervisor.core.config import JobSpec
from ftsup.supervisor.core.events import RankAssignment, RankRestore, RestoreKind
from ftsup.supervisor.core.state import ClusterState, Generation


class Action(enum.Enum):
    STANDBY = "standby"
    RUN = "run"


class StandbyCause(enum.Enum):
    """Why a node stands by, for agents to branch on (`Directive.reason` says it in words).
    The first four stop any trainer parked for a rejoin; the others keep parked trainers."""

    UNSPECIFIED = "unspecified"  # a RUN directive (or one from a supervisor that predates causes)
    JOB_COMPLETED = "job_completed"
    JOB_FAILED = "job_failed"  # the restart budget is spent
    QUARANTINED = "quarantined"
    DRAINED = "drained"
    SPARE = "spare"  # a generation runs without this node
    WAITING = "waiting"  # no generation runs: the planner waits (the reason says for what)

    @property
    def is_final(self) -> bool:
        """Trainers on this node stop for good: none of them may wait to rejoin."""
        return self in (StandbyCause.JOB_COMPLETED, StandbyCause.JOB_FAILED, StandbyCause.QUARANTINED,
                        StandbyCause.DRAINED)


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class RestoreFrom:
    rank: int
    kind: RestoreKind
    source_node_id: str
    source_address: str
    source_rank: int | None = None  # another rank's snapshot (elastic resize), None: its own


@dataclass(frozen=True, slots=True)
class SdcSnapshotSource:
    node_id: str
    address: str


@dataclass(frozen=True, slots=True)
class SdcCheckOrder:
    """A recompute this node runs as a check's verifier (proto SdcCheckOrder)."""

    check_id: str
    generation: int
    step: int
    rank: int
    world_size: int
    replay_ranks: tuple[int, ...]
    sources: tuple[SdcSnapshotSource, ...]
    argv: tuple[str, ...]
    env: tuple[EnvVar, ...]


@dataclass(frozen=True, slots=True)
class PeerGrant:
    """What node `node_id` may do on the directed node's peer service (the node authorizer's
    input): store copies of `store_ranks` (the directed node is its buddy), fetch `fetch_ranks`
    (it restores them, or verifies an SDC check on them, from the directed node's copies)."""

    node_id: str
    store_ranks: tuple[int, ...] = ()
    fetch_ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Directive:
    generation: int
    action: Action
    ranks: tuple[int, ...] = ()
    world_size: int = 0
    master_addr: str = ""
    master_port: int = 0
    argv: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    restore_step: int | None = None
    restores: tuple[RestoreFrom, ...] = ()
    buddy_node_id: str = ""
    buddy_address: str = ""
    retain_from_step: int = 0
    reason: str = ""  # for people; machines branch on `standby_cause`
    checkpoint_steps: tuple[int, ...] = ()
    sdc_checks: tuple[SdcCheckOrder, ...] = ()
    # torchrun's contract (issue 13): where and how ranks run, and the restart budget they see.
    cwd: str = ""
    stop_grace_s: float = 0.0
    restart_count: int = 0
    max_restarts: int = -1  # -1: unlimited
    job_name: str = ""
    peer_grants: tuple[PeerGrant, ...] = ()
    standby_cause: StandbyCause = StandbyCause.UNSPECIFIED


Grants = dict[str, dict[str, set[int]]]  # node -> other node -> ranks


@dataclass(frozen=True, slots=True)
class _GenerationPlan:
    """What every directive of a generation reads of its members and restores, worked out once
    per generation (kept on it: `Generation._directing`): the restores by rank, and the grants
    its buddies and peer restores give. A push to one node (a Hello, a verdict's neighbours) no
    longer walks a 100,000-rank generation (at 12,500 nodes that was 0.28 s of the leader's loop
    per push, several a second while nodes move; `ftsup bench directive-push`)."""

    members: tuple[RankAssignment, ...]
    restores: tuple[RankRestore, ...]
    restores_by_rank: Mapping[int, list[RankRestore]]
    stores: Grants
    fetches: Grants
    grants: dict[str, tuple[PeerGrant, ...]]  # without open SDC checks (never changed once made)


def _plan(generation: Generation) -> _GenerationPlan:
    held = generation._directing
    if held and held[0].members is generation.members and held[0].restores is generation.restores:
        plan: _GenerationPlan = held[0]
        return plan
    by_rank: dict[int, list[RankRestore]] = {}
    stores: Grants = {}
    fetches: Grants = {}
    for member in generation.members:
        buddy = member.buddy_node_id
        if buddy and buddy != member.node_id:
            stores.setdefault(buddy, {}).setdefault(member.node_id, set()).update(member.ranks)
    for restore in generation.restores:
        by_rank.setdefault(restore.rank, []).append(restore)
        if restore.kind is not RestoreKind.PEER_SNAPSHOT:  # (most of 100k ranks: no lookup)
            continue
        restorer = generation.node_of_rank(restore.rank)
        if restorer and restorer != restore.source_node_id:
            rank = restore.rank if restore.source_rank is None else restore.source_rank
            fetches.setdefault(restore.source_node_id, {}).setdefault(restorer, set()).add(rank)
    plan = _GenerationPlan(generation.members, generation.restores, by_rank, stores, fetches,
                           _grants(stores, fetches, {*stores, *fetches}))
    held[:] = [plan]
    return plan


def _grants(stores: Grants, fetches: Grants, nodes: Iterable[str]) -> dict[str, tuple[PeerGrant, ...]]:
    return {
        node: tuple(
            PeerGrant(other, tuple(sorted(stores.get(node, {}).get(other, ()))),
                      tuple(sorted(fetches.get(node, {}).get(other, ()))))
            for other in sorted({*stores.get(node, {}), *fetches.get(node, {})})
        )
        for node in nodes
    }


def peer_grants(state: ClusterState) -> Mapping[str, tuple[PeerGrant, ...]]:
    """Per node, what other nodes may store there and fetch from there: a node is a buddy of the
    members that name it, a restore source for the ranks restored from it (both per generation:
    `_plan`), a snapshot source for SDC verifiers (the few open checks, per call)."""
    generation = state.generation
    plan = _plan(generation) if generation is not None else None
    if not state.sdc_checks:
        return plan.grants if plan is not None else {}
    stores = plan.stores if plan is not None else {}
    fetches: Grants = {node: {other: set(ranks) for other, ranks in by.items()}
                       for node, by in (plan.fetches if plan is not None else {}).items()}
    touched: set[str] = set()
    for check in state.sdc_checks:
        for holder in check.snapshot_holders:
            if holder != check.verifier_node_id:
                fetches.setdefault(holder, {}).setdefault(check.verifier_node_id, set()).add(check.rank)
                touched.add(holder)
    if plan is None:
        return _grants(stores, fetches, touched)
    return ChainMap(_grants(stores, fetches, touched), plan.grants)  # (the touched first; the rest not copied)


@dataclass(slots=True)
class _Shared:
    """What every node's directive of one push has in common, worked out once per push.

    A 100k-GPU generation start directs 12,500 nodes in one go on the leader's loop; building
    each directive's environment, grants and restores' addresses per node was most of the ~1 s
    stall that `directives_for` added there (issue 14). Nothing here is kept past the push.
    """

    state: ClusterState
    job: JobSpec
    waiting_reason: str
    retain: int
    grants: Mapping[str, tuple[PeerGrant, ...]]
    job_env: tuple[EnvVar, ...]
    run_env: tuple[EnvVar, ...]  # job_env + the elastic env: a RUN directive's env less a checkpoint pin
    checkpoint_steps: tuple[int, ...]
    max_restarts: int
    addresses: dict[str, str]

    @classmethod
    def of(cls, state: ClusterState, job: JobSpec, waiting_reason: str) -> _Shared:
        generation = state.generation
        job_env = tuple(EnvVar(k, v) for k, v in job.env)
        return cls(
            state=state, job=job, waiting_reason=waiting_reason,
            retain=state.snapshot.step if state.snapshot is not None else 0,
            grants=peer_grants(state), job_env=job_env,
            run_env=job_env + _elastic_env(job, generation) if generation is not None else job_env,
            checkpoint_steps=_requested_steps(state, generation) if generation is not None else (),
            max_restarts=-1 if job.max_restarts is None else job.max_restarts,
            addresses={},
        )

    def address(self, node_id: str) -> str:
        held = self.addresses.get(node_id)
        if held is None:
            held = self.addresses[node_id] = _address(self.state, node_id)
        return held


def directives_for(state: ClusterState, job: JobSpec, node_ids: list[str], waiting_reason: str) -> list[Directive]:
    """`directive_for` of many nodes, in time linear in `node_ids`: what the generation gives
    every directive is worked out once per generation (`_plan`: restores grouped by rank, grants),
    what a push's directives share once per push (`_Shared`)."""
    shared = _Shared.of(state, job, waiting_reason)
    return [_directive(shared, n) for n in node_ids]


def directive_for(state: ClusterState, job: JobSpec, node_id: str, waiting_reason: str) -> Directive:
    """What `node_id` should be doing now (one node; many at once: `directives_for`)."""
    return _directive(_Shared.of(state, job, waiting_reason), node_id)


def _directive(shared: _Shared, node_id: str) -> Directive:
    state = shared.state
    generation = state.generation
    checks = _sdc_orders(state, shared.job, node_id) if state.sdc_checks else ()
    mine = shared.grants.get(node_id, ())
    if generation is not None:
        member = generation.member(node_id)
        if member is not None:
            return _run(shared, generation, member, checks, mine)
    number = generation.number if generation else state.last_generation
    cause, reason = _standby(state, node_id, shared.waiting_reason)
    return Directive(generation=number, action=Action.STANDBY, retain_from_step=shared.retain, reason=reason,
                     sdc_checks=checks, peer_grants=mine, standby_cause=cause)


def _sdc_orders(state: ClusterState, job: JobSpec, node_id: str) -> tuple[SdcCheckOrder, ...]:
    """The open recompute checks this node verifies; the snapshot's holders with their addresses."""
    return tuple(
        SdcCheckOrder(
            check_id=c.check_id, generation=c.generation, step=c.step, rank=c.rank, world_size=c.world_size,
            replay_ranks=tuple(d.rank for d in c.reported),
            sources=tuple(SdcSnapshotSource(h, _address(state, h)) for h in c.snapshot_holders if state.node(h)),
            argv=job.argv, env=tuple(EnvVar(k, v) for k, v in job.env),
        )
        for c in state.sdc_checks
        if c.verifier_node_id == node_id
    )


def _run(shared: _Shared, generation: Generation, member: RankAssignment, checks: tuple[SdcCheckOrder, ...],
         grants: tuple[PeerGrant, ...]) -> Directive:
    state, job = shared.state, shared.job
    buddy = state.node(member.buddy_node_id) if member.buddy_node_id else None
    by_rank = _plan(generation).restores_by_rank
    mine = [r for rank in member.ranks for r in by_rank.get(rank, ())]
    address = shared.address
    restores = tuple(
        RestoreFrom(r.rank, r.kind, r.source_node_id, address(r.source_node_id) if r.source_node_id else "",
                    r.source_rank)
        for r in mine
    )
    pin = _checkpoint_env(state, generation, restores)
    return Directive(
        generation=generation.number,
        action=Action.RUN,
        ranks=member.ranks,
        world_size=generation.world_size,
        master_addr=generation.master_addr,
        master_port=generation.master_port,
        argv=job.argv,
        # (the pin goes between the job's env and the elastic env, where it always went)
        env=shared.run_env if not pin else shared.job_env + pin + _elastic_env(job, generation),
        restore_step=generation.restore_step,
        restores=restores,
        buddy_node_id=member.buddy_node_id,
        buddy_address=buddy.peer_address if buddy else "",
        # The restore step is the committed one, so it is kept until a newer step commits.
        retain_from_step=shared.retain,
        reason=f"generation {generation.number}",
        checkpoint_steps=shared.checkpoint_steps,
        sdc_checks=checks,
        cwd=job.cwd,
        stop_grace_s=job.sigterm_grace_s,
        # Failures before this generation started: it is the count-th restart.
        restart_count=state.failures,
        max_restarts=shared.max_restarts,
        job_name=job.name,
        peer_grants=grants,
    )


def _elastic_env(job: JobSpec, generation: Generation) -> tuple[EnvVar, ...]:
    """An elastic job's ranks learn the full world: a shrunk generation accumulates gradients
    over full/world micro-batches (trainer.session.Session.accumulation) to keep the global batch."""
    if not job.is_elastic:
        return ()
    return (EnvVar("FTSUP_FULL_WORLD_SIZE", str(job.world_size)),)


def _requested_steps(state: ClusterState, generation: Generation) -> tuple[int, ...]:
    request = state.requested_checkpoint
    if request is None or request.generation != generation.number:
        return ()
    return (request.step,)


def _address(state: ClusterState, node_id: str) -> str:
    node = state.node(node_id)
    return node.peer_address if node else ""


def _standby(state: ClusterState, node_id: str, waiting_reason: str) -> tuple[StandbyCause, str]:
    """Why `node_id` stands by: the cause agents branch on, and the words people read."""
    node = state.node(node_id)
    if state.completion is not None:
        return StandbyCause.JOB_COMPLETED, "job completed"
    if state.failed is not None:
        return StandbyCause.JOB_FAILED, "job failed: restart budget spent"
    if node is not None and node.is_quarantined:
        return StandbyCause.QUARANTINED, f"quarantined: {node.quarantine_reason}"
    if node is not None and node.is_drained:
        return StandbyCause.DRAINED, "drained"
    if state.generation is not None:
        return StandbyCause.SPARE, f"spare for generation {state.generation.number}"
    return StandbyCause.WAITING, waiting_reason or "waiting"


def _checkpoint_env(state: ClusterState, generation: Generation, restores: tuple[RestoreFrom, ...]) -> tuple[EnvVar, ...]:
    """A node with a rank restoring from the object store is told which checkpoint: the committed
    one at the restore step (the planner only chooses a committed checkpoint's step). Its agent
    answers that rank's GetRestore with no state, and the trainer then loads the checkpoint."""
    checkpoint = state.checkpoint
    if checkpoint is None or checkpoint.step != generation.restore_step:
        return ()
    if not any(r.kind is RestoreKind.CHECKPOINT for r in restores):
        return ()
    pin = (EnvVar("FTSUP_RESTORE_CHECKPOINT_SHA256", checkpoint.manifest_sha256),) if checkpoint.manifest_sha256 else ()
    return (EnvVar("FTSUP_RESTORE_CHECKPOINT", checkpoint.checkpoint_id), *pin)
