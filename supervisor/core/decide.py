"""decide(state, soft, input, now) -> events: every decision the supervisor makes.

Pure: it reads the state, the soft state and the clock value it is given, and returns events
for the runtime to append; it never appends, sends or logs. Each input kind has its own small
handler; the detectors and the planner are policies it composes. Every event it returns is one
`evolve` accepts, in order (tests/unit check this over random input sequences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

from ftsup.supervisor.core import budget, checkpoints, sdc_checks, taint
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.events import (
    EndReason,
    Event,
    GenerationEnded,
    GenerationRunning,
    JobCompleted,
    LeaderElected,
    NodeCleared,
    NodeDeclaredDead,
    NodeDrained,
    NodeQuarantined,
    NodeRegistered,
    NodeSuspected,
    NodeUnquarantined,
    OperatorCommand,
    QuarantineCause,
    SdcSuspected,
    SnapshotCommitted,
    StragglerDetected,
    XidAction,
    XidReported,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import (
    AgentHello,
    CheckpointCommitResult,
    CheckpointShardReport,
    HeardFrom,
    Heartbeat,
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
from ftsup.supervisor.core.policies import exit_cause, failure, planner
from ftsup.supervisor.core.policies import sdc as sdc_policy
from ftsup.supervisor.core.policies import xid as xid_policy
from ftsup.supervisor.core.state import NOTHING_OBSERVED, ClusterState, Liveness, Observation, SoftState, is_usable


@dataclass(frozen=True, slots=True)
class Decision:
    events: tuple[Event, ...]
    waiting_reason: str  # why no generation is running, when none is; the shell shows it


def decide(state: ClusterState, soft: SoftState, inp: Input, now: float, config: CoreConfig,
           seen: Observation = NOTHING_OBSERVED) -> Decision:
    """The events `inp` calls for; `seen` is what `soft.observe` returned for this same input."""
    match inp:
        case AgentHello():
            events = _on_hello(state, inp)
        case StepReport():
            events = _on_step_report(state, inp)
            events += _on_sdc_vote(evolve_all(state, events), soft, seen, config, offset=len(events))
            events += _on_stragglers(evolve_all(state, events), soft, seen, config, offset=len(events))
            events += checkpoints.on_step_report(evolve_all(state, events), inp, config.checkpoint_location,
                                                 config.checkpoint_every_steps)
        case StepAggregate() if len(inp.reports) == 1:
            return decide(state, soft, inp.reports[0], now, config, seen)
        case StepAggregate():
            events = _on_step_aggregate(state, soft, seen, inp, config)
        case SnapshotReport():
            events = _on_snapshot_report(state, soft, inp)
        case SnapshotHoldings():  # one step's, observed whole: what its last report alone would decide
            events = _commit_if_held(state, soft, inp.step)
        case RankFinished():
            events = _on_rank_finished(state, soft, inp)
        case TrainerExit():
            events = _on_trainer_exit(state, soft, inp)
        case Tick():
            events = _on_tick(state, soft, now, config)
            events += checkpoints.on_tick(evolve_all(state, events), soft, now, config)
            events += _on_grow(evolve_all(state, events), soft, config)
        case XidReport():
            events = _on_xid(state, soft, inp, now, config)
        case TrainerHung():
            events = _on_hung(state, soft, inp)
        case OperatorRequest():
            events = _on_operator(state, soft, inp, config)
        case LeadershipAcquired():
            events = [LeaderElected(inp.term, inp.address, state.applied_seq)]
        case CheckpointShardReport():
            events = checkpoints.on_shard_report(state, inp)
        case CheckpointCommitResult():
            events = checkpoints.on_commit_result(state, inp)
        case SdcCheckResult():
            events = _on_sdc_check_result(state, soft, inp)
        case Heartbeat() | HeardFrom() | StreamClosed():
            events = []  # liveness changes from these are judged on the next Tick
        case SnapshotMemoryReport():
            events = []  # for operators (supervisorctl nodes): nothing to decide
        case _:
            events = []
    return _conclude(state, soft, events, now, config)


def decide_hellos(
    state: ClusterState, soft: SoftState, hellos: Sequence[AgentHello], now: float, config: CoreConfig
) -> Decision:
    """Decides a batch of Hellos of distinct nodes at once: what `decide` makes of each, in
    order, with the budget, drain and planner pass done once for the batch instead of once per
    Hello. A fleet of 12,500 connecting is then a few batches (one append each), not 12,500
    decisions that each fold and survey the whole fleet.

    The state one Hello is judged against is the batch's earlier events folded in: its own node's
    record, which no other Hello of the batch names, and the generation, which only a
    GenerationEnded changes (then the earlier events are folded before the next Hello)."""
    if len({hello.node_id for hello in hellos}) != len(hellos):
        raise ValueError("a batch of Hellos names each node at most once")
    events: list[Event] = []
    current, folded_upto = state, 0
    for hello in hellos:
        new = _on_hello(current, hello)
        events += new
        if any(isinstance(e, GenerationEnded) for e in new):
            current, folded_upto = evolve_all(current, events[folded_upto:]), len(events)
    return _conclude(state, soft, events, now, config)


def _conclude(state: ClusterState, soft: SoftState, events: list[Event], now: float, config: CoreConfig) -> Decision:
    """What follows any decision: the restart budget, abandoned checkpoints, idle drains, the plan."""
    # Events of one decision are folded before planning, so a death and its replacement
    # generation can be decided (and appended) together.
    folded = evolve_all(state, events)
    given_up = budget.on_ended(folded, events, config.job)  # the last failure the budget allows
    if given_up:
        events.extend(given_up)
        folded = evolve_all(folded, given_up)
    abandoned = checkpoints.abandoned(folded)  # its generation ended: its shards will never all come
    if abandoned:
        events.extend(abandoned)
        folded = evolve_all(folded, abandoned)
    idle_drains = _drain_idle(folded, soft)
    events.extend(idle_drains)
    plan = planner.plan_generation(
        evolve_all(folded, idle_drains), soft, config.job, now, spare_grace_s=config.spare_grace_s
    )
    if plan.started is not None:
        events.append(plan.started)
    return Decision(tuple(events), plan.waiting_reason)


def _last_step(soft: SoftState, generation: int) -> int:
    progress = soft.progress
    return progress.max_step if progress is not None and progress.generation == generation else 0


def _ended(soft: SoftState | None, generation: int, reason: EndReason, node_id: str, detail: str, *,
           last_step: int | None = None, silent_for_s: float = 0.0, exit_: TrainerExit | None = None
           ) -> GenerationEnded:
    """The one place a generation's end is built: its last step is the newest step any rank
    reported (unless the caller knows better), and a rank's exit brings its code and output."""
    return GenerationEnded(
        generation=generation,
        reason=reason,
        node_id=node_id,
        last_step=last_step if last_step is not None else _last_step(soft, generation) if soft is not None else 0,
        detail=detail,
        silent_for_s=silent_for_s,
        rank=exit_.rank if exit_ is not None else None,
        exit_code=exit_.exit_code if exit_ is not None else None,
        output_tail=exit_.output_tail if exit_ is not None else "",
    )


