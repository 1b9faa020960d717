"""What the supervisor reacts to: messages from agents, the passage of time, stream changes.

Inputs are facts the shell observed; `decide` turns them into events. They are never logged
(heartbeats and step reports are soft state), which keeps the log to state changes only.
"""

from __future__ import annotations

import bisect
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from ftsup.supervisor.core.events import NodeRole, SdcRankDigests

Ranks = npt.NDArray[np.int64]  # ranks, positions, counts
Floats = npt.NDArray[np.float64]


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
    shard: str = ""  # the link shard (one that keeps alive) relaying this stream; "": none (see HeardFrom)
    takes_snapshot_retain: bool = False  # the agent takes SnapshotRetain for a commit (the shell's concern)


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
    refused: the summary speaks for many nodes at once, and being heard changes no decision.

    `shard` names a shard that keeps alive (sends a summary, empty if need be, every
    SHARD_KEEPALIVE_S): while such a shard is quiet, the silence of the nodes it holds is its own,
    not theirs (policies/failure.py). "" for a shard that does not, whose quiet proves nothing."""

    node_ids: tuple[str, ...]
    shard: str = ""


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


NOT_REPORTED = float("nan")  # one NaN object: reports that did not report a figure compare equal


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
    grad_norm: float = NOT_REPORTED  # NaN: not reported
    tokens: int = 0  # this rank's tokens in the step; 0: not reported
    local_grad_digest: str = ""  # its local gradients before the all-reduce; "": not reported
    replica_group: int | None = None  # the lowest rank holding the same shards; None: not reported


@dataclass(frozen=True, slots=True)
class DigestRanks:
    """A digest and the positions (indexes into its StepAggregate's arrays) of the ranks that
    reported it: replicas agree, so a step carries a handful of digests, not one per rank."""

    digest: str
    positions: Ranks


@dataclass(frozen=True, slots=True, eq=False)
class StepAggregate:
    """One training step of one node's ranks in one input, as arrays: an agent reports its node's
    ranks together and a link shard forwards each of its nodes' step as one, so the leader handles
    one input per node per step, and the detectors take the figures as arrays (issue 14). A
    single StepReport is observed as an aggregate of one (`of_reports`): one observation path.
    The leader's core also decides several nodes' aggregates of a step as one `fold` of them
    (`segments` says whose positions are whose; Core.step_aggregates).

    Per-rank values are parallel arrays in the order of `ranks` (each rank once); digests are
    grouped by value. Observed and decided exactly as its reports would be one by one
    (tests/unit/supervisor/test_step_aggregates.py). Its constructors (`of_reports`,
    server/step_aggregate.to_input) hand it read-only arrays: inputs are facts, and the core
    keeps views of them (not checked here: a flag read per array costs more than the rest of an
    aggregate of one)."""

    node_id: str
    generation: int
    step: int
    ranks: Ranks
    step_time_s: Floats
    compute_time_s: Floats
    loss: Floats
    grad_norm: Floats  # NaN: not reported
    tokens: Ranks  # 0: not reported
    param_digests: tuple[DigestRanks, ...]  # every position in exactly one group
    local_grad_digests: tuple[DigestRanks, ...]  # positions in no group (or in ""'s) reported none
    replica_groups: Ranks  # -1: not reported
    # A fold of several nodes' aggregates (`fold`): each node and the position its part ends at,
    # in order; `node_id` is the first's. Empty: every position is `node_id`'s (what arrives).
    segments: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.ranks)

    def node_ids(self) -> tuple[str, ...]:
        """The nodes whose reports these are, in order (one, unless this is a fold)."""
        return tuple(node for node, _ in self.segments) if self.segments else (self.node_id,)

    def node_at(self, index: int) -> str:
        """The node that reported position `index` (non-negative)."""
        if not self.segments:
            return self.node_id
        return self.segments[bisect.bisect_right(self.segments, index, key=_SEGMENT_END)][0]

    @classmethod
    def fold(cls, parts: Sequence[StepAggregate]) -> StepAggregate:
        """Several nodes' aggregates of one generation's step (each node once, none a fold) as
        one input whose positions are theirs in order: the core observes and decides it as the
        parts one by one (Core.step_aggregates), with the array work once for all of them."""
        if not parts:
            raise ValueError("a fold needs at least one aggregate")
        first = parts[0]
        if any((a.generation, a.step) != (first.generation, first.step) or a.segments for a in parts):
            raise ValueError("a fold holds aggregates (not folds) of one generation's step")
        if len({a.node_id for a in parts}) != len(parts):
            raise ValueError("a fold holds each node's aggregate once")
        segments, offsets, end = [], [], 0
        for part in parts:
            offsets.append(end)
            end += len(part.ranks)
            segments.append((part.node_id, end))
        ints: list[Ranks] = [np.concatenate([getattr(a, name) for a in parts]) for name in _INT_FIELDS]
        floats: list[Floats] = [np.concatenate([getattr(a, name) for a in parts]) for name in _FLOAT_FIELDS]
        for column in (*ints, *floats):
            column.flags.writeable = False
        ranks, tokens, groups = ints
        step_s, compute_s, loss, grad_norm = floats
        return cls(first.node_id, first.generation, first.step, ranks, step_s, compute_s, loss, grad_norm, tokens,
                   _merged(parts, offsets, "param_digests"), _merged(parts, offsets, "local_grad_digests"), groups,
                   tuple(segments))

    def parts(self) -> list[StepAggregate]:
        """A fold's parts (`segments`), each what its node's own message decodes to (equal reports,
        digest groups in the order of their first position): made only for a fold that is not
        decided whole (Core.step_fold: a part refused, a rank already reported in the step)."""
        if not self.segments:
            return [self]
        node_ids = [node for node, _ in self.segments]
        ends = np.fromiter((end for _, end in self.segments), dtype=np.int64, count=len(self.segments))
        counts = np.diff(ends, prepend=0)
        starts = ends - counts
        bounds = list(zip(starts.tolist(), ends.tolist()))
        part_params = _split_groups(self.param_digests, ends, starts, bounds, keep_whole=True)
        part_grads = _split_groups(self.local_grad_digests, ends, starts, bounds, keep_whole=False)
        columns = (self.ranks, self.step_time_s, self.compute_time_s, self.loss, self.grad_norm, self.tokens,
                   self.replica_groups)
        if bool((counts == counts[0]).all()):  # (every node as many ranks: its rows, faster than slices)
            shape = (len(counts), int(counts[0]))
            rows = zip(*(column.reshape(shape) for column in columns))
        else:
            rows = zip(*([column[a:b] for a, b in bounds] for column in columns))
        generation, step = self.generation, self.step
        return [StepAggregate(node, generation, step, r, t, c, lo, n, tk, p, g, gr)
                for node, (r, t, c, lo, n, tk, gr), p, g in zip(node_ids, rows, part_params, part_grads)]

    @classmethod
    def of_reports(cls, reports: Sequence[StepReport]) -> StepAggregate:
        """Reports of one node, generation and step (each rank once) as one aggregate."""
        if len(reports) == 1:
            return cls._of_one(reports[0])
        if not reports:
            raise ValueError("a step aggregate needs at least one report")
        first = reports[0]
        if any((r.node_id, r.generation, r.step) != (first.node_id, first.generation, first.step) for r in reports):
            raise ValueError("a step aggregate holds one node's reports of one generation's step")
        floats = np.array([[r.step_time_s for r in reports], [r.compute_time_s for r in reports],
                           [r.loss for r in reports], [r.grad_norm for r in reports]], dtype=np.float64)
        ints = np.array([[r.rank for r in reports], [r.tokens for r in reports],
                         [-1 if r.replica_group is None else r.replica_group for r in reports]], dtype=np.int64)
        floats.flags.writeable = ints.flags.writeable = False  # (its rows, below, are read-only views)
        return cls(first.node_id, first.generation, first.step, ints[0], floats[0], floats[1], floats[2], floats[3],
                   ints[1], _grouped([r.param_digest for r in reports], skip_empty=False),
                   _grouped([r.local_grad_digest for r in reports], skip_empty=True), ints[2])

    @classmethod
    def _of_one(cls, r: StepReport) -> StepAggregate:
        """One report as an aggregate of one: two small arrays and views of them (a StepReport
        from an agent that does not aggregate takes this path once per rank)."""
        # (frombuffer over packed bytes: read-only from birth, which setting the flag costs as much as)
        floats = np.frombuffer(_FOUR_DOUBLES(r.step_time_s, r.compute_time_s, r.loss, r.grad_norm), np.float64)
        ints = np.frombuffer(_THREE_INTS(r.rank, r.tokens, -1 if r.replica_group is None else r.replica_group),
                             np.int64)
        grads = (DigestRanks(r.local_grad_digest, _FIRST),) if r.local_grad_digest else ()
        return cls(r.node_id, r.generation, r.step, ints[0:1], floats[0:1], floats[1:2], floats[2:3], floats[3:4],
                   ints[1:2], (DigestRanks(r.param_digest, _FIRST),), grads, ints[2:3])

    def report(self, index: int) -> StepReport:
        """The report at `index` (negative counts from the end), made when asked."""
        index = range(len(self.ranks))[index]
        group: int = self.replica_groups.item(index)  # (.item: a Python scalar without a numpy one)
        loss: float = self.loss.item(index)
        grad_norm: float = self.grad_norm.item(index)
        return StepReport(
            self.node_at(index), self.generation, self.ranks.item(index), self.step, self.step_time_s.item(index),
            self.compute_time_s.item(index), loss if loss == loss else NOT_REPORTED,
            _digest_at(self.param_digests, index), grad_norm if grad_norm == grad_norm else NOT_REPORTED,
            self.tokens.item(index), _digest_at(self.local_grad_digests, index),
            None if group < 0 else group,
        )

    def reports(self) -> tuple[StepReport, ...]:
        """Every rank's report, in order (tests, diagnostics: O(ranks) objects, never on the step path)."""
        return tuple(self.report(i) for i in range(len(self.ranks)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepAggregate):
            return NotImplemented
        return self.reports() == other.reports()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        nodes = f"node_ids={list(self.node_ids())!r}" if self.segments else f"node_id={self.node_id!r}"
        return f"StepAggregate({nodes}, generation={self.generation}, step={self.step}, ranks={self.ranks.tolist()})"


_FOUR_DOUBLES, _THREE_INTS = struct.Struct("=4d").pack, struct.Struct("=3q").pack
_SEGMENT_END = operator.itemgetter(1)  # a fold's segment (node, end) -> its end
_FIRST = np.zeros(1, dtype=np.int64)  # the one position of an aggregate of one (shared, read-only)
_FIRST.flags.writeable = False


def _grouped(digests: list[str], *, skip_empty: bool) -> tuple[DigestRanks, ...]:
    by_value: dict[str, list[int]] = {}
    for position, digest in enumerate(digests):
        if digest or not skip_empty:
            by_value.setdefault(digest, []).append(position)
    return tuple(DigestRanks(d, _read_only(np.array(p, dtype=np.int64))) for d, p in by_value.items())


def _read_only(array: Ranks) -> Ranks:
    array.flags.writeable = False
    return array


def _split_groups(groups: tuple[DigestRanks, ...], ends: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], bounds: list[tuple[int, int]], *,
           keep_whole: bool) -> list[tuple[DigestRanks, ...]]:
    """Each part's digest groups (positions its own), as server/step_aggregate.to_input makes them
    of the part's message: ordered by their first position (as the agents and shards pack them)."""
    parts = len(bounds)
    if not groups:
        return [()] * parts
    if len(groups) == 1 and len(groups[0].positions) == int(ends[-1]) and keep_whole:
        whole = groups[0].positions
        if bool((whole == np.arange(len(whole))).all()):  # the usual step: one digest, every rank, in order
            digest = groups[0].digest
            shared: dict[int, tuple[DigestRanks, ...]] = {}  # (one tuple per part size: inputs are read-only)
            return [shared.get(b - a) or shared.setdefault(b - a, (DigestRanks(digest, _read_only_range(b - a)),))
                    for a, b in bounds]
    sizes = [len(g.positions) for g in groups]
    positions = np.concatenate([g.positions for g in groups])
    group_of = np.repeat(np.arange(len(groups)), sizes)
    part_of = np.searchsorted(ends, positions, side="right")
    local = positions - starts[part_of]
    order = np.lexsort((group_of, part_of))  # by part, then group; each group's positions in their order
    part_sorted, group_sorted, local_sorted = part_of[order], group_of[order], local[order]
    keys = part_sorted * len(groups) + group_sorted
    cuts = np.flatnonzero(np.diff(keys)) + 1
    out: list[list[tuple[int, DigestRanks]]] = [[] for _ in range(parts)]
    for chunk_start, chunk_end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(keys)]):
        part = int(part_sorted[chunk_start])
        mine = local_sorted[chunk_start:chunk_end].copy()
        mine.flags.writeable = False
        out[part].append((int(mine.min()), DigestRanks(groups[int(group_sorted[chunk_start])].digest, mine)))
    return [tuple(group for _, group in sorted(each, key=lambda first_group: first_group[0])) for each in out]


