"""The cluster state the event log folds into, and the soft state rebuilt from the input stream.

`ClusterState` is what a replica knows after replaying the log: it is treated as immutable
(mappings are replaced, never mutated) so any state can be kept and compared in tests.
`SoftState` (heartbeat times, connected streams, step progress, snapshot holdings) is never
logged; a fresh leader rebuilds it from what agents send, after one timeout of grace.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from ftsup.supervisor.core import holder_slots
from ftsup.supervisor.core.detector_memo import DetectorMemo
from ftsup.supervisor.core.events import (
    EndReason,
    JobFailed,
    NodeRole,
    QuarantineCause,
    RankAssignment,
    RankRestore,
    SdcCheckStarted,
    SdcRankDigests,
)
from ftsup.supervisor.core.grow_only import GrowOnly
from ftsup.supervisor.core.holder_slots import HolderSlots
from ftsup.supervisor.core.inputs import SnapshotMemoryReport, TrainerExit
from ftsup.supervisor.core.open_steps import OpenTimes, OpenVotes
from ftsup.supervisor.core.plan_memo import PlanMemo
from ftsup.supervisor.core.policies.interval import IntervalObservations
from ftsup.supervisor.core.policies.sdc import StepVote
from ftsup.supervisor.core.policies.straggler import StragglerState, StragglerVerdict
from ftsup.supervisor.core.policies.xid import XidSighting
from ftsup.supervisor.core.step_holdings import StepHoldings


class Liveness(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node_id: str
    incarnation: int
    role: NodeRole
    host: str
    peer_port: int
    gpus: int
    liveness: Liveness = Liveness.ALIVE
    is_quarantined: bool = False
    quarantine_reason: str = ""
    quarantine_cause: QuarantineCause = QuarantineCause.UNSPECIFIED  # what the core branches on
    is_drained: bool = False  # taken out of service on purpose, not faulty
    xid_count: int = 0
    straggler_score: float = 0.0  # robust z of the last straggler verdict
    failure_domain: str = ""
    registered_order: int = 0  # position among registrations: lower has been up longer

    @property
    def is_in_service(self) -> bool:
        return not (self.is_quarantined or self.is_drained)

    @property
    def can_train(self) -> bool:
        """Alive and in service, as the log knows it: may be placed in a generation (whether it is
        connected to this supervisor is soft state: see `is_usable`)."""
        return self.liveness is Liveness.ALIVE and not (self.is_quarantined or self.is_drained)

    @property
    def peer_address(self) -> str:
        return f"{self.host}:{self.peer_port}"


class MemberIndex:
    """Lookups over one members tuple (node -> assignment, rank -> node), each built on first use
    and kept by the generation that owns it: no module-level memo. A linear scan per StepReport
    costs 12.5k comparisons at 100k GPUs; the maps are built in C-level passes."""

    __slots__ = ("members", "_by_node", "_by_rank", "_may_hold", "_holdable", "_slots")

    def __init__(self, members: tuple[RankAssignment, ...]) -> None:
        self.members = members
        self._by_node: dict[str, RankAssignment] | None = None
        self._by_rank: dict[int, str] | None = None
        self._may_hold: dict[int, tuple[str, str]] | None = None
        self._holdable: dict[str, frozenset[int]] | None = None
        self._slots: HolderSlots | None = None

    def by_node(self) -> Mapping[str, RankAssignment]:
        """node -> its assignment; a node listed twice keeps its first (as a scan would find)."""
        if self._by_node is None:
            members = self.members
            by_node = dict(zip(map(attrgetter("node_id"), members), members))
            if len(by_node) != len(members):
                by_node = dict(zip(reversed(list(map(attrgetter("node_id"), members))), reversed(members)))
            self._by_node = by_node
        return self._by_node

    def by_rank(self) -> Mapping[int, str]:
        """rank -> its node (built only when asked: most generations never look a rank up)."""
        if self._by_rank is None:
            node_ids = list(map(attrgetter("node_id"), self.members))
            ranks = list(map(attrgetter("ranks"), self.members))
            owners = list(chain.from_iterable(map(repeat, node_ids, map(len, ranks))))
            self._by_rank = dict(zip(reversed(list(chain.from_iterable(ranks))), reversed(owners)))
        return self._by_rank

    def may_hold(self) -> Mapping[int, tuple[str, str]]:
        """rank -> (its node, that node's buddy): who may hold the rank's snapshot, the question
        admission asks of every holding (each node's 8 ranks twice a step at 12,500 nodes), in one
        lookup instead of a rank's node and then that node's assignment."""
        if self._may_hold is None:
            by_node = self.by_node()
            self._may_hold = {rank: (node, by_node[node].buddy_node_id) for rank, node in self.by_rank().items()}
        return self._may_hold

    def holdable(self) -> Mapping[str, frozenset[int]]:
        """node -> the ranks it may hold (its own and its buddy's: `may_hold` turned around), so
        a node's holdings of a step are admitted with one subset test instead of a lookup per
        entry."""
        if self._holdable is None:
            members = self.members
            if len(self.by_node()) == len(members) and len(self.by_rank()) == sum(map(len, map(attrgetter("ranks"),
                                                                                              members))):
                # Each node and rank once (every generation the planner makes): a node holds its
                # own block and the block of each member it is the buddy of, gathered per member.
                blocks: dict[str, list[tuple[int, ...]]] = {}
                for member in members:
                    blocks.setdefault(member.node_id, []).append(member.ranks)
                    blocks.setdefault(member.buddy_node_id, []).append(member.ranks)
                self._holdable = {node: frozenset(chain.from_iterable(its)) for node, its in blocks.items()}
            else:  # (a node or rank listed twice: `may_hold`'s first-listed rule, rank by rank)
                by_holder: dict[str, set[int]] = {}
                for rank, (owner, buddy) in self.may_hold().items():
                    by_holder.setdefault(owner, set()).add(rank)
                    by_holder.setdefault(buddy, set()).add(rank)
                self._holdable = {node: frozenset(ranks) for node, ranks in by_holder.items()}
        return self._holdable

    def holder_slots(self) -> HolderSlots:
        """The generation's holder slots as arrays (holder_slots.py): what a step's holdings are
        kept against (step_holdings.py)."""
        if self._slots is None:
            members = self.members
            exact = len(self.by_node()) == len(members) and len(self.by_rank()) == sum(
                map(len, map(attrgetter("ranks"), members)))
            self._slots = holder_slots.build(members, None if exact else self.may_hold(), exact)
        return self._slots


@dataclass(frozen=True, slots=True)
class Generation:
    number: int
    members: tuple[RankAssignment, ...]
    world_size: int
    master_addr: str
    master_port: int
    restore_step: int | None
    restore_generation: int
    restores: tuple[RankRestore, ...]
    first_step: int | None = None  # set when its first step completed
    # Its lookups, built on first use (not logged, not compared; frozen.replace may carry it over
    # to a copy, which `index` checks is of the same members).
    _index: list[MemberIndex] = field(default_factory=list, init=False, compare=False, repr=False)
    # What the directives derive from members and restores (core/directives.py), built on first
    # use in the same way: a push to a few nodes must not walk a 100,000-rank generation again.
    _directing: list[Any] = field(default_factory=list, init=False, compare=False, repr=False)

    @property
    def is_running(self) -> bool:
        return self.first_step is not None

    @property
    def index(self) -> MemberIndex:
        held = self._index
        if not held or held[0].members is not self.members:
            held[:] = [MemberIndex(self.members)]
        return held[0]

    def member(self, node_id: str) -> RankAssignment | None:
        return self.index.by_node().get(node_id)

    def node_of_rank(self, rank: int) -> str | None:
        return self.index.by_rank().get(rank)


@dataclass(frozen=True, slots=True)
class CommittedSnapshot:
    """The newest step whose every rank is held in RAM twice; `members` says by whom."""

    generation: int
    step: int
    members: tuple[RankAssignment, ...]
    # Holders whose agent restarted since (a new incarnation): their RAM copies are gone.
    lost_holders: tuple[str, ...] = ()

    def holders(self, rank: int) -> tuple[str, ...]:
        for assignment in self.members:
            if rank in assignment.ranks:
                return (assignment.node_id, assignment.buddy_node_id)
        return ()


@dataclass(frozen=True, slots=True)
class Completion:
    generation: int
    step: int
    param_digest: str


@dataclass(frozen=True, slots=True)
class EndedGeneration:
    number: int
    reason: EndReason
    node_id: str
    last_step: int


@dataclass(frozen=True, slots=True)
class CommittedCheckpoint:
    checkpoint_id: str
    step: int
    manifest_key: str
    manifest_sha256: str = ""  # restores verify the manifest against it (checkpoint/verify.py)


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """One rank's written shard: the commit reads its index back and checks it against these."""

    shard: int
    key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PendingCheckpoint:
    checkpoint_id: str
    generation: int
    step: int
    shards: int
    # The ranks whose shard is written and their records, in arrival order. GrowOnly, not tuples:
    # one event per rank (100,000 at 100k GPUs) appends in O(1) and asks "did rank r write?" in
    # O(1), where tuple copies and scans made a checkpoint quadratic (grow_only.py).
    written: GrowOnly[int] = field(default_factory=GrowOnly)
    records: GrowOnly[ShardRecord] = field(default_factory=GrowOnly)
    location: str = ""

    @property
    def is_complete(self) -> bool:
        return len(self.written) == self.shards


@dataclass(frozen=True, slots=True)
class RequestedCheckpoint:
    """A checkpoint asked for off the cadence, not started yet (its step not reached)."""

    checkpoint_id: str
    generation: int
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class ClusterState:
    nodes: Mapping[str, NodeRecord] = field(default_factory=lambda: MappingProxyType({}))
    generation: Generation | None = None  # the generation in force, None between generations
    last_generation: int = 0
    last_ended: EndedGeneration | None = None
    snapshot: CommittedSnapshot | None = None
    completion: Completion | None = None
    applied_seq: int = 0  # the seq of the last record folded in
    checkpoint: CommittedCheckpoint | None = None  # the newest committed object-store checkpoint
    pending_checkpoint: PendingCheckpoint | None = None
    registrations: int = 0  # NodeRegistered events folded so far
    # First step whose replicas disagreed (SdcSuspected) or a confirmed recompute convicted, until
    # a generation restores from before it: no snapshot or checkpoint from this step on may be
    # committed or restored.
    sdc_tainted_from_step: int | None = None
    requested_checkpoint: RequestedCheckpoint | None = None
    # The newest attempt started (committed, aborted or in flight): never started twice, so a
    # late rank's report of an aborted attempt's step cannot restart it without the shards the
    # first attempt already consumed.
    last_checkpoint_attempt: str = ""
    # The open SDC recompute checks (oldest first). While one is open on step S, no step >= S is
    # committed (snapshot, checkpoint, job completion): a recompute may still prove S corrupt.
    sdc_checks: tuple[SdcCheckStarted, ...] = ()
    failures: int = 0  # generations ended by a failure (the restart budget counts these)
    failed: JobFailed | None = None  # the budget ran out: the job is over, no generation starts

    def node(self, node_id: str) -> NodeRecord | None:
        return self.nodes.get(node_id)


def is_usable(node: NodeRecord, soft: SoftState) -> bool:
    """The rule, in its one home: `node` can take ranks (or a recompute) now: it can train and its
    stream to this supervisor is open."""
    if not node.can_train:
        return False
    info = soft.nodes.get(node.node_id)
    return info is not None and info.stream_id is not None


@dataclass(slots=True)
class NodeSoft:
    last_heard_s: float  # monotonic time of the last message from this node
    stream_id: int | None  # the open stream, None when disconnected
    incarnation: int
    disconnected_at_s: float | None = None
    closed_stream_id: int | None = None  # the stream whose closing set disconnected_at_s
    agent_gone: str = ""  # why its agent is known gone since that close (AgentGone); "" unknown
    snapshot_memory: SnapshotMemoryReport | None = None  # as its agent reported it in this session
    # The link shard whose liveness summaries last named this node ("": none; heard directly).
    # Its silence is the shard's, not the node's, while the shard is quiet (policies/failure.py).
    shard: str = ""


@dataclass(slots=True)
class GenerationProgress:
    """Step progress of the generation in force, from step and snapshot reports."""

    generation: int
    max_step: int = 0
    last_loss: float = math.nan
    step_time_s: float | None = None  # the newest step's wall time (sizes checkpoint lead times)
    # step -> who holds each rank's snapshot, and the SHA-256 its first holder reported; a holder
    # reporting other bytes puts the step in `holding_mismatches` and it never commits (owner and
    # buddy must hold the same)
    holdings: dict[int, StepHoldings] = field(default_factory=dict)
    holding_mismatches: set[int] = field(default_factory=set)
    finished: dict[int, str] = field(default_factory=dict)  # rank -> final digest
    step_reports: int = 0
    # step -> its compute times, until every rank of the step reported (then scored)
    open_times: dict[int, OpenTimes] = field(default_factory=dict)
    straggler: StragglerState = field(default_factory=StragglerState)  # updated in place (soft)
    # step -> its digests and replica groups, until every rank of the step reported (then voted on)
    open_votes: dict[int, OpenVotes] = field(default_factory=dict)
    sdc_clear_steps: set[int] = field(default_factory=set)  # voted and agreed: committable
    sdc_diverged_step: int | None = None  # the first step whose vote disagreed
    # Exits that looked like collateral damage (policies/exit_cause.py), oldest first, and when the
    # first was held: the generation ends on the real cause if one shows within the settle window.
    held_exits: list[TrainerExit] = field(default_factory=list)
    held_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """What observing one input completed that `decide` acts on, handed from `soft.observe` to
    `decide` as a value (never left on the soft state for decide to read back)."""

    # the straggler detector's verdicts on the step this input completed (decide records them)
    straggler_verdicts: tuple[StragglerVerdict, ...] = ()
    sdc_vote: StepVote | None = None  # the digest vote of the step this input completed
    # what every rank reported at the voted step (its evidence, for a recompute check), by rank
    vote_reports: Sequence[SdcRankDigests] = ()  # soft.VoteReports: records made when read


NOTHING_OBSERVED = Observation()


@dataclass(slots=True)
class SoftState:
    """Mutable, owned by the runtime task alone, updated only by `soft.observe`."""

    started_at_s: float  # when this supervisor started deciding: the grace period starts here
    nodes: dict[str, NodeSoft] = field(default_factory=dict)
    progress: GenerationProgress | None = None
    waiting_reason: str = ""
    # node -> recent Xids (time, code, pci), newest last: the Xid policy's repeat counting
    xids: dict[str, list[XidSighting]] = field(default_factory=dict)
    # nodes an operator asked to drain while they train: drained at the next committed step
    pending_drains: set[str] = field(default_factory=set)
    # Checkpoint clocks (monotonic, this supervisor's): when the checkpoint in flight was first
    # seen (its timeout counts from here) and when the newest commit was seen (the Young/Daly
    # cadence counts from here); a new leader starts both at its own start.
    checkpoint_seen: tuple[str, float] | None = None
    checkpoint_clock: tuple[str, float] | None = None
    # Young/Daly inputs from the log (costs, failures), record times shifted to the monotonic
    # clock by the runtime as it applies records; the core only reads them.
    interval_obs: IntervalObservations = field(default_factory=IntervalObservations)
    # open SDC check id -> when this supervisor first saw it open: its answer is due within the
    # recompute timeout from then (a new leader gives every open check a full timeout)
    sdc_check_seen_s: dict[str, float] = field(default_factory=dict)
    # link shard -> when its newest liveness summary arrived (a shard that keeps alive sends one at
    # least every few hundred ms): how long it has been quiet, which its nodes' silence is not
    shard_heard_s: dict[str, float] = field(default_factory=dict)
    # Counts changes of which nodes have a stream open (a Hello's new NodeSoft, a stream closed),
    # made by `soft.observe` alone: the planners' survey of the fleet is kept while neither this
    # nor the node map changed (plan_memo.py). Code that sets a NodeSoft's stream_id itself
    # (tests, the simulator's set-up) must bump it too, or change the node map.
    links: int = field(default=0, compare=False)
    # The planners' objects from recent plans (plan_memo.py): plans equal without it, only slower.
    plan_memo: PlanMemo = field(default_factory=PlanMemo, compare=False, repr=False)
    # When the failure detector's next pass can first find a verdict (detector_memo.py): the
    # same verdicts without it, only a pass over every node on every Tick.
    detector_memo: DetectorMemo = field(default_factory=DetectorMemo, compare=False, repr=False)
