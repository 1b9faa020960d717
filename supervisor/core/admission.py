"""Which inputs the supervisor refuses before deciding anything, and why.

A refusal is answered on the sender's stream and logged; it never becomes an event and never
crashes the supervisor. Checks here are about the *message* (who sent it, is it current, are its
numbers sane), not about what to do with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ftsup.common.node_id import node_id_problem
from ftsup.supervisor.core import checkpoints
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.inputs import (
    AgentGone,
    AgentHello,
    CheckpointCommitResult,
    CheckpointShardReport,
    HeardFrom,
    Heartbeat,
    HoldingsFold,
    Input,
    LeadershipAcquired,
    OperatorCommandKind,
    OperatorRequest,
    RankFinished,
    SdcCheckResult,
    SnapshotHoldings,
    SnapshotMemoryReport,
    SnapshotReport,
    StepAggregate,
    StepReport,
    StreamClosed,
    Tick,
    TrainerExit,
    TrainerHung,
    XidReport,
)
from ftsup.supervisor.core.limits import (
    MAX_AGGREGATE_REPORTS,
    MAX_DIGEST,
    MAX_HEARD_NODES,
    MAX_HUNG_S,
    MAX_PCI_BUS_ID,
    MAX_RANKS_PER_NODE_REPORT,
    MAX_SHARD_NAME,
    MAX_SNAPSHOT_MEMORY_BYTES,
    MAX_STEP,
    MAX_STEP_TIME_S,
    MAX_TEXT,
    MAX_TOKENS_PER_STEP,
    MAX_XID_CODE,
    SNAPSHOT_MEMORY_BASES,
)
from ftsup.supervisor.core.state import ClusterState, SoftState


def refusal(state: ClusterState, soft: SoftState, inp: Input, config: CoreConfig) -> str | None:
    """Returns why `inp` must be refused, or None to accept it."""
    step = getattr(inp, "step", None)
    if step is None:
        step = getattr(inp, "last_step", None)
    if isinstance(step, int) and not 0 <= step <= MAX_STEP:
        return f"step {step} is outside [0, {MAX_STEP}]: not a step count"
    match inp:
        case AgentHello():
            return _check_hello(soft, inp, config)
        case Tick() | StreamClosed() | AgentGone():
            return None
        case LeadershipAcquired():
            return None if inp.term > 0 else f"term {inp.term} is not a term: terms start at 1"
        case StepReport():
            return _check_sender(state, soft, inp.node_id) or _check_step_report(state, inp)
        case StepAggregate():
            return _check_aggregate(state, soft, inp)
        case SnapshotReport():
            return _check_sender(state, soft, inp.node_id) or _check_holder(state, inp)
        case SnapshotHoldings():
            return _check_sender(state, soft, inp.node_id) or _check_holdings(state, inp)
        case RankFinished():
            return (_check_sender(state, soft, inp.node_id) or _check_rank(state, inp.node_id, inp.generation, inp.rank)
                    or _check_not_finished(soft, inp))
        case Heartbeat():
            return _check_sender(state, soft, inp.node_id)
        case HeardFrom():
            if len(inp.node_ids) > MAX_HEARD_NODES:
                return f"liveness summary names {len(inp.node_ids)} nodes (at most {MAX_HEARD_NODES})"
            if len(inp.shard) > MAX_SHARD_NAME:
                return f"liveness summary's shard name has {len(inp.shard)} characters (at most {MAX_SHARD_NAME})"
            return None  # nodes the core does not know are skipped by observe
        case TrainerExit():
            return _check_sender(state, soft, inp.node_id) or _check_exit(state, inp)
        case XidReport():
            return _check_sender(state, soft, inp.node_id) or _check_xid(inp)
        case TrainerHung():
            return (_check_sender(state, soft, inp.node_id) or _check_hung_times(inp)
                    or _check_rank(state, inp.node_id, inp.generation, inp.rank))
        case OperatorRequest():
            return _check_operator(state, soft, inp, config)
        case CheckpointShardReport():
            return _check_sender(state, soft, inp.node_id) or _check_rank(state, inp.node_id, inp.generation, inp.rank)
        case CheckpointCommitResult():
            return None  # the shell's own result
        case SdcCheckResult():
            return _check_sender(state, soft, inp.node_id) or _check_sdc_result(state, inp)
        case SnapshotMemoryReport():
            return _check_sender(state, soft, inp.node_id) or _check_snapshot_memory(inp)
    return f"unsupported input {type(inp).__name__}"


def _check_snapshot_memory(report: SnapshotMemoryReport) -> str | None:
    if report.basis not in SNAPSHOT_MEMORY_BASES:
        return f"snapshot memory basis {report.basis[:40]!r} is not one of {', '.join(sorted(SNAPSHOT_MEMORY_BASES))}"
    sizes = (report.limit_bytes, report.derived_bytes or 0)
    if not all(0 <= size <= MAX_SNAPSHOT_MEMORY_BYTES for size in sizes) or not 0 <= report.ranks <= MAX_RANKS_PER_NODE_REPORT:
        return (f"snapshot memory figures out of range: limit {report.limit_bytes}, derived {report.derived_bytes},"
                f" ranks {report.ranks} (bytes within [0, {MAX_SNAPSHOT_MEMORY_BYTES}], ranks within"
                f" [0, {MAX_RANKS_PER_NODE_REPORT}])")
    return None


def _check_hello(soft: SoftState, hello: AgentHello, config: CoreConfig) -> str | None:
    # The server refuses the same ids first (server/hello_checks.py); the core refuses them too so
    # that no path into it (the simulator, a relay, a test driver) admits a second spelling.
    if (problem := node_id_problem(hello.node_id)) is not None:
        return problem
    if config.allowed_nodes and hello.node_id not in config.allowed_nodes:
        return f"unknown node id {hello.node_id!r}: it is not in the supervisor's allowed node list"
    if not (0 < hello.peer_port < 65536):
        return f"peer port {hello.peer_port} of node {hello.node_id!r} is not a valid port"
    if not hello.host:
        return f"node {hello.node_id!r} gave no host address"
    if len(hello.shard) > MAX_SHARD_NAME:
        return f"the shard name relaying node {hello.node_id!r} has {len(hello.shard)} characters (at most {MAX_SHARD_NAME})"
    existing = soft.nodes.get(hello.node_id)
    if existing is not None and existing.stream_id is not None and existing.incarnation != hello.incarnation:
        return (
            f"duplicate node id {hello.node_id!r}: another agent (incarnation {existing.incarnation})"
            " is connected with it; give each node a unique --node-id"
        )
    return None


def _check_sender(state: ClusterState, soft: SoftState, node_id: str) -> str | None:
    if state.node(node_id) is None or node_id not in soft.nodes:
        return f"node {node_id!r} has not said Hello on this supervisor"
    return None


def _check_rank(state: ClusterState, node_id: str, generation: int, rank: int) -> str | None:
    current = state.generation
    if current is None or current.number != generation:
        now_gen = current.number if current else "none"
        return f"stale generation {generation} (the generation in force is {now_gen})"
    member = current.member(node_id)
    if member is None or rank not in member.ranks:
        return f"node {node_id!r} does not hold rank {rank} in generation {generation}"
    return None


def _check_exit(state: ClusterState, exit_: TrainerExit) -> str | None:
    """An exit of an older generation is the normal tail of a restart (accepted, changes nothing);
    one of a generation never started, or of a rank the sender does not run, would end the
    generation in force on someone else's behalf (found by the issue-8 fuzz test)."""
    if exit_.generation > state.last_generation:
        return f"generation {exit_.generation} was never started (the newest is {state.last_generation})"
    current = state.generation
    if current is not None and current.number == exit_.generation:
        return _check_rank(state, exit_.node_id, exit_.generation, exit_.rank)
    return None