def _on_hello(state: ClusterState, hello: AgentHello) -> list[Event]:
    node = state.node(hello.node_id)
    registered = NodeRegistered(
        node_id=hello.node_id,
        incarnation=hello.incarnation,
        role=hello.role,
        host=hello.host,
        peer_port=hello.peer_port,
        gpus=hello.gpus,
        failure_domain=hello.failure_domain,
    )
    if node is None:
        return [registered]
    if node.liveness is Liveness.DEAD:
        if node.incarnation == hello.incarnation and node.quarantine_cause.is_transient_death:
            # The same agent process is back: its stream loss was transient (a network blip), or
            # this supervisor (new after a failover) never heard it in time, not a death. Its
            # generation was already replaced; it returns to service as a spare would.
            why = "reconnected with the same incarnation: the loss was transient"
            return [registered, NodeUnquarantined(hello.node_id, why, "")]
        return [registered]
    events: list[Event] = []
    changed = (node.incarnation, node.role, node.host, node.peer_port, node.gpus, node.failure_domain) != (
        hello.incarnation, hello.role, hello.host, hello.peer_port, hello.gpus, hello.failure_domain,
    )
    current = state.generation
    if node.incarnation != hello.incarnation and current is not None and current.member(hello.node_id):
        # A restarted agent lost its trainers and its RAM snapshots: the gang is broken.
        detail = f"agent restarted (incarnation {node.incarnation} -> {hello.incarnation})"
        events.append(_ended(None, current.number, EndReason.NODE_RESTARTED, hello.node_id, detail, last_step=0))
    if changed:
        events.append(registered)  # also makes a suspect node alive again
    elif node.liveness is Liveness.SUSPECT:
        events.append(NodeCleared(hello.node_id, "reconnected"))
    return events


