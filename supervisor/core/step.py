"""The one core step: an input in, a `Ready` out (refusal, events, waiting reason, touched nodes).

Modelled on raft's RawNode/Ready: `Core.step` admits or refuses the input, folds it into the soft
state, decides, and hands back everything the shell must do as data; the shell persists
`ready.events` and then calls `Core.advance` with the stored records, which folds them. The
supervisor's runtime, the fleet simulator and the unit-test driver all drive the core through
this object, so admission, observation, decision and folding cannot drift apart between them.
Pure: no I/O, no clock (`now` is an argument), no logging.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ftsup.supervisor.core import admission, snapshot_commits, step_holdings
from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.decide import decide, decide_hellos
from ftsup.supervisor.core.errors import InvalidEvent
from ftsup.supervisor.core.events import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointStarted,
    Event,
    GenerationEnded,
    GenerationRunning,
    GenerationStarted,
    JobCompleted,
    NodeCleared,
    NodeDeclaredDead,
    NodeDrained,
    NodeQuarantined,
    NodeRegistered,
    NodeSuspected,
    NodeUnquarantined,
    OperatorCommand,
    Record,
    SnapshotCommitted,
    StragglerDetected,
    XidReported,
)
from ftsup.supervisor.core.evolve import apply_record, apply_records
from ftsup.supervisor.core.inputs import (
    AgentHello,
    HeardFrom,
    Heartbeat,
    HoldingsFold,
    Input,
    SnapshotHoldings,
    StepAggregate,
)
from ftsup.supervisor.core.policies import interval as interval_policy
from ftsup.supervisor.core.policies.interval import IntervalObservations
from ftsup.supervisor.core.state import ClusterState, SoftState

# Events the Young/Daly interval policy learns from (checkpoint costs, failures, the job's span).
INTERVAL_EVENTS = (GenerationStarted, GenerationEnded, JobCompleted, CheckpointStarted, CheckpointCommitted,
                   CheckpointAborted)
# Events that can change no directive but the named node's own (a registration of a generation's
# member may change its peers' buddy and restore addresses: see `affected_nodes`). Any other event
# may change every node's directive.
NODE_LOCAL_EVENTS = (NodeRegistered, NodeSuspected, NodeCleared, NodeDeclaredDead, NodeQuarantined, XidReported,
                     NodeUnquarantined, NodeDrained, StragglerDetected, OperatorCommand)


class RefusalKind(enum.Enum):
    """Whether a refused sender may send the same input again (the wire's RefusalKind)."""

    PERMANENT = "permanent"  # the input's own fault: sent again, it is refused again
    RETRYABLE = "retryable"  # says nothing about the input: this replica could not decide it now


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: RefusalKind
    reason: str  # for people: logged and answered on the sender's stream

    @property
    def is_retryable(self) -> bool:
        return self.kind is RefusalKind.RETRYABLE


@dataclass(frozen=True, slots=True)
class Ready:
    """What one step asks of the shell: persist `events` (then `Core.advance`), show the waiting
    reason, push the directives of `affected` nodes (None: possibly every node's changed)."""

    events: tuple[Event, ...] = ()
    waiting_reason: str = ""  # why no generation runs, when none does
    affected: tuple[str, ...] | None = ()
    refusal: Refusal | None = None
    first_seq: int = 0  # the seq decide numbered `events` from (evidence seqs name records by it); 0: none

    @property
    def retained(self) -> SnapshotCommitted | None:
        """The RAM snapshot step these events commit (the newest), if any: every node's directive
        then carries it as `retain_from_step`, and nothing else of a directive outside `affected`
        changed (affected_nodes), so the shell may say it to all in one short message."""
        commits = [event for event in self.events if isinstance(event, SnapshotCommitted)]
        return commits[-1] if commits else None


@dataclass(frozen=True, slots=True)
class BatchReady:
    """A batch stepped together (Hellos, or a fold of step aggregates): per input its refusal
    (None: admitted), and one Ready for the admitted ones, decided together (one append)."""

    refusals: tuple[Refusal | None, ...]
    ready: Ready

    @property
    def admitted(self) -> tuple[int, ...]:
        """Positions in the batch of the inputs that were not refused."""
        return tuple(i for i, refusal in enumerate(self.refusals) if refusal is None)


def affected_nodes(state: ClusterState, events: Sequence[Event], hellos: Sequence[str] = ()) -> tuple[str, ...] | None:
    """Nodes whose directive `events` may change, plus the nodes that said Hello (`hellos`);
    None: possibly every node. A snapshot commit names nobody: it changes every directive's
    retain floor alone (Ready.retained), which the shell says to every node in a short message.

    At 10k+ nodes recomputing every directive per registration is quadratic. A change of the
    waiting reason alone touches nobody (it is the note a standby directive carries): agents get
    the current reason with their next directive that changes anything else. Node-local events
    never change the generation, so `state` may be the one before or after folding them.
    """
    named = list(hellos)
    generation = state.generation
    for event in events:
        if isinstance(event, SnapshotCommitted):
            continue  # changes every directive's retain_from_step and nothing else: Ready.retained
        if isinstance(event, GenerationRunning):
            # (its first step is no directive's field: re-pushing every node's directive, unchanged,
            # stalled a 12,500-node leader's loop as long as the generation's start did)
            continue
        if not isinstance(event, NODE_LOCAL_EVENTS):
            return None
        if isinstance(event, NodeRegistered) and generation is not None and (
            generation.member(event.node_id) is not None
            or any(r.source_node_id == event.node_id for r in generation.restores)
        ):
            return None  # its peers' buddy / restore addresses may have changed
        named.append(getattr(event, "node_id", ""))
    return tuple(named)


class Core:
    """Owns the cluster state, the soft state and the Young/Daly observations of one supervisor
    (or one simulated run); changed only through `step`/`step_hellos` and `advance`/`fold`."""

    def __init__(self, config: CoreConfig, state: ClusterState | None = None, soft: SoftState | None = None) -> None:
        self.config = config
        self.state = state if state is not None else ClusterState()
        self.interval_obs = IntervalObservations()
        self.soft = soft if soft is not None else SoftState(started_at_s=0.0)
        self.soft.interval_obs = self.interval_obs

    @property
    def waiting_reason(self) -> str:
        return self.soft.waiting_reason

    def reset_soft(self, started_at_s: float) -> None:
        """Starts the soft state afresh (a new leader rebuilds it from what agents send); what the
        log taught (Young/Daly observations) and the waiting reason stay."""
        self.soft = SoftState(started_at_s=started_at_s, interval_obs=self.interval_obs,
                              waiting_reason=self.soft.waiting_reason)

    # -- deciding ---------------------------------------------------------------------------------
    def step(self, inp: Input, now: float) -> Ready:
        """Refuses `inp`, or observes it into the soft state and decides on it. Nothing is folded:
        the caller persists `ready.events` and calls `advance` (or drops them: the soft state has
        moved, the cluster state has not)."""
        refused = admission.refusal(self.state, self.soft, inp, self.config)
        if refused is not None:
            return Ready(waiting_reason=self.waiting_reason, refusal=Refusal(RefusalKind.PERMANENT, refused))
        seen = soft_state.observe(self.soft, self.state, inp, now, self.config.straggler, self.config.sdc)
        if isinstance(inp, (Heartbeat, HeardFrom)):
            # The hot path (one per node per interval): a heartbeat only refreshes soft state; the
            # detector and the planner act on the next Tick, so skipping decide changes no
            # decision, only saves a planner pass.
            return Ready(waiting_reason=self.waiting_reason)
        decision = decide(self.state, self.soft, inp, now, self.config, seen)
        hellos = (inp.node_id,) if isinstance(inp, AgentHello) else ()
        return Ready(decision.events, decision.waiting_reason, affected_nodes(self.state, decision.events, hellos),
                     first_seq=decision.first_seq)

    def step_hellos(self, hellos: Sequence[tuple[AgentHello, float]]) -> BatchReady:
        """A batch of Hellos of distinct nodes, each with its arrival time: each admitted and
        observed as alone, then decided together (as of the last arrival) with one budget, drain
        and planner pass, so a fleet connecting costs one append per batch, not one per node."""
        refusals = tuple(self._admit(hello, at_s) for hello, at_s in hellos)
        admitted = [hello for (hello, _), refused in zip(hellos, refusals) if refused is None]
        if not admitted:
            return BatchReady(refusals, Ready(waiting_reason=self.waiting_reason))
        now = hellos[-1][1]
        decision = decide_hellos(self.state, self.soft, admitted, now, self.config)
        affected = affected_nodes(self.state, decision.events, [hello.node_id for hello in admitted])
        return BatchReady(refusals, Ready(decision.events, decision.waiting_reason, affected,
                                          first_seq=decision.first_seq))

    def step_aggregates(self, parts: Sequence[StepAggregate], now: float, folded: StepAggregate | None = None
                        ) -> BatchReady | None:
        """Several nodes' aggregates of one generation's step (each node once, as a link shard's
        batch brings them back to back), decided as one input: what `step` decides of each in
        turn, with the array work, the vote, the straggler scores and the conclusion done once
        (issue 14: at 12,500 nodes a step is 12,500 aggregates, and their per-input cost, not
        their ranks, held the leader above its budget).

        Equal to stepping them one by one because (a) each part's admission depends on the
        generation, its membership and the sender's Hello, none of which the reports before a
        step completes can change (they decide only the generation's running mark and the
        checkpoint checks), and (b) a step completes only at its last rank: when no rank of the
        admitted parts was reported in this step yet (checked here; else None, and the caller
        steps each), the fold's ranks are distinct and new, so only its last position can
        complete the step, as only the last part could. The parts' refusals are each their own.
        The Ready covers the parts up to the last admitted one (`len(refusals)`); the caller
        steps the rest alone, after enacting it.
        tests/unit/supervisor/test_step_folds.py compares the two over random histories.
        `folded`: the parts' fold when the caller has it already (a link shard's packed
        ShardStepFold, decoded: supervisor/server/step_fold.py), equal to StepAggregate.fold(parts);
        used when every part is admitted, instead of concatenating the parts again."""
        if len(parts) < 2:
            return None
        first = parts[0]
        if any((p.generation, p.step) != (first.generation, first.step) or p.segments for p in parts):
            return None
        if len({p.node_id for p in parts}) != len(parts):
            return None
        reasons, fold = admission.fold_refusals(self.state, self.soft, parts, self.config, folded)
        admitted = [part for part, reason in zip(parts, reasons) if reason is None]
        if not admitted:  # (each refused one by one decides nothing: refused here, not checked again)
            return BatchReady(tuple(Refusal(RefusalKind.PERMANENT, reason) for reason in reasons if reason is not None),
                              Ready(waiting_reason=self.waiting_reason))
        if not soft_state.fresh_in_step(self.soft, self.state, first.generation, first.step,
                                                        admitted):
            return None
        # Refused parts after the last admitted one are left to the caller: one by one they come
        # after the step may have completed (and its vote ended the generation), and are judged,
        # and their refusal worded, against that state.
        decided = max(i for i, reason in enumerate(reasons) if reason is None) + 1
        refusals = tuple(None if reason is None else Refusal(RefusalKind.PERMANENT, reason)
                         for reason in reasons[:decided])
        inp = fold or (admitted[0] if len(admitted) == 1 else StepAggregate.fold(admitted))
        seen = soft_state.observe(self.soft, self.state, inp, now, self.config.straggler, self.config.sdc)
        decision = decide(self.state, self.soft, inp, now, self.config, seen)
        return BatchReady(refusals, Ready(decision.events, decision.waiting_reason,
                                          affected_nodes(self.state, decision.events), first_seq=decision.first_seq))

    def step_fold(self, fold: StepAggregate, now: float) -> BatchReady | None:
        """A link shard's step fold (its `segments` name each part's node) decided whole on its
        arrays, with no object per part (issue 14, part 15): every part admitted
        (admission.admits_step_fold) and no rank of it reported in its step yet
        (soft.fresh_in_step): what `step_aggregates` decides of the parts when it admits them all.
        None, with nothing changed: decide `fold.parts()` with `step_aggregates`, which names
        refusals. tests/unit/supervisor/test_step_folds.py compares the three ways."""
        if len(fold.segments) < 2 or not admission.admits_step_fold(self.state, self.soft, fold):
            return None
        if not soft_state.fresh_in_step(self.soft, self.state, fold.generation, fold.step, [fold]):
            return None
        seen = soft_state.observe(self.soft, self.state, fold, now, self.config.straggler, self.config.sdc)
        decision = decide(self.state, self.soft, fold, now, self.config, seen)
        return BatchReady((None,) * len(fold.segments), Ready(decision.events, decision.waiting_reason,
                                                              affected_nodes(self.state, decision.events),
                                                              first_seq=decision.first_seq))

    def step_holdings(self, parts: Sequence[SnapshotHoldings], now: float, *, tried_whole: bool = False
                      ) -> BatchReady | None:
        """Several nodes' SnapshotHoldings of one generation's step (each node once, as a link
        shard's batch brings them back to back), decided as one input: what `step` decides of each
        in turn, with one decision instead of one per node (issue 14: a RAM snapshot every step
        makes a node's holdings, its own ranks' and its buddy's copies, the leader's most frequent
        input at 12,500 nodes).

        Equal to stepping them one by one because a holding decides only whether its step
        commits: each part is admitted and observed in turn, as alone, and the fold ends at the
        first part after which the step commits (that part's decision is the fold's); until then
        every part, one by one, would have decided nothing and changed no state, so each later
        part's admission sees what it would have seen. The Ready covers the parts up to that one
        (`len(refusals)`); the caller steps the rest alone, after enacting it (they come after the
        commit). The usual fold, every part admitted and none completing the step, is held with one
        set of array operations over all its entries (soft.hold_fold); the fold that may complete
        it goes part by part. tests/unit/supervisor/test_snapshot_holdings.py compares them.
        `tried_whole`: the caller's step_holdings_fold of these parts just declined (the runtime's
        fold from a shard): part by part at once, not asked again."""
        if len(parts) < 2:
            return None
        first = parts[0]
        if any((p.generation, p.step) != (first.generation, first.step) for p in parts):
            return None
        if len({p.node_id for p in parts}) != len(parts):
            return None
        held = None if tried_whole else self.step_holdings_fold(HoldingsFold.of_parts(parts), now)
        if held is not None:
            return held
        refusals: list[Refusal | None] = []
        last: SnapshotHoldings | None = None
        for part in parts:
            refused = self._admit(part, now)
            refusals.append(refused)
            if refused is None:
                last = part
                if snapshot_commits.commit_if_held(self.state, self.soft, part.step):
                    break  # the step is whole: this part decides; the rest come after the commit
        if last is None:
            return BatchReady(tuple(refusals), Ready(waiting_reason=self.waiting_reason))
        decision = decide(self.state, self.soft, last, now, self.config)
        return BatchReady(tuple(refusals), Ready(decision.events, decision.waiting_reason,
                                                 affected_nodes(self.state, decision.events),
                                                 first_seq=decision.first_seq))

    def step_holdings_fold(self, fold: HoldingsFold, now: float) -> BatchReady | None:
        """The usual fold of holdings decided whole, with no object per part or entry: every part
        admitted (admission.admits_fold, step_holdings.locate) and none completing the step
        (soft.hold_fold). Its Ready is the decision the last part alone would make, and covers
        every part. None, with nothing changed: decide the parts with `step_holdings`, which
        names refusals and lands a commit at the part that completes it."""
        generation = self.state.generation
        if len(fold) < 2 or generation is None or not admission.admits_fold(self.state, self.soft, fold):
            return None
        located = step_holdings.locate(generation.index.holder_slots(), fold)
        if located is None or not soft_state.hold_fold(self.soft, self.state, fold, located, now):
            return None
        decision = decide(self.state, self.soft, fold.part(-1), now, self.config)
        return BatchReady((None,) * len(fold), Ready(decision.events, decision.waiting_reason,
                                                     affected_nodes(self.state, decision.events),
                                                     first_seq=decision.first_seq))

    def _admit(self, inp: Input, now: float) -> Refusal | None:
        reason = admission.refusal(self.state, self.soft, inp, self.config)
        if reason is not None:
            return Refusal(RefusalKind.PERMANENT, reason)
        soft_state.observe(self.soft, self.state, inp, now, self.config.straggler, self.config.sdc)
        return None

    # -- folding ----------------------------------------------------------------------------------
    def records(self, events: Sequence[Event], time_s: float, term: int = 0) -> list[Record]:
        """`events` as the next records of a log that has no other writer (the simulator's and the
        test driver's stand-in for an append), stamped `time_s`."""
        seq = self.state.applied_seq
        return [Record(seq + i, term, time_s, event) for i, event in enumerate(events, start=1)]

    def advance(self, ready: Ready, records: Sequence[Record], *, clock_offset_s: float = 0.0,
                on_record: Callable[[Record], None] | None = None) -> None:
        """Folds the records `ready.events` were persisted as, and adopts its waiting reason."""
        if tuple(r.event for r in records) != ready.events:
            raise InvalidEvent(f"advance got {len(records)} records for a Ready of {len(ready.events)} events"
                               " (or other events): persist exactly ready.events")
        if records and ready.first_seq and records[0].seq != ready.first_seq:
            # Quarantines name their evidence (and SDC checks themselves) by the seqs decide
            # numbered the events with: stored under other seqs, they would name other records.
            raise InvalidEvent(f"advance got records from seq {records[0].seq} for a Ready decided to be"
                               f" appended from seq {ready.first_seq}: append right after the state it was decided on")
        self.fold(records, clock_offset_s=clock_offset_s, on_record=on_record)
        self.soft.waiting_reason = ready.waiting_reason

    def fold(self, records: Sequence[Record], *, clock_offset_s: float = 0.0,
             on_record: Callable[[Record], None] | None = None) -> None:
        """Folds stored records (a replay, a follower's copy, a persisted Ready) into the state,
        the Young/Daly observations (record times plus `clock_offset_s`: the wall clock moved onto
        the monotonic one the core decides with) and the snapshot holdings a commit retires.

        A batch that cannot change the generation (registrations, liveness) is folded with one copy
        of the node map (see evolve_all); `on_record` is called once each record is folded in."""
        is_bulk = len(records) > 1 and not any(isinstance(r.event, INTERVAL_EVENTS) for r in records)
        if is_bulk:
            self.state = apply_records(self.state, records)
        for record in records:
            if not is_bulk:
                self._fold_one(record, clock_offset_s)
            if isinstance(record.event, SnapshotCommitted):
                soft_state.forget_committed(self.soft, record.event.step)
            if on_record is not None:
                on_record(record)

    def _fold_one(self, record: Record, clock_offset_s: float) -> None:
        self.state = apply_record(self.state, record)
        if isinstance(record.event, INTERVAL_EVENTS):
            shifted = Record(record.seq, record.term, record.time_unix_s + clock_offset_s, record.event)
            self.interval_obs = interval_policy.observe(self.interval_obs, shifted)
            self.soft.interval_obs = self.interval_obs

    def checkpoint_advice(self, now: float) -> interval_policy.IntervalAdvice:
        """The Young/Daly interval at `now`, from the costs and failures folded so far (and why)."""
        return interval_policy.advise(self.interval_obs, self.config.checkpoint_timing.interval, now)