def _check_hung_times(hung: TrainerHung) -> str | None:
    for name in ("silent_for_s", "limit_s"):
        value = getattr(hung, name)
        if not (math.isfinite(value) and 0.0 <= value <= MAX_HUNG_S):
            return f"{name}={value!r} is not a finite number of seconds within [0, {MAX_HUNG_S:g}]"
    return None


def _check_not_finished(soft: SoftState, report: RankFinished) -> str | None:
    """A rank finishes once. Agents re-send RankFinished after a reconnect (a no-op, accepted), but a
    repeat with another digest would rewrite the job's final digest: refused."""
    progress = soft.progress
    if progress is None or progress.generation != report.generation:
        return None
    earlier = progress.finished.get(report.rank)
    if earlier is not None and earlier != report.param_digest:
        return (f"rank {report.rank} already finished generation {report.generation} with digest {earlier!r};"
                f" a repeat with digest {report.param_digest!r} is refused")
    return None


def _check_holder(state: ClusterState, report: SnapshotReport) -> str | None:
    """A rank's snapshot is held by the node running the rank and by that node's buddy."""
    current = state.generation
    if current is None or current.number != report.generation:
        now_gen = current.number if current else "none"
        return f"stale generation {report.generation} (the generation in force is {now_gen})"
    holders = current.index.may_hold().get(report.rank)
    if holders is None or report.node_id not in holders:
        return f"node {report.node_id!r} is neither the owner nor the buddy of rank {report.rank}"
    if len(report.sha256) > MAX_DIGEST:  # kept per rank and step in soft state: bounded
        return f"sha256 of {len(report.sha256)} characters is longer than {MAX_DIGEST}"
    return None