def _on_step_aggregate(state: ClusterState, soft: SoftState, seen: Observation, aggregate: StepAggregate,
                       config: CoreConfig) -> list[Event]:
    """What its reports decide one by one. Of one step, each rank once: the first report may mark
    the generation running and start the step's checkpoint; the middle ones change nothing (the
    state does not change between them); only the last can complete the step, so the vote and the
    straggler scores (observed already, for every rank) are decided after it, then its own
    checkpoint check, as the last report's decision would."""
    first, last = aggregate.reports[0], aggregate.reports[-1]
    location, every = config.checkpoint_location, config.checkpoint_every_steps
    events = _on_step_report(state, first)
    events += checkpoints.on_step_report(evolve_all(state, events), first, location, every)
    events += _on_sdc_vote(evolve_all(state, events), soft, seen, config, offset=len(events))
    events += _on_stragglers(evolve_all(state, events), soft, seen, config, offset=len(events))
    events += checkpoints.on_step_report(evolve_all(state, events), last, location, every)
    return events


def _on_step_report(state: ClusterState, report: StepReport) -> list[Event]:
    generation = state.generation
    if generation is None or generation.number != report.generation or generation.is_running:
        return []
    return [GenerationRunning(generation=report.generation, first_step=report.step)]


def _on_sdc_vote(state: ClusterState, soft: SoftState, seen: Observation, config: CoreConfig, *,
                 offset: int) -> list[Event]:
    """A completed digest vote: agreed -> the step may commit; a minority -> SdcSuspected with the
    digests, the culprit's node quarantined and the job restarted from the last agreed snapshot
    (always before the divergent step: see `_commit_if_held`); a split -> restart, culprit unknown."""
    progress = soft.progress
    generation = state.generation
    vote = seen.sdc_vote
    if vote is None or generation is None or progress is None or progress.generation != generation.number:
        return []
    if vote.is_clear:
        # A scheduled recompute of the step opens first: it holds the step's commit back.
        checks = sdc_checks.on_vote(state, soft, seen, config, seq=state.applied_seq + offset + 1)
        return checks + _commit_if_held(evolve_all(state, checks), soft, vote.step)
    events: list[Event] = []
    first_seq: dict[str, int] = {}
    for dissent in (*vote.minorities, *vote.split):
        node_id = generation.node_of_rank(dissent.rank)
        if node_id is None:
            continue
        events.append(SdcSuspected(node_id, dissent.rank, vote.step, dissent.digest, dissent.majority_digest,
                                   generation.number, dissent.group_size))
        if sdc_policy.is_convicting(dissent, config.sdc):
            first_seq.setdefault(node_id, state.applied_seq + offset + len(events))
    if not first_seq:
        # A split: a recompute of the step (on a node outside the job when one is free) can name
        # the side that computed wrongly; the job restarts meanwhile, nobody is quarantined yet.
        events += sdc_checks.on_vote(evolve_all(state, events), soft, seen, config,
                                     seq=state.applied_seq + offset + len(events) + 1)
        detail = f"SDC: {vote.reason}; no majority names a culprit, restarting from the last agreed step"
        return events + _end_if_member_any(state, soft, EndReason.SDC, detail)
    culprits = sorted(first_seq)
    reason = f"SDC: {vote.reason}"
    events += _end_if_member(state, soft, culprits[0], EndReason.NODE_QUARANTINED, reason)
    events += [NodeQuarantined(n, reason, first_seq[n], QuarantineCause.SDC) for n in culprits
               if not state.nodes[n].is_quarantined]
    return events


