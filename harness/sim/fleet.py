"""The adapter between simulated nodes and the real supervisor core.

It feeds the pure core through the runtime's own step (core/step.py: admission, `soft.observe`,
`decide`; then `advance` folds the events as records stamped with virtual time) with the inputs a
failure produces: the dead node falls silent, a Tick at its detection deadline lets the core's
failure detector declare it dead, and the core's events say what happens next (generation ended,
node quarantined, a spare promoted into a new generation, where each rank restores from). A
repaired node comes back as the runtime would see it: its old stream closes, its agent says Hello
as a spare, an operator unquarantines it.

Inputs that carry no decision are applied in bulk, because 12,500 nodes x 30 days cannot be
fed one message at a time: the heartbeats of healthy nodes (`observe` only moves their
`last_heard_s`, `decide` returns nothing for them), the snapshot holdings of all ranks but one
(`observe` only records them, `decide` commits nothing until the last one), and the fleet's
registration (the state a log replay of NodeRegistered events folds to), and the digests of all
ranks but one (`observe` stores them until the step's vote is complete). Unit tests check each
bulk path against feeding the same inputs one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from ftsup.supervisor.core import open_steps
from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import Event, NodeRole, RankAssignment
from ftsup.supervisor.core.inputs import (
    AgentHello,
    Input,
    OperatorCommandKind,
    OperatorRequest,
    StepReport,
    StreamClosed,
    Tick,
)
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeRecord, NodeSoft, SoftState
from ftsup.supervisor.core.step import Core
from ftsup.supervisor.core.step_holdings import StepHoldings

HOST = "sim"
DIGEST = "sim-digest"  # every replica holds the same bits: the digest vote always agrees
PEER_PORT = 9000


class CoreRefused(RuntimeError):
    """The core refused an input the simulator built: a simulator bug, never a simulated outcome."""


def active_id(index: int) -> str:
    return f"n{index:05d}"


def spare_id(index: int) -> str:
    return f"s{index:05d}"


@dataclass(frozen=True, slots=True)
class Fleet:
    """The job as the core sees it after registration and its first plan; reused by every run."""

    job: JobSpec
    state: ClusterState  # first generation started, not yet running
    node_ids: tuple[str, ...]


def registered_state(nodes: int, spares: int, gpus_per_node: int) -> ClusterState:
    """What folding one NodeRegistered per node (actives, then spares) produces."""
    records: dict[str, NodeRecord] = {}
    ids = [(active_id(i), NodeRole.ACTIVE) for i in range(nodes)] + [(spare_id(i), NodeRole.SPARE) for i in range(spares)]
    for order, (node_id, role) in enumerate(ids, start=1):
        records[node_id] = NodeRecord(
            node_id=node_id, incarnation=1, role=role, host=HOST, peer_port=PEER_PORT,
            gpus=gpus_per_node, liveness=Liveness.ALIVE, registered_order=order,
        )
    return ClusterState(nodes=MappingProxyType(records), applied_seq=len(ids), registrations=len(ids))


def build_fleet(nodes: int, spares: int, gpus_per_node: int, ranks_per_node: int = 1) -> Fleet:
    """Registers the fleet and lets the core plan the first generation (a Tick at t=0)."""
    job = JobSpec(name="sim", nodes=nodes, ranks_per_node=ranks_per_node, argv=("train",))
    driver = CoreDriver(job, DetectorConfig(), registered_state(nodes, spares, gpus_per_node))
    driver.feed(Tick(), 0.0)
    if driver.state.generation is None:
        raise RuntimeError(f"the core planned no first generation: {driver.waiting_reason}")
    return Fleet(job, driver.state, tuple(driver.state.nodes))


class CoreDriver:
    """Owns one run's core (core/step.py); `feed` is the runtime's loop body, in virtual time."""

    def __init__(self, job: JobSpec, detector: DetectorConfig, state: ClusterState) -> None:
        self.job = job
        self.detector = detector
        self.config = CoreConfig(job=job, detector=detector)
        self.silent: set[str] = set()  # failed nodes whose stream is still open
        self.streams = 0  # stream ids handed out (the shell's handles for agent connections)
        self._others_of: tuple[tuple[RankAssignment, ...], npt.NDArray[np.int64]] | None = None
        soft = SoftState(started_at_s=0.0)
        for node in state.nodes.values():
            soft.nodes[node.node_id] = NodeSoft(0.0, self._new_stream(), node.incarnation)
        self.core = Core(self.config, state, soft)

    @property
    def state(self) -> ClusterState:
        return self.core.state

    @property
    def soft(self) -> SoftState:
        return self.core.soft

    @property
    def waiting_reason(self) -> str:
        return self.core.waiting_reason

    def _new_stream(self) -> int:
        self.streams += 1
        return self.streams

    def feed(self, inp: Input, now: float) -> tuple[Event, ...]:
        """One core step, its events persisted (virtually, stamped `now`) and folded."""
        ready = self.core.step(inp, now)
        if ready.refusal is not None:
            raise CoreRefused(f"{type(inp).__name__} at t={now:.3f}s refused: {ready.refusal.reason}")
        self.core.advance(ready, self.core.records(ready.events, now))
        return ready.events

    def heartbeats(self, now: float) -> None:
        """Every connected node that has not failed was heard from at `now` (bulk Heartbeat).

        Only a Tick reads when nodes were last heard (the failure detector), so `tick` calls this
        and the other inputs do not: 12,500 nodes per call."""
        for node_id, info in self.soft.nodes.items():
            if info.stream_id is not None and node_id not in self.silent:
                info.last_heard_s = now
        self.soft.detector_memo.heard(now)  # (written here, not through soft.observe: tell the detector's memo)

    def fail(self, node_id: str, now: float) -> float:
        """`node_id` falls silent at `now`; returns when the detector's deadline passes."""
        info = self.soft.nodes[node_id]
        if info.stream_id is not None and node_id not in self.silent:
            info.last_heard_s = now  # its last heartbeat
            self.soft.detector_memo.heard(now)
        self.silent.add(node_id)
        deadline = now + self.detector.dead_after_s
        while deadline - now < self.detector.dead_after_s:  # float rounding must not cut it short
            deadline = math.nextafter(deadline, math.inf)
        return deadline

    def tick(self, now: float) -> tuple[Event, ...]:
        self.heartbeats(now)
        return self.feed(Tick(), now)

    def start_running(self, now: float, step_s: float) -> tuple[Event, ...]:
        """The first step of the generation in force completes (its first StepReport)."""
        generation = self.state.generation
        if generation is None:
            raise ValueError("no generation is in force")
        first = generation.members[0]
        step = (generation.restore_step or 0) + 1
        report = StepReport(first.node_id, generation.number, first.ranks[0], step, step_s, step_s, 1.0, "")
        return self.feed(report, now)

    def commit_snapshot(self, step: int, now: float, step_s: float) -> tuple[Event, ...]:
        """Every rank's snapshot of `step` is held by its node and its node's buddy, and every
        rank reported the step with the same parameter digest.

        The holdings and all digests but one are recorded as `observe` records SnapshotReports
        and StepReports (the core decides nothing until a step's vote is complete); the last
        rank's StepReport goes through the core, whose digest vote clears the step and commits it.
        """
        generation = self.state.generation
        if generation is None or not generation.is_running:
            raise ValueError("a snapshot commits only while a generation is running")
        progress = self.soft.progress
        if progress is None or progress.generation != generation.number:
            raise ValueError(f"no step progress recorded for generation {generation.number}")
        progress.holdings[step] = StepHoldings.whole(generation.index.holder_slots(), DIGEST)
        others = self._others(generation.members)
        open_steps.preload_votes(progress.open_votes, step, generation.world_size, others, DIGEST)
        last = generation.members[0]
        report = StepReport(last.node_id, generation.number, last.ranks[0], step, step_s, step_s, 1.0, DIGEST)
        return self.feed(report, now)

    def _others(self, members: tuple[RankAssignment, ...]) -> npt.NDArray[np.int64]:
        """Every rank but the first member's first, for a layout (kept per layout: 12,500 members
        take milliseconds to walk)."""
        if self._others_of is None or self._others_of[0] is not members:
            ranks = np.fromiter((rank for member in members for rank in member.ranks), dtype=np.int64)
            self._others_of = (members, ranks[ranks != members[0].ranks[0]])
        return self._others_of[1]

    def repair(self, node_id: str, now: float) -> tuple[Event, ...]:
        """A failed, quarantined node returns: its old stream closes, it says Hello as a spare
        (a new agent incarnation), and an operator unquarantines it."""
        node = self.state.nodes[node_id]
        info = self.soft.nodes[node_id]
        events: list[Event] = []
        if info.stream_id is not None:
            events += self.feed(StreamClosed(node_id, info.incarnation, info.stream_id), now)
        self.silent.discard(node_id)
        incarnation = node.incarnation + 1
        hello = AgentHello(node_id, incarnation, NodeRole.SPARE, HOST, PEER_PORT, node.gpus, self._new_stream())
        events += self.feed(hello, now)
        if not self.state.nodes[node_id].is_in_service:
            events += self.feed(OperatorRequest(OperatorCommandKind.UNQUARANTINE, node_id, "repaired (simulated)", "sim"), now)
        return tuple(events)