def _check_holdings(state: ClusterState, holdings: SnapshotHoldings) -> str | None:
    """Every entry passes `_check_holder`, as it would alone; the whole message is refused at the
    first that does not, naming its rank, so nothing of a bad message is half-held. The usual
    message (all good) is checked whole: one subset test of its ranks against those the sender
    may hold; only a refusal walks the entries, to name the first bad one."""
    ranks = holdings.ranks
    if not ranks:
        return "snapshot holdings with no ranks"
    if len(ranks) > MAX_RANKS_PER_NODE_REPORT:
        return f"snapshot holdings of {len(ranks)} ranks (at most {MAX_RANKS_PER_NODE_REPORT})"
    if len(holdings.size_bytes) != len(ranks) or len(holdings.sha256) != len(ranks):
        name, values = ("size_bytes", holdings.size_bytes) if len(holdings.size_bytes) != len(ranks) else (
            "sha256", holdings.sha256)
        return f"{name} has {len(values)} values for {len(ranks)} ranks"
    current = state.generation
    if (current is not None and current.number == holdings.generation and len(set(ranks)) == len(ranks)
            and current.index.holdable().get(holdings.node_id, frozenset()).issuperset(ranks)
            and max(map(len, holdings.sha256)) <= MAX_DIGEST):
        return None
    seen: set[int] = set()
    for report in holdings.reports():
        if report.rank in seen:
            return f"rank {report.rank} is held twice in one snapshot holdings message"
        seen.add(report.rank)
        reason = _check_holder(state, report)
        if reason is not None:
            return f"rank {report.rank}: {reason}"
    return None


def admits_fold(state: ClusterState, soft: SoftState, fold: HoldingsFold) -> bool:
    """Every part of a fold of SnapshotHoldings (each node once) passes what `refusal` asks of it
    alone, except the holder slots of its entries, which `step_holdings.locate` checks for all
    entries at once: the generation in force, a step count, senders that said Hello, parts of
    1..MAX_RANKS_PER_NODE_REPORT entries with every column as long, digests within bounds.
    False: ask `refusal` part by part, to name what is wrong."""
    current = state.generation
    counts = fold.counts
    total = sum(counts)
    return (current is not None and current.number == fold.generation and 0 <= fold.step <= MAX_STEP
            and len(counts) == len(fold.node_ids) and bool(counts)
            and min(counts) > 0 and max(counts) <= MAX_RANKS_PER_NODE_REPORT
            and len(fold.ranks) == len(fold.size_bytes) == len(fold.sha256) == total
            and max(map(len, fold.sha256)) <= MAX_DIGEST
            and _distinct_senders_known(state, soft, fold.node_ids))


def _check_xid(report: XidReport) -> str | None:
    if not 0 < report.code <= MAX_XID_CODE:
        return f"Xid code {report.code} is outside 1..{MAX_XID_CODE}"
    if len(report.message) > MAX_TEXT:
        return f"Xid report of {len(report.message)} characters is longer than {MAX_TEXT}"
    if len(report.pci) > MAX_PCI_BUS_ID:
        return f"Xid PCI bus id of {len(report.pci)} characters is longer than {MAX_PCI_BUS_ID}"
    return None


OPERATOR_COMMANDS = tuple(kind.value for kind in OperatorCommandKind)