def _on_sdc_check_result(state: ClusterState, soft: SoftState, result: SdcCheckResult) -> list[Event]:
    """A verifier answered: the check finishes (maybe a second opinion starts); a confirmed
    mismatch quarantines the culprit's node with the finished record as evidence, and a verdict
    that taints the step ends its generation so the job restores from before it. A clean step
    (also one whose first verifier is convicted) commits what the check held back first."""
    verdict = sdc_checks.on_result(state, soft, result, seq=state.applied_seq + 1)
    events = list(verdict.events)
    folded = evolve_all(state, events)
    is_tainted = folded.sdc_tainted_from_step is not None and folded.generation is not None
    if not is_tainted:
        resumed = _after_checks_closed(folded, soft)
        events += resumed
        folded = evolve_all(folded, resumed)
    for node_id in verdict.convicted:
        ended = _end_if_member(folded, soft, node_id, EndReason.NODE_QUARANTINED, verdict.reason)
        quarantined: list[Event] = [] if folded.nodes[node_id].is_quarantined else [
            NodeQuarantined(node_id, verdict.reason, verdict.evidence_seq, QuarantineCause.SDC)]
        events += ended + quarantined
        folded = evolve_all(folded, ended + quarantined)
    if is_tainted and folded.generation is not None:
        # Tainted while training on: the generation holds corrupt state whoever computed it.
        events += _end_if_member_any(folded, soft, EndReason.SDC, verdict.reason or "SDC: tainted by a recompute")
    return events


def _after_checks_closed(state: ClusterState, soft: SoftState) -> list[Event]:
    """Checks closed: the newest step no longer held back commits, and a job whose ranks all
    finished completes once no check is open."""
    progress = soft.progress
    generation = state.generation
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    events: list[Event] = []
    for step in sorted(progress.holdings, reverse=True):
        events = _commit_if_held(state, soft, step)
        if events:
            break
    return events + _complete_if_finished(evolve_all(state, events), soft)


def _end_if_member_any(state: ClusterState, soft: SoftState, reason: EndReason, detail: str) -> list[Event]:
    generation = state.generation
    if generation is None:
        return []
    return [_ended(soft, generation.number, reason, "", detail)]


def _on_stragglers(state: ClusterState, soft: SoftState, seen: Observation, config: CoreConfig, *,
                   offset: int) -> list[Event]:
    """Confirmed stragglers (from the step just scored): recorded; the first one is swapped out
    when a spare is free (one swap ends the generation; others wait for the next)."""
    progress = soft.progress
    generation = state.generation
    if progress is None or generation is None or not seen.straggler_verdicts:
        return []
    events: list[Event] = []
    is_swapped = False
    for verdict in seen.straggler_verdicts:
        node_id = generation.node_of_rank(verdict.rank)
        if not verdict.is_straggler or node_id is None:
            continue
        window = f"steps {verdict.window[0]}..{verdict.window[1]}"
        events.append(StragglerDetected(node_id, verdict.rank, verdict.scores[-1], len(verdict.scores),
                                        verdict.over_threshold, f"{verdict.reason}; {window}"))
        if config.is_straggler_swap_enabled and not is_swapped and _has_free_spare(state, soft):
            evidence = state.applied_seq + offset + len(events)  # the StragglerDetected record
            reason = f"rank {verdict.rank} {verdict.reason}"
            events += _end_if_member(state, soft, node_id, EndReason.NODE_QUARANTINED, reason)
            events.append(NodeQuarantined(node_id, reason, evidence, QuarantineCause.STRAGGLER))
            is_swapped = True
    return events


def _has_free_spare(state: ClusterState, soft: SoftState) -> bool:
    generation = state.generation
    for node in state.nodes.values():
        if is_usable(node, soft) and (generation is None or generation.member(node.node_id) is None):
            return True
    return False


