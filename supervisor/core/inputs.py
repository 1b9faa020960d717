"""What the supervisor reacts to: messages from agents, the passage of time, stream changes.

Inputs are facts the shell observed; `decide` turns them into events. They are never logged
(heartbeats and step reports are soft state), which keeps the log to state changes only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ftsup.supervisor.core.events import NodeRole, SdcRankDigests


@dataclass(frozen=True, slots=True)
class AgentHello:
    node_id: str
    incarnation: int
    role: NodeRole
    host: str
    peer_port: int
    gpus: int
    stream_id: int  # the shell's handle for the stream this Hello came on
    failure_domain: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    node_id: str
    incarnation: int
    running_generation: int


@dataclass(frozen=True, slots=True)
class HeardFrom:
    """A link shard's liveness summary: each of these nodes (a stream the shard holds for this
    leader) sent at least one heartbeat since the shard's previous summary.

    One input per shard batch instead of one Heartbeat per node (issue 14): the leader's cost per
    node-heartbeat falls from a message's admission and queueing to a dict update. A node the core
    does not know (its Hello refused, or a summary racing its stream's end) is skipped, not
    refused: the summary speaks for many nodes at once, and being heard changes no decision."""

    node_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SnapshotMemoryReport:
    """The agent's limit on snapshot bytes and what it rests on (agent/core/snapshot_budget.py).
    Shown to operators; the core decides nothing on it."""

    node_id: str
    limit_bytes: int
    derived_bytes: int | None  # None: no snapshot size known yet
    basis: str  # no_sizes_yet | derived | ram_cap | flag_cap
    ranks: int
    reason: str


@dataclass(frozen=True, slots=True)
class StepReport:
    node_id: str
    generation: int
    rank: int
    step: int
    step_time_s: float
    compute_time_s: float
    loss: float
    param_digest: str
    grad_norm: float = float("nan")  # NaN: not reported
    tokens: int = 0  # this rank's tokens in the step; 0: not reported
    local_grad_digest: str = ""  # its local gradients before the all-reduce; "": not reported
    replica_group: int | None = None  # the lowest rank holding the same shards; None: not reported


@dataclass(frozen=True, slots=True)
class StepAggregate:
    """One training step of several ranks in one input: a node's ranks (its agent reports them
    together) or a link shard's nodes' ranks, folded before they reach the leader, so the leader
    handles one input per node or shard per step instead of one per rank. Observed and decided
    exactly as its reports would be one by one (tests/unit/supervisor/test_step_aggregates.py):
    the straggler detector and the SDC vote still see every rank. One generation and one step,
    each rank once."""

    generation: int
    step: int
    reports: tuple[StepReport, ...]


@dataclass(frozen=True, slots=True)
class SnapshotReport:
    node_id: str
    generation: int
    rank: int
    step: int
    holder_node_ids: tuple[str, ...]
    size_bytes: int
    sha256: str = ""  # the held payload's digest ("" from an agent that predates it)


@dataclass(frozen=True, slots=True)
class SnapshotHoldings:
    """One node's snapshot holdings of one step in one input: the SnapshotReports its agent (or
    its link shard) folded, so the leader handles one input per node per step instead of one per
    rank and holder (issue 14). `node_id` holds every entry (each report's node_id is it).
    Observed and decided exactly as its reports one by one
    (tests/unit/supervisor/test_snapshot_holdings.py); refused whole when any entry would be."""

    node_id: str
    generation: int
    step: int
    reports: tuple[SnapshotReport, ...]


@dataclass(frozen=True, slots=True)
class RankFinished:
    node_id: str
    generation: int
    rank: int
    step: int
    param_digest: str


@dataclass(frozen=True, slots=True)
class TrainerExit:
    node_id: str
    generation: int
    rank: int
    exit_code: int
    finished: bool
    output_tail: str = ""  # the rank's last lines of output (bounded by the agent)
    is_plain_script: bool = False  # it never opened a Session: exit 0 means done (level 0)


@dataclass(frozen=True, slots=True)
class XidReport:
    node_id: str
    pci: str
    gpu: int | None
    code: int
    message: str


@dataclass(frozen=True, slots=True)
class TrainerHung:
    node_id: str
    generation: int
    rank: int
    last_step: int
    silent_for_s: float
    limit_s: float


class OperatorCommandKind(StrEnum):
    """What an operator asks; the core branches on this, never on text (the values are the
    names logged in OperatorCommand records and shown by supervisorctl)."""

    QUARANTINE = "quarantine"
    UNQUARANTINE = "unquarantine"
    DRAIN = "drain"
    RESTART = "restart"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True, slots=True)
class OperatorRequest:
    """An authorized operator command on one node, or on the whole job (restart, checkpoint: node_id "")."""

    command: OperatorCommandKind
    node_id: str
    reason: str
    operator: str  # the name the client claims; `principal` is who authenticated
    principal: str = ""

    def __post_init__(self) -> None:
        # Callers may name the command by its logged text; an unknown one fails here, at the edge.
        object.__setattr__(self, "command", OperatorCommandKind(self.command))


@dataclass(frozen=True, slots=True)
class StreamClosed:
    node_id: str
    incarnation: int
    stream_id: int


@dataclass(frozen=True, slots=True)
class LeadershipAcquired:
    """This replica won the election for `term`: its first decision is to say so in the log."""

    term: int
    address: str


@dataclass(frozen=True, slots=True)
class CheckpointShardReport:
    """A rank wrote its shard of checkpoint `checkpoint_id` (or failed to: `error` set)."""

    node_id: str
    generation: int
    rank: int
    checkpoint_id: str
    step: int
    key: str
    sha256: str
    size_bytes: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class CheckpointCommitResult:
    """The shell's commit (catalog.commit, off the event loop) finished: a manifest or an error."""

    checkpoint_id: str
    step: int
    manifest_key: str
    error: str = ""
    manifest_sha256: str = ""  # of the manifest bytes committed (catalog.commit_pinned)


@dataclass(frozen=True, slots=True)
class SdcCheckResult:
    """A verifier's answer to an SDC recompute check: its digests per replayed rank, or an error."""

    node_id: str
    check_id: str
    step: int
    rank: int
    recomputed: tuple[SdcRankDigests, ...]
    error: str = ""
    replay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed; lets the detectors and the planner act without a message.

    `stalled_s`: how long the supervisor itself did not run before this tick (a GC pause, CPU
    starvation, a SIGSTOP). Nodes could not be heard during it, so it does not count as their
    silence (see soft.observe).
    """

    stalled_s: float = 0.0


Input = (
    AgentHello
    | Heartbeat
    | HeardFrom
    | StepReport
    | StepAggregate
    | SnapshotReport
    | SnapshotHoldings
    | RankFinished
    | TrainerExit
    | XidReport
    | TrainerHung
    | OperatorRequest
    | StreamClosed
    | Tick
    | LeadershipAcquired
    | CheckpointShardReport
    | CheckpointCommitResult
    | SdcCheckResult
    | SnapshotMemoryReport
)