def _check_operator(state: ClusterState, soft: SoftState, request: OperatorRequest, config: CoreConfig) -> str | None:
    if request.command not in OPERATOR_COMMANDS:
        return f"unknown command {request.command!r}; one of {', '.join(OPERATOR_COMMANDS)}"
    if request.command == "restart":
        return _check_restart(state, request)
    if request.command == "checkpoint":
        if not request.reason.strip() or len(request.reason) > MAX_TEXT:
            return "a reason is required (it is recorded in the event log), at most 4096 characters"
        if request.node_id:
            return f"a checkpoint covers the whole job, not node {request.node_id!r}"
        return checkpoints.request_refusal(state, soft, config)
    node = state.node(request.node_id)
    if node is None:
        known = ", ".join(sorted(state.nodes)) or "none"
        return f"unknown node {request.node_id!r} (known: {known})"
    if not request.reason.strip() or len(request.reason) > MAX_TEXT:
        return "a reason is required (it is recorded in the event log), at most 4096 characters"
    if request.command == "quarantine" and node.is_quarantined:
        return f"node {request.node_id!r} is already quarantined: {node.quarantine_reason}"
    if request.command == "drain" and node.is_drained:
        return f"node {request.node_id!r} is already drained"
    if request.command == "unquarantine" and node.is_in_service:
        return f"node {request.node_id!r} is neither quarantined nor drained"
    return None


def _check_restart(state: ClusterState, request: OperatorRequest) -> str | None:
    if not request.reason.strip() or len(request.reason) > MAX_TEXT:
        return "a reason is required (it is recorded in the event log), at most 4096 characters"
    if request.node_id:
        return f"restart applies to the whole job, not to node {request.node_id!r}"
    if state.completion is not None:
        return "the job has completed; there is nothing to restart"
    if state.generation is None:
        return "no generation is in force (see `supervisorctl status` for what the job waits for); nothing to restart"
    return None


def _check_sdc_result(state: ClusterState, result: SdcCheckResult) -> str | None:
    """Only the check's verifier answers it, once, for the ranks it was asked to replay."""
    check = next((c for c in state.sdc_checks if c.check_id == result.check_id), None)
    if check is None:
        return f"SDC check {result.check_id!r} is not open (finished, timed out, or never started)"
    if result.node_id != check.verifier_node_id:
        return f"SDC check {result.check_id!r} was given to {check.verifier_node_id!r}, not {result.node_id!r}"
    if (result.step, result.rank) != (check.step, check.rank):
        return (f"SDC check {result.check_id!r} replays rank {check.rank} step {check.step},"
                f" not rank {result.rank} step {result.step}")
    asked = {d.rank for d in check.reported}
    ranks = [d.rank for d in result.recomputed]
    if len(set(ranks)) != len(ranks) or not set(ranks) <= asked:
        return f"SDC check {result.check_id!r} asked for ranks {sorted(asked)}, got {ranks}"
    for d in result.recomputed:
        if len(d.grad_digest) > MAX_DIGEST or len(d.param_digest) > MAX_DIGEST or d.node_id != result.node_id:
            return f"SDC check {result.check_id!r}: rank {d.rank}'s digests are malformed or not the verifier's own"
    if len(result.error) > MAX_TEXT:
        return f"SDC check error of {len(result.error)} characters is longer than {MAX_TEXT}"
    if not result.error and not ranks:
        return f"SDC check {result.check_id!r}: an answer needs digests or an error"
    return None


def _check_aggregate(state: ClusterState, soft: SoftState, aggregate: StepAggregate) -> str | None:
    """An aggregate is refused whole, naming the first rank at fault: its sender holds the reports
    and can send the good ones again; a half-applied step would mislead the vote.

    Checked at once (issue 14): the sender and its member record looked up once, its ranks as a
    set, every figure against its limit with numpy; only the first rank at fault is then checked
    as a lone report, so the message is the one a StepReport of it gets."""
    count = len(aggregate)
    if count == 0:
        return "a step aggregate with no reports"
    if aggregate.segments:  # (made by the core from admitted parts: Core.step_aggregates; never received)
        return "a fold of several nodes' step aggregates is not an input"
    if count > MAX_AGGREGATE_REPORTS:
        return f"a step aggregate of {count} reports is larger than any world ({MAX_AGGREGATE_REPORTS})"
    ranks = aggregate.ranks
    sender = _check_sender(state, soft, aggregate.node_id)
    if sender is not None:
        return f"rank {int(ranks[0])} of node {aggregate.node_id!r}: {sender}"
    listed = ranks.tolist()
    held = _held_ranks(state, aggregate)
    if len(set(listed)) == count and held.issuperset(listed) and _within_limits(aggregate):
        return None  # (the usual aggregate: a handful of reductions, no mask per rank)
    if held:
        first_twice = _first_repeat(listed)
        at_fault = np.flatnonzero(_faults(aggregate, held))
        first_bad = int(at_fault[0]) if len(at_fault) else count
        if first_twice is not None and first_twice <= first_bad:
            return f"rank {listed[first_twice]} is reported twice in one step aggregate"
        if first_bad == count:
            return None
    else:
        # The sender holds no rank of it (a generation that ended: a failure's tail, every node's
        # last step arriving after the end), so every position is at fault and the first is
        # the first rank, before any repeat; no mask per rank (at 12,500 nodes that tail is
        # 12,500 aggregates, each refused while the leader plans the next generation).
        first_bad = 0
    report = aggregate.report(first_bad)
    reason = _check_step_report(state, report) or "refused"  # (the vector and scalar checks agree)
    return f"rank {report.rank} of node {aggregate.node_id!r}: {reason}"