def _on_snapshot_report(state: ClusterState, soft: SoftState, report: SnapshotReport) -> list[Event]:
    return _commit_if_held(state, soft, report.step)


def _commit_if_held(state: ClusterState, soft: SoftState, step: int) -> list[Event]:
    """Commits `step` once every rank is held twice, the holders of each rank reported the same
    payload SHA-256 (issue 16) and the step's digests agreed (issue 7: a snapshot from a step whose
    replicas disagreed is never committed, so never restored)."""
    generation = state.generation
    progress = soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    if state.snapshot is not None and step <= state.snapshot.step:
        return []
    if not soft_state.is_committable(progress, step):
        return []
    if sdc_checks.is_held(state, step) or taint.is_tainted(state, step):
        return []  # an open recompute check may still prove it corrupt, or one did
    if step in progress.holding_mismatches:
        return []  # owner and buddy reported different bytes for a rank: never a restore source
    if not soft_state.is_held_twice(progress.holdings.get(step, {}), generation.index):
        return []
    committed: list[Event] = [SnapshotCommitted(generation=generation.number, step=step)]
    # A step boundary with every rank held twice: the moment to hand a drained node's ranks over.
    for node_id in sorted(soft.pending_drains):
        if generation.member(node_id):
            detail = f"drained at committed step {step}"
            last = max(step, _last_step(soft, generation.number))
            committed.append(_ended(soft, generation.number, EndReason.NODE_DRAINED, node_id, detail, last_step=last))
            committed.append(NodeDrained(node_id, detail, ""))
            break  # the generation has ended; other pending drains apply to idle nodes below
    return committed


def _on_xid(state: ClusterState, soft: SoftState, report: XidReport, now: float, config: CoreConfig) -> list[Event]:
    history = soft.xids.get(report.node_id, [])
    verdict = xid_policy.judge_xid(history[:-1], report, now, config.xid)  # the last entry is this one
    events: list[Event] = [
        XidReported(report.node_id, report.pci, report.gpu, report.code, verdict.action, report.message,
                    verdict.is_unknown)
    ]
    if verdict.action is XidAction.IGNORE:
        return events
    if verdict.action is XidAction.RESTART_JOB:
        return events + _end_if_member(state, soft, report.node_id, EndReason.XID, verdict.reason)
    # A GPU that needs a reset, or a node that needs a person: its ranks go elsewhere.
    events += _end_if_member(state, soft, report.node_id, EndReason.NODE_QUARANTINED, verdict.reason)
    if not state.nodes[report.node_id].is_quarantined:
        events.append(NodeQuarantined(report.node_id, verdict.reason, state.applied_seq + 1, QuarantineCause.XID))
    return events


def _on_hung(state: ClusterState, soft: SoftState, hung: TrainerHung) -> list[Event]:
    """A hung rank ends the generation. Its node is swapped for a free spare only when the rank is
    the culprit: behind a step the others completed. In a synchronous job one frozen rank stalls
    every rank in the next collective at the same last step, and whichever agent's watcher fires
    first reports; blaming it would swap a healthy node. Then the same gang restarts (from the
    snapshot), which replaces the frozen process wherever it is."""
    progress = soft.progress
    newest = progress.max_step if progress is not None and progress.generation == hung.generation else hung.last_step
    is_culprit = hung.last_step < newest
    detail = (f"rank {hung.rank} made no step progress for {hung.silent_for_s:.0f}s"
              f" (limit {hung.limit_s:.0f}s) after step {hung.last_step}")
    if not is_culprit:
        detail += f"; every rank stopped at step {newest}, so the culprit is unknown: restarting the same gang"
    ended = _end_if_member(state, soft, hung.node_id, EndReason.HUNG, detail, silent_for_s=hung.silent_for_s)
    if ended and is_culprit and _has_free_spare(state, soft) and not state.nodes[hung.node_id].is_quarantined:
        ended.append(NodeQuarantined(hung.node_id, f"hung: {detail}", state.applied_seq + 1, QuarantineCause.HUNG))
    return ended


