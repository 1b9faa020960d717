"""decide(state, soft, input, now) -> events: every decision the supervisor makes.

Pure: it reads the state, the soft state and the clock value it is given, and returns events
for the runtime to append; it never appends, sends or logs. This module is the dispatch: a
`match` over the input kinds, calling each feature's handler, then what follows any decision
(`_conclude`: the restart budget, abandoned checkpoints, idle drains, the next generation's plan).
The decisions themselves live with their feature:

  liveness.py           Hellos; the failure detector's verdicts on a Tick; a death's events
  generations.py        running, ending (the one GenerationEnded builder), completion, a rank's
                        exit, elastic growth, the next generation's plan or why the job waits
  faults.py             Xid, hung rank and straggler verdicts: the node swapped out, with evidence
  sdc_verdicts.py       a digest vote, a recompute check's answer, checks closing
  sdc_checks.py         recompute checks: starting one, judging its answer, the hold on commits
  snapshot_commits.py   when a step's RAM snapshots become the restore point
  drains.py             when a drained node's ranks are handed over
  checkpoints.py        object-store checkpoints: cadence, requests, shards, commit, abort
  operator_commands.py  what each supervisorctl command decides
  budget.py             the restart budget

One `Emission` (emission.py) collects a decision's events in append order: handlers that name a
record's seq (a quarantine's evidence, an SDC check's id) add to it and get the seq back; the
others return their events, which the dispatch adds. Every event decide returns is one `evolve`
accepts, in order (tests/unit check this over random input sequences).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ftsup.supervisor.core import (
    budget,
    checkpoints,
    drains,
    faults,
    generations,
    liveness,
    operator_commands,
    sdc_verdicts,
    snapshot_commits,
)
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.emission import Emission
from ftsup.supervisor.core.events import Event, GenerationEnded, LeaderElected
from ftsup.supervisor.core.inputs import (
    AgentGone,
    AgentHello,
    CheckpointCommitResult,
    CheckpointShardReport,
    HeardFrom,
    Heartbeat,
    Input,
    LeadershipAcquired,
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
from ftsup.supervisor.core.state import NOTHING_OBSERVED, ClusterState, Observation, SoftState


@dataclass(frozen=True, slots=True)
class Decision:
    events: tuple[Event, ...]
    waiting_reason: str  # why no generation is running, when none is; the shell shows it
    first_seq: int  # the seq the events were numbered from: they must be appended as first_seq, first_seq + 1, ...


def decide(state: ClusterState, soft: SoftState, inp: Input, now: float, config: CoreConfig,
           seen: Observation = NOTHING_OBSERVED) -> Decision:
    """The events `inp` calls for; `seen` is what `soft.observe` returned for this same input."""
    out = Emission(state)
    match inp:
        case AgentHello():
            out.extend(liveness.on_hello(state, inp))
        case StepReport():
            _on_step_report(soft, seen, inp, config, out)
        case StepAggregate() if len(inp) == 1:
            return decide(state, soft, inp.report(0), now, config, seen)
        case StepAggregate():
            _on_step_aggregate(soft, seen, inp, config, out)
        case SnapshotReport():
            out.extend(snapshot_commits.commit_if_held(state, soft, inp.step))
        case SnapshotHoldings():  # one step's, observed whole: what its last report alone would decide
            out.extend(snapshot_commits.commit_if_held(state, soft, inp.step))
        case RankFinished():
            out.extend(generations.complete_if_finished(state, soft))
        case TrainerExit():
            out.extend(generations.on_trainer_exit(state, soft, inp))
        case Tick():
            _on_tick(soft, now, config, out)
        case AgentGone():
            liveness.on_tick(soft, now, config, out)  # the verdict it enables, now rather than at a Tick
        case XidReport():
            faults.on_xid(state, soft, inp, now, config, out)
        case TrainerHung():
            faults.on_hung(state, soft, inp, out)
        case OperatorRequest():
            operator_commands.on_request(state, soft, inp, config, out)
        case LeadershipAcquired():
            out.add(LeaderElected(inp.term, inp.address, state.applied_seq))
        case CheckpointShardReport():
            out.extend(checkpoints.on_shard_report(state, inp))
        case CheckpointCommitResult():
            out.extend(checkpoints.on_commit_result(state, inp))
        case SdcCheckResult():
            sdc_verdicts.on_check_result(state, soft, inp, out)
        case Heartbeat() | HeardFrom() | StreamClosed():
            pass  # liveness changes from these are judged on the next Tick
        case SnapshotMemoryReport():
            pass  # for operators (supervisorctl nodes): nothing to decide
        case _:
            pass
    return _conclude(soft, now, config, out)


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
    out = Emission(state)
    current = state
    for hello in hellos:
        new = liveness.on_hello(current, hello)
        out.extend(new)
        if any(isinstance(e, GenerationEnded) for e in new):
            current = out.folded()
    return _conclude(soft, now, config, out)


def _conclude(soft: SoftState, now: float, config: CoreConfig, out: Emission) -> Decision:
    """What follows any decision: the restart budget, abandoned checkpoints, idle drains, the plan."""
    # Events of one decision are folded before planning, so a death and its replacement
    # generation can be decided (and appended) together.
    out.extend(budget.on_ended(out.folded(), out.events, config.job))  # the last failure the budget allows
    out.extend(checkpoints.abandoned(out.folded()))  # its generation ended: its shards will never all come
    out.extend(drains.drain_idle(out.folded(), soft))
    plan = generations.plan_next(out.folded(), soft, config, now)
    if plan.started is not None:
        out.add(plan.started)
    return Decision(out.events, plan.waiting_reason, out.first_seq)


def _on_step_report(soft: SoftState, seen: Observation, report: StepReport, config: CoreConfig,
                    out: Emission) -> None:
    """The generation runs; the step's digest vote and straggler scores (completed by this report)
    are decided; then the checkpoint checks."""
    out.extend(generations.mark_running(out.folded(), report))
    sdc_verdicts.on_vote(out.folded(), soft, seen, config, out)
    faults.on_stragglers(out.folded(), soft, seen, config, out)
    _checkpoint_checks(soft, report, config, out)


def _checkpoint_checks(soft: SoftState, report: StepReport, config: CoreConfig, out: Emission) -> None:
    """A rank that passed the checkpoint in flight without its shard aborts it; then the step's
    own checkpoint may start."""
    out.extend(checkpoints.passed_without_shard(out.folded(), report.generation, report.step, report.rank))
    out.extend(checkpoints.on_step_report(out.folded(), report, config.checkpoint_location,
                                          config.checkpoint_every_steps))


def _on_step_aggregate(soft: SoftState, seen: Observation, aggregate: StepAggregate, config: CoreConfig,
                       out: Emission) -> None:
    """What its reports decide one by one. Of one step, each rank once: only the last report can
    complete the step, so the vote and the straggler scores (observed already, for every rank) are
    decided after the others' checkpoint checks and before the last's. The reports before the
    last change the state only through the checkpoint checks: the first may mark the generation
    running, abort the checkpoint in flight (its rank passed that step without a shard) or start
    the step's; the middle ones are checked only while a checkpoint is in flight or requested
    (otherwise they decide what the first did: nothing)."""
    first, last = aggregate.report(0), aggregate.report(-1)
    out.extend(generations.mark_running(out.folded(), first))
    if len(aggregate) == 1:
        out.extend(checkpoints.on_step_report(out.folded(), first, config.checkpoint_location,
                                              config.checkpoint_every_steps))
    for index in range(len(aggregate) - 1):
        if index and not _checks_matter(out.folded(), aggregate.step):
            break
        _checkpoint_checks(soft, aggregate.report(index) if index else first, config, out)
    sdc_verdicts.on_vote(out.folded(), soft, seen, config, out)
    faults.on_stragglers(out.folded(), soft, seen, config, out)
    _checkpoint_checks(soft, last, config, out)


def _checks_matter(state: ClusterState, step: int) -> bool:
    """Whether a report after an aggregate's first can decide anything about checkpoints: only
    while one is requested (its step may go by) or an incomplete one is in flight and this step is
    past it (the rank may not have written). Otherwise it decides what the first one did."""
    pending = state.pending_checkpoint
    return state.requested_checkpoint is not None or (
        pending is not None and step > pending.step and not pending.is_complete)


def _on_tick(soft: SoftState, now: float, config: CoreConfig, out: Emission) -> None:
    """Timed-out SDC checks close; the failure detector judges every node; a held exit whose
    settle window passed ends its generation; a checkpoint may be due; an elastic job may grow."""
    sdc_verdicts.on_tick(out.folded(), soft, now, config, out)
    liveness.on_tick(soft, now, config, out)
    out.extend(generations.release_held_exit(out.folded(), soft, now, config))
    out.extend(checkpoints.on_tick(out.folded(), soft, now, config))
    out.extend(generations.grow_if_nodes_back(out.folded(), soft, config))