def fold_refusals(state: ClusterState, soft: SoftState, parts: Sequence[StepAggregate], config: CoreConfig,
                  folded: StepAggregate | None = None) -> tuple[list[str | None], StepAggregate | None]:
    """What `refusal` says of each of several nodes' aggregates of one step (Core.step_aggregates),
    and their fold when every part is admitted. Checked at once (issue 14): per part only what
    names its sender (its Hello, the ranks it holds, each rank once), then the figures' limits by
    one set of reductions over the whole fold: within limits over the fold is within limits for
    each part (every limit is a bound on a minimum, a maximum or an "all"). Any part that fails a
    check, or a fold outside the limits, has each part checked alone, so every refusal is worded
    as `refusal` words it. `folded`: StepAggregate.fold(parts), when the caller has it already."""
    first = parts[0]
    if not 0 <= first.step <= MAX_STEP or any((p.generation, p.step) != (first.generation, first.step) for p in parts):
        return [refusal(state, soft, part, config) for part in parts], None
    for part in parts:
        count = len(part)
        if count == 0 or count > MAX_AGGREGATE_REPORTS or part.segments:
            break
        if _check_sender(state, soft, part.node_id) is not None:
            break
        listed = part.ranks.tolist()
        if len(set(listed)) != count or not _held_ranks(state, part).issuperset(listed):
            break
    else:
        fold = folded if folded is not None and len(folded.segments) == len(parts) else StepAggregate.fold(parts)
        if _within_limits(fold):
            return [None] * len(parts), fold
    return [refusal(state, soft, part, config) for part in parts], None


def admits_step_fold(state: ClusterState, soft: SoftState, fold: StepAggregate) -> bool:
    """Every part of a link shard's step fold (its `segments`, each node once) passes what
    `refusal` asks of it alone, checked on the fold's arrays (issue 14, part 15): the generation
    in force and a step count, senders that said Hello, parts of 1..MAX_AGGREGATE_REPORTS ranks,
    each rank's owner in the generation its part's node (HolderSlots) and no rank twice, every
    figure within its limits. False: ask `fold_refusals` part by part, to name what is wrong."""
    current, segments = state.generation, fold.segments
    if current is None or current.number != fold.generation or not 0 <= fold.step <= MAX_STEP or len(segments) < 2:
        return False
    node_ids = [node for node, _ in segments]
    if not _distinct_senders_known(state, soft, node_ids):
        return False
    slots = current.index.holder_slots()
    ranks = fold.ranks
    if not (slots.exact and slots.dense) or len(ranks) == 0:
        return False  # (other layouts: the members' rule, part by part)
    ends = np.fromiter((end for _, end in segments), dtype=np.int64, count=len(segments))
    counts = np.diff(ends, prepend=0)
    if int(counts.min()) < 1 or int(counts.max()) > MAX_AGGREGATE_REPORTS or int(ends[-1]) != len(ranks):
        return False
    if int(ranks.min()) < 0 or int(ranks.max()) >= slots.size:
        return False
    numbers = slots.numbers
    senders = np.fromiter((numbers.get(node, -2) for node in node_ids), dtype=np.int64, count=len(node_ids))
    if not bool((slots.owner_of[ranks] == np.repeat(senders, counts)).all()):
        return False  # (a rank its part's node does not hold: a buddy or a stranger owns no rank)
    if not slots.distinct(ranks):  # (dense: a rank is its position)
        return False  # (owners differ across parts, so a repeat is within one part)
    return _within_limits(fold)


def _distinct_senders_known(state: ClusterState, soft: SoftState, node_ids: Sequence[str]) -> bool:
    """Whether `node_ids` are distinct and each passes `_check_sender` (said Hello on this
    supervisor): two set comparisons in C instead of a call per node (a fold of thousands)."""
    named = set(node_ids)
    return len(named) == len(node_ids) and state.nodes.keys() >= named and soft.nodes.keys() >= named