def _on_operator(state: ClusterState, soft: SoftState, request: OperatorRequest, config: CoreConfig) -> list[Event]:
    record = OperatorCommand(request.command.value, (request.node_id,) if request.node_id else (), request.operator,
                             request.reason, request.principal)
    seq = state.applied_seq + 1
    reason = f"{request.command} by {request.operator or 'an operator'}: {request.reason}"
    match request.command:
        case OperatorCommandKind.QUARANTINE:
            ended = _end_if_member(state, soft, request.node_id, EndReason.NODE_QUARANTINED, reason)
            return [record, *ended, NodeQuarantined(request.node_id, reason, seq, QuarantineCause.OPERATOR)]
        case OperatorCommandKind.UNQUARANTINE:
            return [record, NodeUnquarantined(request.node_id, request.reason, request.operator)]
        case OperatorCommandKind.CHECKPOINT:  # ranks save at the lead step; the reply names it
            return [record, *checkpoints.request(state, soft, config, reason)]
        case OperatorCommandKind.RESTART:  # the planner starts the next generation from the newest committed snapshot
            generation = state.generation
            if generation is None:
                return [record]  # admission refuses this; kept total for property tests
            return [record, _ended(soft, generation.number, EndReason.OPERATOR_RESTART, "", reason)]
        case OperatorCommandKind.DRAIN:  # recorded in soft.pending_drains; an idle node goes at once
            return [record]  # (_drain_idle), a training one at its generation's next committed step
        case unknown:
            assert_never(unknown)


def _quarantine_reason(death_reason: str) -> str:
    return f"declared dead: {death_reason}"


def _drain_idle(state: ClusterState, soft: SoftState) -> list[Event]:
    """Pending drains of nodes that hold no ranks (any more) take effect before the next plan."""
    generation = state.generation
    return [
        NodeDrained(node_id, "drained (it held no ranks)", "")
        for node_id in sorted(soft.pending_drains)
        if node_id in state.nodes
        and not state.nodes[node_id].is_drained
        and (generation is None or not generation.member(node_id))
    ]


def _end_if_member(state: ClusterState, soft: SoftState, node_id: str, reason: EndReason, detail: str,
                   *, silent_for_s: float = 0.0) -> list[Event]:
    generation = state.generation
    if generation is None or not generation.member(node_id):
        return []
    return [_ended(soft, generation.number, reason, node_id, detail, silent_for_s=silent_for_s)]


def _on_rank_finished(state: ClusterState, soft: SoftState, report: RankFinished) -> list[Event]:
    return _complete_if_finished(state, soft)


def _complete_if_finished(state: ClusterState, soft: SoftState) -> list[Event]:
    """Every rank finished: the job completes, unless a recompute check may still prove one of
    its steps corrupt (then it completes when the last check closes clean)."""
    generation = state.generation
    progress = soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    if len(progress.finished) < generation.world_size or state.sdc_checks:
        return []
    digests = sorted(set(progress.finished.values()))
    detail = "every rank finished" if len(digests) == 1 else f"ranks disagree on the final digest: {digests}"
    return [
        _ended(soft, generation.number, EndReason.COMPLETED, "", detail),  # last step: progress.max_step
        JobCompleted(generation=generation.number, step=progress.max_step, param_digest=progress.finished[0] if 0 in progress.finished else digests[0]),
    ]


def _on_trainer_exit(state: ClusterState, soft: SoftState, exit_: TrainerExit) -> list[Event]:
    """A rank exited. Finished (it said so, or a plain script exited 0: torchrun's rule, level 0)
    -> the job completes when every rank has; anything else ends the generation (gang restart)."""
    generation = state.generation
    if generation is None or generation.number != exit_.generation:
        return []
    if exit_.is_plain_script and exit_.exit_code == 0:
        return _complete_if_finished(state, soft)  # soft.observe counted it finished
    if exit_.finished:
        return []
    progress = soft.progress
    if progress is not None and progress.generation == generation.number and exit_.rank in progress.finished:
        return []
    if exit_cause.should_hold(state, exit_):
        return []  # collateral, by the look of it: soft.observe held it; _release_held_exit ends on it if nothing better shows
    return [_ended_by_exit(state, soft, exit_, f"rank {exit_.rank} exited with {_exit_text(exit_.exit_code)}")]


