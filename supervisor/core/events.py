"""The typed events of the supervisor's log: one frozen dataclass per kind, named in the past tense.

Every field a later reader needs to explain a decision is here (which node, why, what evidence).
Core code speaks only these types; `supervisor/codec.py` maps them to `ftsup.v1.Event` by name,
so a dataclass and its proto message must keep the same name and field names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class QuarantineCause(enum.Enum):
    """Why a node was quarantined, for the core to branch on (the event's reason says it in words).
    A death's three kinds are kept apart: a lost stream or a node a new leader never heard may have
    been a network blip, and the same agent coming back returns to service."""

    UNSPECIFIED = "unspecified"  # only on records older than causes, whose codec infers none
    DEAD_STREAM_LOSS = "dead_stream_loss"  # its stream closed and did not reopen in the grace
    DEAD_NEVER_HEARD = "dead_never_heard"  # a new leader never heard it within the timeout
    DEAD_SILENT = "dead_silent"  # its heartbeats stopped on an open stream
    XID = "xid"
    SDC = "sdc"
    STRAGGLER = "straggler"
    HUNG = "hung"
    OPERATOR = "operator"

    @property
    def is_transient_death(self) -> bool:
        """A death the same agent process reconnecting proves was not one."""
        return self in (QuarantineCause.DEAD_STREAM_LOSS, QuarantineCause.DEAD_NEVER_HEARD)


class NodeRole(enum.Enum):
    ACTIVE = "active"
    SPARE = "spare"


class RestoreKind(enum.Enum):
    FRESH = "fresh"
    LOCAL_SNAPSHOT = "local_snapshot"
    PEER_SNAPSHOT = "peer_snapshot"
    CHECKPOINT = "checkpoint"


class EndReason(enum.Enum):
    NODE_LOST = "node_lost"
    TRAINER_EXITED = "trainer_exited"
    NODE_RESTARTED = "node_restarted"
    COMPLETED = "completed"
    NODE_QUARANTINED = "node_quarantined"
    NODE_DRAINED = "node_drained"
    HUNG = "hung"
    OPERATOR_RESTART = "operator_restart"
    XID = "xid"
    SDC = "sdc"  # replicas split with no majority: restart from the last agreed step
    ELASTIC_GROW = "elastic_grow"  # a shrunk job had enough nodes again: regrow at a committed snapshot


# Generation ends that are faults: each is one interruption of the job. One home for the rule: the
# restart budget (budget.py) spends one restart on each, the Young/Daly MTBF (interval.py) counts them.
FAILURE_REASONS: frozenset[EndReason] = frozenset({
    EndReason.NODE_LOST,
    EndReason.TRAINER_EXITED,
    EndReason.NODE_RESTARTED,
    EndReason.NODE_QUARANTINED,
    EndReason.HUNG,
    EndReason.XID,
    EndReason.SDC,
})


class XidAction(enum.Enum):
    IGNORE = "ignore"
    RESTART_JOB = "restart_job"
    QUARANTINE_NODE = "quarantine_node"
    RESET_GPU = "reset_gpu"


class SdcVerdict(enum.Enum):
    MATCH = "match"
    MISMATCH = "mismatch"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True, slots=True)
class RankAssignment:
    node_id: str
    ranks: tuple[int, ...]
    buddy_node_id: str


@dataclass(frozen=True, slots=True)
class RankRestore:
    rank: int
    kind: RestoreKind
    source_node_id: str
    # Whose snapshot: this rank's own (None), or, after an elastic resize, another rank's: every
    # rank of an elastic (data-parallel) job holds the same state.
    source_rank: int | None = None


@dataclass(frozen=True, slots=True)
class NodeRegistered:
    node_id: str
    incarnation: int
    role: NodeRole
    host: str
    peer_port: int
    gpus: int
    failure_domain: str = ""


@dataclass(frozen=True, slots=True)
class NodeSuspected:
    node_id: str
    reason: str
    silent_for_s: float


@dataclass(frozen=True, slots=True)
class NodeCleared:
    node_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeDeclaredDead:
    node_id: str
    reason: str
    silent_for_s: float
    cause: QuarantineCause = QuarantineCause.UNSPECIFIED  # one of the DEAD_* kinds (older records: inferred)


@dataclass(frozen=True, slots=True)
class NodeQuarantined:
    node_id: str
    reason: str
    evidence_seq: int
    cause: QuarantineCause = QuarantineCause.UNSPECIFIED


@dataclass(frozen=True, slots=True)
class GenerationStarted:
    generation: int
    members: tuple[RankAssignment, ...]
    world_size: int
    master_addr: str
    master_port: int
    restore_step: int | None
    restore_generation: int
    restores: tuple[RankRestore, ...]
    reason: str
    # The experiment record: what exactly ran in this generation (job spec hash, code, data).
    config_hash: str = ""
    code_version: str = ""
    data_version: str = ""


@dataclass(frozen=True, slots=True)
class GenerationRunning:
    generation: int
    first_step: int


@dataclass(frozen=True, slots=True)
class GenerationEnded:
    generation: int
    reason: EndReason
    node_id: str
    last_step: int
    detail: str
    # How long the culprit had been silent (no heartbeat, no step progress) when this verdict
    # came: the detection delay goodput accounting charges (0 when the failure reported itself).
    silent_for_s: float = 0.0
    # A rank's exit: which rank, its code (negative: the signal) and its last lines of output,
    # so the failure record carries the traceback a person needs (empty/None when not an exit).
    rank: int | None = None
    exit_code: int | None = None
    output_tail: str = ""


@dataclass(frozen=True, slots=True)
class SnapshotCommitted:
    generation: int
    step: int


@dataclass(frozen=True, slots=True)
class JobCompleted:
    generation: int
    step: int
    param_digest: str


@dataclass(frozen=True, slots=True)
class JobFailed:
    """The job gave up: its restart budget is spent. Names the last failure (the cause), so
    `supervisorctl status` and `ftsup run`'s exit code say why without reading logs."""

    generation: int  # the generation whose failure exhausted the budget
    cause: EndReason  # why that generation ended
    node_id: str
    rank: int | None
    exit_code: int | None
    detail: str
    output_tail: str
    restarts: int  # gang restarts made before giving up
    max_restarts: int


@dataclass(frozen=True, slots=True)
class XidReported:
    node_id: str
    pci: str
    gpu: int | None
    code: int
    action: XidAction
    message: str
    is_unknown: bool


@dataclass(frozen=True, slots=True)
class NodeUnquarantined:
    node_id: str
    reason: str
    operator: str


@dataclass(frozen=True, slots=True)
class NodeDrained:
    node_id: str
    reason: str
    operator: str


@dataclass(frozen=True, slots=True)
class StragglerDetected:
    node_id: str
    rank: int
    score: float
    window_steps: int
    slow_steps: int
    detail: str


@dataclass(frozen=True, slots=True)
class CheckpointStarted:
    checkpoint_id: str
    generation: int
    step: int
    shards: int
    location: str


@dataclass(frozen=True, slots=True)
class CheckpointRequested:
    """A checkpoint off the step cadence (an operator's `checkpoint now`, or the Young/Daly
    advice): ranks save at `step`, chosen far enough ahead that every rank hears of it first.
    Started like any checkpoint when the first report of `step` arrives; CheckpointAborted with
    the same id withdraws a request whose step passed without a start."""

    checkpoint_id: str
    generation: int
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class CheckpointShardWritten:
    checkpoint_id: str
    shard: int
    key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class CheckpointCommitted:
    checkpoint_id: str
    step: int
    manifest_key: str
    manifest_sha256: str = ""  # pins the manifest for restores; "" in records from before the pin


@dataclass(frozen=True, slots=True)
class CheckpointAborted:
    checkpoint_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SdcRankDigests:
    """One rank's digests at one step, as `node_id` computed them (the rank's node or a verifier)."""

    rank: int
    node_id: str
    grad_digest: str  # the rank's local gradients before the all-reduce
    param_digest: str = ""  # the parameters after the step; "" = not (re)computed


@dataclass(frozen=True, slots=True)
class SdcCheckStarted:
    """A recompute check: the verifier replays `step` of the ranks in `reported` from rank `rank`'s
    snapshot of step - 1; a confirmation (`confirms_check_id`) is a third node's second opinion."""

    check_id: str
    step: int
    rank: int
    suspect_node_id: str
    verifier_node_id: str
    generation: int = 0
    reason: str = ""
    confirms_check_id: str = ""
    reported: tuple[SdcRankDigests, ...] = ()
    first_recompute: tuple[SdcRankDigests, ...] = ()
    snapshot_holders: tuple[str, ...] = ()
    world_size: int = 0


@dataclass(frozen=True, slots=True)
class SdcCheckFinished:
    check_id: str
    verdict: SdcVerdict
    reported_digest: str
    recomputed_digest: str
    recomputed: tuple[SdcRankDigests, ...] = ()
    culprit_node_ids: tuple[str, ...] = ()  # quarantined right after this record
    detail: str = ""
    tainted_from_step: int | None = None  # set: this verdict taints steps from here on


@dataclass(frozen=True, slots=True)
class SdcSuspected:
    node_id: str
    rank: int
    step: int
    digest: str
    majority_digest: str
    generation: int = 0
    group_size: int = 0  # ranks that must hold this rank's bits; majority_digest "" = split


@dataclass(frozen=True, slots=True)
class OperatorCommand:
    command: str
    args: tuple[str, ...]
    operator: str  # the name the client claimed
    reason: str
    principal: str = ""  # who authenticated (certificate or token); "" in records from before it was kept


@dataclass(frozen=True, slots=True)
class LeaderElected:
    term: int
    address: str
    caught_up_seq: int


Event = (
    NodeRegistered
    | NodeSuspected
    | NodeCleared
    | NodeDeclaredDead
    | NodeQuarantined
    | GenerationStarted
    | GenerationRunning
    | GenerationEnded
    | SnapshotCommitted
    | JobCompleted
    | XidReported
    | NodeUnquarantined
    | NodeDrained
    | StragglerDetected
    | CheckpointStarted
    | CheckpointShardWritten
    | CheckpointCommitted
    | CheckpointAborted
    | SdcCheckStarted
    | SdcCheckFinished
    | SdcSuspected
    | OperatorCommand
    | LeaderElected
    | CheckpointRequested
    | JobFailed
)

EVENT_TYPES: tuple[type, ...] = Event.__args__


@dataclass(frozen=True, slots=True)
class Record:
    """An event as stored: its place in the log, the writer's term and the wall time it was appended."""

    seq: int
    term: int
    time_unix_s: float
    event: Event