def _read_only_range(count: int) -> npt.NDArray[np.int64]:
    """0 .. count-1, read-only: the positions of a digest every rank of a part reported."""
    positions = np.arange(count, dtype=np.int64)
    positions.flags.writeable = False
    return positions


def _merged(parts: Sequence[StepAggregate], offsets: list[int], field: str) -> tuple[DigestRanks, ...]:
    """The parts' digest groups of `field` as one fold's: each value once, in the order values
    first appear, its positions moved by their part's offset (the usual step, one digest every
    rank reported, stays one group over every position in order)."""
    by_value: dict[str, list[Ranks]] = {}
    for part, offset in zip(parts, offsets):
        for group in getattr(part, field):
            by_value.setdefault(group.digest, []).append(group.positions + offset)
    return tuple(DigestRanks(d, _read_only(np.concatenate(arrays))) for d, arrays in by_value.items())


_INT_FIELDS = ("ranks", "tokens", "replica_groups")
_FLOAT_FIELDS = ("step_time_s", "compute_time_s", "loss", "grad_norm")


def _digest_at(groups: tuple[DigestRanks, ...], position: int) -> str:
    if len(groups) == 1 and len(groups[0].positions) > position and groups[0].positions[position] == position:
        return groups[0].digest  # (the usual aggregate: one digest, every position in order)
    for group in groups:
        if np.any(group.positions == position):
            return group.digest
    return ""


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
    """One node's snapshot holdings of one step in one input: what its SnapshotReports one by one
    would say, as the columns the wire carries (a rank, its payload's size and SHA-256 at each
    position), so the leader handles one input per node per step instead of one per rank and holder
    (issue 14) and builds no object per entry. The sender holds every entry: a holding names no
    other node, generation or step, so none can contradict the message's. Observed and decided
    exactly as its reports one by one (tests/unit/supervisor/test_snapshot_holdings.py); refused
    whole when any entry would be."""

    node_id: str
    generation: int
    step: int
    ranks: tuple[int, ...]
    size_bytes: tuple[int, ...]
    sha256: tuple[str, ...]

    @classmethod
    def of_reports(cls, reports: Sequence[SnapshotReport]) -> SnapshotHoldings:
        """Reports of one holder, generation and step as one input (tests, the simulator, an
        agent's own holdings)."""
        if not reports:
            raise ValueError("snapshot holdings need at least one report")
        first = reports[0]
        if any((r.node_id, r.generation, r.step) != (first.node_id, first.generation, first.step) for r in reports):
            raise ValueError("snapshot holdings hold one node's reports of one generation's step")
        return cls(first.node_id, first.generation, first.step, tuple(r.rank for r in reports),
                   tuple(r.size_bytes for r in reports), tuple(r.sha256 for r in reports))

    def reports(self) -> tuple[SnapshotReport, ...]:
        """Each entry as the SnapshotReport its holder would send alone (tests, diagnostics)."""
        holder = (self.node_id,)
        return tuple(SnapshotReport(self.node_id, self.generation, rank, self.step, holder, size, sha)
                     for rank, size, sha in zip(self.ranks, self.size_bytes, self.sha256))