def _ended_by_exit(state: ClusterState, soft: SoftState, exit_: TrainerExit, detail: str) -> GenerationEnded:
    return _ended(soft, exit_.generation, EndReason.TRAINER_EXITED, exit_.node_id, detail, exit_=exit_)


def _release_held_exit(state: ClusterState, soft: SoftState, now: float, config: CoreConfig) -> list[Event]:
    """Ends the generation on the first held (collateral-looking) exit once the settle window is
    over and no member is suspected any more; a suspect's verdict comes within the detector's
    limits, so the wait is capped by them too."""
    generation, progress = state.generation, soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    since = progress.held_since_s
    if since is None or not progress.held_exits:
        return []
    waited = now - since
    detector = config.detector
    cap = config.exit_settle_s + detector.dead_after_s + detector.reconnect_grace_s
    if waited < config.exit_settle_s or (waited < cap and exit_cause.suspects_besides(state, "")):
        return []
    first = progress.held_exits[0]
    others = len(progress.held_exits) - 1
    detail = (f"rank {first.rank} exited with {_exit_text(first.exit_code)} after a peer connection failed;"
              f" no other cause showed within {waited:.1f}s" + (f" ({others} more ranks exited alike)" if others else ""))
    return [_ended_by_exit(state, soft, first, detail)]


def _exit_text(code: int) -> str:
    if code < 0:
        return f"signal {-code}"
    return f"code {code}"


def _on_tick(state: ClusterState, soft: SoftState, now: float, config: CoreConfig) -> list[Event]:
    events: list[Event] = sdc_checks.on_tick(state, soft, now, config)
    if events:
        state = evolve_all(state, events)
        resumed = _after_checks_closed(state, soft)
        events += resumed
        state = evolve_all(state, resumed)
    for verdict in failure.judge(state, soft, config.detector, now):
        if verdict.liveness is Liveness.SUSPECT:
            new: list[Event] = [NodeSuspected(verdict.node_id, verdict.reason, verdict.silent_for_s)]
        elif verdict.liveness is Liveness.ALIVE:
            new = [NodeCleared(verdict.node_id, verdict.reason)]
        else:
            new = _declare_dead(state, soft, verdict, offset=len(events))
        events.extend(new)
        state = evolve_all(state, new)
    return events + _release_held_exit(state, soft, now, config)


def _on_grow(state: ClusterState, soft: SoftState, config: CoreConfig) -> list[Event]:
    """A shrunk elastic job with nodes back ends its generation at its committed snapshot; the
    planner then starts the bigger world from it (ranks without a copy of their own take another
    rank's: the state is replicated)."""
    target = planner.grow_to(state, soft, config.job)
    generation = state.generation
    if target is None or generation is None:
        return []
    nodes = generation.world_size // config.job.ranks_per_node
    detail = f"{target} nodes healthy for a world of {nodes}: growing back toward {config.job.nodes}"
    return [_ended(soft, generation.number, EndReason.ELASTIC_GROW, "", detail)]


def _declare_dead(
    state: ClusterState, soft: SoftState, verdict: failure.Verdict, *, offset: int
) -> list[Event]:
    """Dead, then (if it was training) the generation ends, then quarantine: evolve's order."""
    dead = NodeDeclaredDead(verdict.node_id, verdict.reason, verdict.silent_for_s, verdict.cause)
    # The batch is appended atomically after `applied_seq`, so the death's seq is known now.
    dead_seq = state.applied_seq + offset + 1
    events: list[Event] = [dead]
    generation = state.generation
    if generation is not None and generation.member(verdict.node_id):
        events.append(_ended(soft, generation.number, EndReason.NODE_LOST, verdict.node_id, verdict.reason,
                             silent_for_s=verdict.silent_for_s))
    if not state.nodes[verdict.node_id].is_quarantined:
        events.append(NodeQuarantined(verdict.node_id, _quarantine_reason(verdict.reason), dead_seq, verdict.cause))
    return events