def _held_ranks(state: ClusterState, aggregate: StepAggregate) -> frozenset[int]:
    """The ranks the sender holds in the aggregate's generation (none if that is not the one in force)."""
    current = state.generation
    if current is None or current.number != aggregate.generation:
        return frozenset()
    member = current.member(aggregate.node_id)
    return frozenset(member.ranks) if member is not None else frozenset()


def _first_repeat(ranks: list[int]) -> int | None:
    """The position of the first rank that repeats an earlier one, or None."""
    seen: set[int] = set()
    for position, rank in enumerate(ranks):
        if rank in seen:
            return position
        seen.add(rank)
    return None


def _within_limits(aggregate: StepAggregate) -> bool:
    """Every figure within its limit, by reductions over the arrays (NaN fails every comparison)."""
    step_s, compute_s, tokens = aggregate.step_time_s, aggregate.compute_time_s, aggregate.tokens
    lowest_norm = np.fmin.reduce(aggregate.grad_norm)  # NaN only when no rank reported one
    return bool(
        step_s.min() >= 0.0 and step_s.max() <= MAX_STEP_TIME_S
        and compute_s.min() >= 0.0 and compute_s.max() <= MAX_STEP_TIME_S
        and bool((compute_s <= step_s + 1e-3).all())  # (the scalar check's own arithmetic)
        and not lowest_norm < 0.0
        and tokens.min() >= 0 and tokens.max() <= MAX_TOKENS_PER_STEP
        and (aggregate.replica_groups - aggregate.ranks).max() <= 0
        and all(len(group.digest) <= MAX_DIGEST for group in aggregate.local_grad_digests)
    )


def _faults(aggregate: StepAggregate, held: frozenset[int]) -> npt.NDArray[np.bool_]:
    """Per position: does `_check_step_report` refuse that rank's report? (The same limits, vectorized.)"""
    step_s, compute_s = aggregate.step_time_s, aggregate.compute_time_s
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(step_s) & (step_s >= 0.0) & (step_s <= MAX_STEP_TIME_S))
        bad |= ~(np.isfinite(compute_s) & (compute_s >= 0.0) & (compute_s <= MAX_STEP_TIME_S))
        bad |= compute_s > step_s + 1e-3
        bad |= aggregate.grad_norm < 0.0  # NaN (unknown, or a diverged step) and inf are the trainer's truth
    bad |= (aggregate.tokens < 0) | (aggregate.tokens > MAX_TOKENS_PER_STEP)
    for group in aggregate.local_grad_digests:
        if len(group.digest) > MAX_DIGEST:
            bad[group.positions] = True
    groups = aggregate.replica_groups
    bad |= (groups >= 0) & (groups > aggregate.ranks)
    bad |= np.array([rank not in held for rank in aggregate.ranks.tolist()], dtype=np.bool_).reshape(-1)
    return bad


def _check_step_report(state: ClusterState, report: StepReport) -> str | None:
    for name in ("step_time_s", "compute_time_s"):
        value = getattr(report, name)
        if not (math.isfinite(value) and 0.0 <= value <= MAX_STEP_TIME_S):
            return f"{name}={value!r} is not a finite number of seconds within [0, {MAX_STEP_TIME_S:g}]"
    if report.compute_time_s > report.step_time_s + 1e-3:
        return f"compute_time_s={report.compute_time_s} exceeds step_time_s={report.step_time_s}"
    if report.grad_norm < 0.0:  # NaN (unknown, or a diverged step) and inf are the trainer's truth
        return f"grad_norm={report.grad_norm!r} is negative: a norm cannot be"
    if not 0 <= report.tokens <= MAX_TOKENS_PER_STEP:
        return f"tokens={report.tokens} is outside [0, {MAX_TOKENS_PER_STEP}]"
    if len(report.local_grad_digest) > MAX_DIGEST:
        return f"local_grad_digest of {len(report.local_grad_digest)} characters is longer than {MAX_DIGEST}"
    if report.replica_group is not None and not 0 <= report.replica_group <= report.rank:
        return (f"replica_group={report.replica_group} is not the lowest rank of rank {report.rank}'s group"
                f" (it must lie within [0, {report.rank}])")
    return _check_rank(state, report.node_id, report.generation, report.rank)