@dataclass(frozen=True, slots=True, eq=False)
class HoldingsFold:
    """Several nodes' SnapshotHoldings of one step, each node once, as the columns a link shard's
    ShardHoldingsFold carries (issue 14): the first `counts[0]` entries are `node_ids[0]`'s, the
    next `counts[1]` the next node's, and so on. Not an input of its own: decided as its parts one
    by one would be (Core.step_holdings_fold), with no object per part or entry when every part
    is admitted and none completes the step, which is the usual fold."""

    node_ids: tuple[str, ...]
    generation: int
    step: int
    counts: tuple[int, ...]
    ranks: npt.NDArray[np.int64]
    size_bytes: npt.NDArray[np.int64]
    sha256: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.node_ids)

    @classmethod
    def of_parts(cls, parts: Sequence[SnapshotHoldings]) -> HoldingsFold:
        """Holdings of one generation's step, each of another node, as one fold."""
        first = parts[0]
        if any((p.generation, p.step) != (first.generation, first.step) for p in parts):
            raise ValueError("a holdings fold holds one generation's step")
        total = sum(len(p.ranks) for p in parts)
        return cls(tuple(p.node_id for p in parts), first.generation, first.step, tuple(len(p.ranks) for p in parts),
                   np.fromiter((r for p in parts for r in p.ranks), dtype=np.int64, count=total),
                   np.fromiter((b for p in parts for b in p.size_bytes), dtype=np.int64, count=total),
                   tuple(sha for p in parts for sha in p.sha256))

    def part(self, index: int) -> SnapshotHoldings:
        """One node's SnapshotHoldings (`index` may count from the end)."""
        index %= len(self.node_ids)
        start = sum(self.counts[:index])
        end = start + self.counts[index]
        return SnapshotHoldings(self.node_ids[index], self.generation, self.step,
                                tuple(self.ranks[start:end].tolist()), tuple(self.size_bytes[start:end].tolist()),
                                self.sha256[start:end])

    def parts(self) -> list[SnapshotHoldings]:
        """Each node's SnapshotHoldings, as its own message would have been decoded."""
        ranks, sizes = self.ranks.tolist(), self.size_bytes.tolist()
        parts, start = [], 0
        for node_id, count in zip(self.node_ids, self.counts):
            end = start + count
            parts.append(SnapshotHoldings(node_id, self.generation, self.step, tuple(ranks[start:end]),
                                          tuple(sizes[start:end]), self.sha256[start:end]))
            start = end
        return parts


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
class AgentGone:
    """After `stream_id` closed, the node's peer port refused a TCP connection: nothing listens
    there, so the agent process is gone (a killed or crashed node's kernel answers at once), and
    it cannot be back within the reconnect grace (an agent starts in seconds). The runtime probes
    (supervisor/agent_probe.py); the detector then declares the node dead without waiting out the
    grace. Stale for a stream that is no longer the node's last closed one."""

    node_id: str
    incarnation: int
    stream_id: int
    detail: str


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
    | AgentGone
    | Tick
    | LeadershipAcquired
    | CheckpointShardReport
    | CheckpointCommitResult
    | SdcCheckResult
    | SnapshotMemoryReport
)
