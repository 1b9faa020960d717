"""Read-only views of the state for operators: what `supervisorctl status` and `nodes` show.

Pure functions of (state, soft state, now); the operator service only converts them to proto.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass

from ftsup.supervisor.core import budget
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import SnapshotMemoryReport
from ftsup.supervisor.core.state import ClusterState, Liveness, SoftState


class JobPhase(enum.Enum):
    WAITING = "waiting"
    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # the restart budget is spent


@dataclass(frozen=True, slots=True)
class StatusView:
    job_name: str
    phase: JobPhase
    generation: int
    step: int
    world_size: int
    loss: float
    last_snapshot_step: int | None
    head_seq: int
    nodes_alive: int
    nodes_suspect: int
    nodes_dead: int
    nodes_quarantined: int
    spares_ready: int
    waiting_reason: str
    final_digest: str
    failure: str = ""  # when FAILED: budget.describe(JobFailed)
    failure_tail: str = ""
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    role: NodeRole
    liveness: Liveness
    is_quarantined: bool
    quarantine_reason: str
    ranks: tuple[int, ...]
    last_heartbeat_age_s: float  # negative: not heard since this supervisor started
    incarnation: int
    host: str
    is_connected: bool
    xid_count: int = 0
    straggler_score: float = 0.0
    failure_domain: str = ""  # as the agent registered it ("" when it named none)
    is_drained: bool = False
    snapshot_memory: SnapshotMemoryReport | None = None  # its agent's snapshot store limit, when reported


def status_view(state: ClusterState, soft: SoftState, job_name: str, world_size: int) -> StatusView:
    generation = state.generation
    progress = soft.progress
    has_progress = progress is not None and generation is not None and progress.generation == generation.number
    if state.completion is not None:
        phase = JobPhase.COMPLETED
    elif state.failed is not None:
        phase = JobPhase.FAILED
    elif generation is None:
        phase = JobPhase.WAITING
    elif generation.is_running:
        phase = JobPhase.RUNNING
    else:
        phase = JobPhase.STARTING
    if state.completion is not None:
        step = state.completion.step
    elif has_progress and progress is not None:
        step = progress.max_step
    elif generation is not None and generation.restore_step is not None:
        step = generation.restore_step
    else:
        step = state.snapshot.step if state.snapshot else 0
    members = {m.node_id for m in generation.members} if generation else set()
    nodes = list(state.nodes.values())
    return StatusView(
        job_name=job_name,
        phase=phase,
        generation=generation.number if generation else state.last_generation,
        step=step,
        world_size=generation.world_size if generation else world_size,
        loss=progress.last_loss if has_progress and progress is not None else math.nan,
        last_snapshot_step=state.snapshot.step if state.snapshot else None,
        head_seq=state.applied_seq,
        nodes_alive=sum(1 for n in nodes if n.liveness is Liveness.ALIVE),
        nodes_suspect=sum(1 for n in nodes if n.liveness is Liveness.SUSPECT),
        nodes_dead=sum(1 for n in nodes if n.liveness is Liveness.DEAD),
        nodes_quarantined=sum(1 for n in nodes if n.is_quarantined),
        spares_ready=sum(
            1
            for n in nodes
            if n.role is NodeRole.SPARE
            and n.can_train
            and n.node_id not in members
        ),
        waiting_reason=soft.waiting_reason if phase is JobPhase.WAITING else "",
        final_digest=state.completion.param_digest if state.completion else "",
        failure=budget.describe(state.failed) if state.failed is not None else "",
        failure_tail=state.failed.output_tail if state.failed is not None else "",
        # gang restarts made: the failure that spent the budget restarted nothing
        restarts=state.failures - (1 if state.failed is not None else 0),
    )


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """What the metrics export of every node, as columns (one entry per node, in one order):
    read straight from the state, with no NodeView per node (a scrape at 12,500 nodes otherwise
    spends most of its time building views it reads four fields of)."""

    node_ids: list[str]
    xid_counts: list[int]
    straggler_scores: list[float]
    heartbeat_ages_s: list[float]  # negative: not heard since this supervisor started
    # (liveness name, or "quarantined"; role name) -> nodes
    by_state: dict[tuple[str, str], int]


def node_figures(state: ClusterState, soft: SoftState, now: float) -> NodeFigures:
    nodes = list(state.nodes.values())
    ids = [node.node_id for node in nodes]
    heard = soft.nodes
    ages = [now - info.last_heard_s if (info := heard.get(node_id)) is not None else -1.0 for node_id in ids]
    kinds = Counter(("quarantined" if n.is_quarantined else n.liveness, n.role) for n in nodes)
    by_state = {(kind if isinstance(kind, str) else kind.name.lower(), role.name.lower()): count
                for (kind, role), count in kinds.items()}
    return NodeFigures(ids, [n.xid_count for n in nodes], [n.straggler_score for n in nodes], ages, by_state)


def node_views(state: ClusterState, soft: SoftState, now: float) -> list[NodeView]:
    generation = state.generation
    views = []
    for node in sorted(state.nodes.values(), key=lambda n: n.node_id):
        info = soft.nodes.get(node.node_id)
        member = generation.member(node.node_id) if generation else None
        views.append(
            NodeView(
                node_id=node.node_id,
                role=node.role,
                liveness=node.liveness,
                is_quarantined=node.is_quarantined,
                quarantine_reason=node.quarantine_reason,
                ranks=member.ranks if member else (),
                last_heartbeat_age_s=now - info.last_heard_s if info else -1.0,
                incarnation=node.incarnation,
                host=node.host,
                is_connected=info is not None and info.stream_id is not None,
                xid_count=node.xid_count,
                straggler_score=node.straggler_score,
                failure_domain=node.failure_domain,
                is_drained=node.is_drained,
                snapshot_memory=info.snapshot_memory if info else None,
            )
        )
    return views


@dataclass(frozen=True, slots=True)
class StragglerRankView:
    rank: int
    node_id: str
    last_score: float  # robust z at the newest scored step
    window_steps: int
    over_threshold: int  # scores in the window at or above flag_z
    is_flagged: bool


def straggler_views(state: ClusterState, soft: SoftState, flag_z: float) -> tuple[int, tuple[StragglerRankView, ...]]:
    """The generation in force and each rank's straggler window (soft state: empty on a fresh leader)."""
    generation = state.generation
    progress = soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return (generation.number if generation else 0), ()
    detector = progress.straggler
    views = tuple(
        StragglerRankView(
            rank=rank,
            node_id=generation.node_of_rank(rank) or "",
            last_score=window.scores[-1] if window.scores else 0.0,
            window_steps=len(window.scores),
            over_threshold=sum(1 for z in window.scores if z >= flag_z),
            is_flagged=rank in detector.flagged,
        )
        for rank, window in sorted(detector.windows.items())
    )
    return generation.number, views
