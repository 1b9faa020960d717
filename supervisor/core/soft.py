"""Keeps the soft state current from the input stream: who spoke when, what streams are open,
how far the generation in force has got, which snapshots are held where.

Deterministic and clock-free (`now` is an argument), but it mutates the `SoftState` the runtime
owns: soft state is rebuilt from inputs, never logged, so copying it per heartbeat buys nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import overload

import numpy as np

from ftsup.supervisor.core import checkpoints, open_steps
from ftsup.supervisor.core.events import SdcRankDigests
from ftsup.supervisor.core.inputs import (
    AgentGone,
    AgentHello,
    HeardFrom,
    Heartbeat,
    HoldingsFold,
    Input,
    OperatorCommandKind,
    OperatorRequest,
    RankFinished,
    Ranks,
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
    MAX_CLEAR_STEPS,
    MAX_HELD_EXITS,
    MAX_HOLDING_LEAD,
    MAX_HOLDING_STEPS,
    MAX_SHARDS,
    XID_HISTORY_MAX,
    XID_HISTORY_S,
)
from ftsup.supervisor.core.open_steps import OpenVotes
from ftsup.supervisor.core.policies import exit_cause
from ftsup.supervisor.core.policies import failure as failure_policy
from ftsup.supervisor.core.policies import sdc as sdc_policy
from ftsup.supervisor.core.policies import straggler as straggler_policy
from ftsup.supervisor.core.policies.sdc import SdcConfig, StepVote
from ftsup.supervisor.core.policies.straggler import StragglerConfig, StragglerVerdict
from ftsup.supervisor.core.policies.xid import XidSighting
from ftsup.supervisor.core.state import (
    NOTHING_OBSERVED,
    ClusterState,
    Generation,
    GenerationProgress,
    MemberIndex,
    NodeSoft,
    Observation,
    SoftState,
)
from ftsup.supervisor.core.step_holdings import Located, StepHoldings


def observe(
    soft: SoftState, state: ClusterState, inp: Input, now: float, straggler: StragglerConfig = StragglerConfig(),
    sdc: SdcConfig = SdcConfig(),
) -> Observation:
    """Records what `inp` says about liveness and progress; returns what it completed that
    `decide` must act on (a step's straggler scores, its digest vote): pass it to `decide` on
    the same input."""
    _note_input(soft, state, now, clocks=not isinstance(inp, (Heartbeat, HeardFrom)))
    match inp:
        case Tick() if inp.stalled_s > 0:
            _forgive_stall(soft, inp.stalled_s)
        case XidReport():
            _heard(soft, inp.node_id, now)
            history = [s for s in soft.xids.get(inp.node_id, []) if now - s.time_s <= XID_HISTORY_S]
            history.append(XidSighting(now, inp.code, inp.pci))  # decide reads it as "this one"
            soft.xids[inp.node_id] = history[-XID_HISTORY_MAX:]
        case TrainerHung():
            _heard(soft, inp.node_id, now)
        case OperatorRequest():
            if inp.command is OperatorCommandKind.DRAIN:
                soft.pending_drains.add(inp.node_id)
            elif inp.command is OperatorCommandKind.UNQUARANTINE:
                soft.pending_drains.discard(inp.node_id)
        case AgentHello():
            soft.detector_memo.changed()
            soft.links += 1
            soft.nodes[inp.node_id] = NodeSoft(
                last_heard_s=now, stream_id=inp.stream_id, incarnation=inp.incarnation, shard=inp.shard
            )
        case StreamClosed():
            node = soft.nodes.get(inp.node_id)
            if node is not None and node.stream_id == inp.stream_id:
                node.stream_id = None
                node.disconnected_at_s = now
                node.closed_stream_id = inp.stream_id
                soft.detector_memo.changed()
                soft.links += 1
        case AgentGone():
            node = soft.nodes.get(inp.node_id)
            if (node is not None and node.stream_id is None and node.closed_stream_id == inp.stream_id
                    and node.incarnation == inp.incarnation):
                node.agent_gone = inp.detail or "its agent is gone"
                soft.detector_memo.changed()
        case Heartbeat():
            _heard(soft, inp.node_id, now)
        case HeardFrom():
            shard = inp.shard
            if shard:
                _shard_heard(soft, shard, now)
            nodes = soft.nodes
            soft.detector_memo.heard(now)
            for node_id in inp.node_ids:  # (the hot loop of a shard's summary: _heard inlined)
                node = nodes.get(node_id)
                if node is not None:
                    node.last_heard_s = now
                    node.shard = shard
        case SnapshotMemoryReport():
            _heard(soft, inp.node_id, now)
            node = soft.nodes.get(inp.node_id)
            if node is not None:
                node.snapshot_memory = inp
        case TrainerExit():
            _heard(soft, inp.node_id, now)
            if inp.exit_code == 0 and inp.is_plain_script:
                # Level 0: a plain script's exit 0 is its "finished" (torchrun's rule).
                progress = _progress_for(soft, state, inp.generation)
                if progress is not None:
                    progress.finished[inp.rank] = ""
            elif exit_cause.should_hold(state, inp):
                _hold_exit(soft, state, inp, now)
        case StepReport():
            return _observe_step(soft, state, StepAggregate.of_reports((inp,)), now, straggler, sdc)
        case StepAggregate():
            return _observe_step(soft, state, inp, now, straggler, sdc)
        case SnapshotReport():
            _hold_all(soft, state, SnapshotHoldings.of_reports((inp,)), now)  # (one holding of an older agent)
        case SnapshotHoldings():
            _hold_all(soft, state, inp, now)
        case RankFinished():
            _heard(soft, inp.node_id, now)
            progress = _progress_for(soft, state, inp.generation)
            if progress is not None:
                progress.finished[inp.rank] = inp.param_digest
                progress.max_step = max(progress.max_step, inp.step)
    return NOTHING_OBSERVED


def _note_input(soft: SoftState, state: ClusterState, now: float, clocks: bool = True) -> None:
    """What every input brings up to date before what it says is recorded (the same for any
    number of inputs at one `now` against one state): open SDC checks' first sightings, drains
    still pending, and the checkpoint clocks (`clocks`: not for liveness, which decides nothing
    about checkpoints)."""
    if soft.sdc_check_seen_s or state.sdc_checks:
        _see_sdc_checks(soft, state, now)
    if soft.pending_drains:
        soft.pending_drains = {n for n in soft.pending_drains if n in state.nodes and not state.nodes[n].is_drained}
    if clocks:
        checkpoints.note_clocks(soft, state, now)


def _observation(verdicts: tuple[StragglerVerdict, ...] | None, voted: tuple[StepVote, VoteReports] | None
                 ) -> Observation:
    if verdicts is None and voted is None:
        return NOTHING_OBSERVED
    vote, reports = voted if voted is not None else (None, ())
    return Observation(verdicts or (), vote, reports)


def _observe_step(soft: SoftState, state: ClusterState, aggregate: StepAggregate, now: float,
                  straggler: StragglerConfig, sdc: SdcConfig) -> Observation:
    """Records a node's ranks' reports of one step (as if they came one by one, in order);
    returns the straggler verdicts and the digest vote of the step they completed, if they did.
    A fold of several nodes' aggregates (StepAggregate.fold) is recorded as they would be one by one."""
    if aggregate.segments:
        _heard_all(soft, aggregate.node_ids(), now)
    else:
        _heard(soft, aggregate.node_id, now)
    progress = _progress_for(soft, state, aggregate.generation)
    if progress is None:
        return NOTHING_OBSERVED
    progress.step_reports += len(aggregate.ranks)
    if aggregate.step >= progress.max_step:
        progress.max_step = aggregate.step
        progress.step_time_s = float(aggregate.step_time_s[-1])
        loss = float(aggregate.loss[-1])
        if math.isfinite(loss):  # the last rank's loss, or the last finite one before it
            progress.last_loss = loss
        else:
            finite = np.flatnonzero(np.isfinite(aggregate.loss))
            if len(finite):
                progress.last_loss = float(aggregate.loss[finite[-1]])
    return _observation(_score_compute_time(progress, state, aggregate, straggler),
                        _vote_digests(progress, state, aggregate, sdc))


def _hold_exit(soft: SoftState, state: ClusterState, exit_: TrainerExit, now: float) -> None:
    progress = _progress_for(soft, state, exit_.generation)
    if progress is None or exit_.rank in progress.finished or len(progress.held_exits) >= MAX_HELD_EXITS:
        return
    progress.held_exits.append(exit_)
    if progress.held_since_s is None:
        progress.held_since_s = now


def _hold_all(soft: SoftState, state: ClusterState, holdings: SnapshotHoldings, now: float) -> None:
    """Records a node's copies of one step, entry by entry in their order. A node vouches only for
    itself (each holder reports its own copy) and for the bytes it names: a copy whose SHA-256
    differs from the rank's first report (a buddy handed other bytes than the owner holds) makes
    the step uncommittable. Nothing is recorded of a step beyond any the generation could have
    reached (it would only grow `holdings`) or at or below the committed step (it can never
    commit, and entries after the step committed would otherwise linger until the next commit)."""
    _heard(soft, holdings.node_id, now)
    progress = _progress_for(soft, state, holdings.generation)
    if progress is None or not _keeps(progress, state, holdings.step):
        return
    assert state.generation is not None  # (a progress is the generation in force's)
    slots = state.generation.index.holder_slots()
    number = slots.numbers.get(holdings.node_id)
    if number is None:
        return  # (admitted holdings are an owner's or a buddy's: no other node has a slot)
    held = progress.holdings.get(holdings.step)
    if held is None:
        going = _room_for(progress, holdings.step)
        if going == holdings.step:
            return
        _evict(progress, going)
        held = progress.holdings[holdings.step] = StepHoldings(slots)
    if held.hold(map(slots.position, holdings.ranks), number, holdings.sha256):
        progress.holding_mismatches.add(holdings.step)  # other bytes than a rank's first copy: never commits


def hold_fold(soft: SoftState, state: ClusterState, fold: HoldingsFold, located: Located, now: float) -> bool:
    """Records several nodes' holdings of one step (a fold whose every part is admitted, its
    entries `located`) as one: what `observe` records of each part in turn, held with one set of
    array operations over all their entries instead of one pass per node (issue 14: a link
    shard's fold of a step's holdings).

    Only while none of them can complete the step: holding them all leaves fewer (rank, holder)
    pairs than a commit needs, so one by one no part's decision would have committed, and each
    later part would have seen what it sees here. False, with nothing recorded: a part may
    complete the step (or the step is not kept); observe them one by one, so the commit lands at
    the part that completes it."""
    progress = _progress_for(soft, state, fold.generation)
    step = fold.step
    if progress is None or not _keeps(progress, state, step):
        return False
    held = progress.holdings.get(step)
    going = None if held is not None else _room_for(progress, step)
    if going == step:
        return False  # (no room for it: one by one, nothing of it would be kept either)
    assert state.generation is not None  # (a progress is the generation in force's)
    weighing = held if held is not None else StepHoldings(state.generation.index.holder_slots())
    weighed = weighing.weigh(located)
    if weighing.pairs + weighed.added >= weighing.required:
        return False
    _note_input(soft, state, now)
    _heard_all(soft, fold.node_ids, now)
    if held is None:
        _evict(progress, going)
        held = progress.holdings[step] = weighing
    held.take(weighed)
    if weighed.mismatched:
        progress.holding_mismatches.add(step)
    return True


def _room_for(progress: GenerationProgress, step: int) -> int | None:
    """Which kept step must go for `step`'s holdings to be kept: None when there is room (at most
    MAX_HOLDING_STEPS steps are kept: each is arrays over every rank, made at its first entry, so
    a node naming a thousand future steps would otherwise cost the leader a gigabyte at 100,000
    ranks); `step` itself when it is the one not to keep. The step farthest from the newest
    reported one goes (of two as far, the later): a fleet's next commit is at or just behind it,
    far ahead is a confused node, far behind can no longer be the restore point."""
    held = progress.holdings
    if len(held) < MAX_HOLDING_STEPS:
        return None
    newest = progress.max_step
    return max((*held, step), key=lambda s: (abs(s - newest), s))


def _evict(progress: GenerationProgress, step: int | None) -> None:
    if step is not None:
        del progress.holdings[step]
        progress.holding_mismatches.discard(step)


def _keeps(progress: GenerationProgress, state: ClusterState, step: int) -> bool:
    """Whether holdings of `step` are recorded: not beyond any step the generation could have
    reached, nor at or below the committed one."""
    return step <= progress.max_step + MAX_HOLDING_LEAD and (state.snapshot is None or step > state.snapshot.step)


def _score_compute_time(progress: GenerationProgress, state: ClusterState, aggregate: StepAggregate,
                        config: StragglerConfig) -> tuple[StragglerVerdict, ...] | None:
    """Once every rank reported a step, the straggler detector scores its compute times (None:
    the step still waits for ranks). The last completion wins, as the last report's would."""
    assert state.generation is not None
    world = state.generation.world_size
    verdicts: tuple[StragglerVerdict, ...] | None = None
    start, count = 0, len(aggregate.ranks)
    while start < count:
        start, complete = open_steps.add_times(progress.open_times, aggregate.step, world, aggregate, start)
        if complete is not None:
            ranks, times = complete.scored()
            verdicts = tuple(straggler_policy.observe_step(progress.straggler, aggregate.step, ranks, times, config))
    return verdicts


def _vote_digests(progress: GenerationProgress, state: ClusterState, aggregate: StepAggregate, config: SdcConfig
                  ) -> tuple[StepVote, VoteReports] | None:
    """Once every rank reported a step, its digests are voted on (policies/sdc.py); what every
    rank reported comes with the vote, for a recompute check of the step (None: the step still
    waits for ranks)."""
    generation = state.generation
    assert generation is not None
    world = generation.world_size
    voted: tuple[StepVote, VoteReports] | None = None
    start, count = 0, len(aggregate.ranks)
    while start < count:
        start, complete = open_steps.add_votes(progress.open_votes, aggregate.step, world, aggregate, start)
        if complete is None:
            continue
        step = aggregate.step
        vote = sdc_policy.vote_step(step, complete.by_digest(), world, config, complete.reported_groups())
        if vote.is_clear:
            progress.sdc_clear_steps.add(step)
            for old in sorted(progress.sdc_clear_steps)[:-MAX_CLEAR_STEPS]:
                progress.sdc_clear_steps.discard(old)
        elif progress.sdc_diverged_step is None or step < progress.sdc_diverged_step:
            progress.sdc_diverged_step = step
        voted = vote, VoteReports(complete, generation)
    return voted


class VoteReports(Sequence[SdcRankDigests]):
    """What every rank reported at a voted step, by rank: `SdcRankDigests(rank, its node, its
    local-gradient digest or "", its parameter digest)`, each made when read. A vote completes
    every step and its evidence is read only when a recompute check starts; at 12,500 ranks
    building every record per step cost ~10 ms. Equal to the tuple of the same records."""

    __slots__ = ("_votes", "_ranks", "_generation", "_param_values", "_grad_values")

    def __init__(self, votes: OpenVotes, generation: Generation) -> None:
        # A completed track is no longer written (observe dropped it), and a Generation never
        # changes: reading later reads what was reported. Per-rank codes are made on first read.
        self._votes, self._generation = votes, generation
        self._ranks: Ranks | None = None
        self._param_values: list[str] = []
        self._grad_values: list[str] = []

    @classmethod
    def of_dicts(cls, digests: Mapping[int, str], grads: Mapping[int, str], generation: Generation) -> VoteReports:
        """From rank -> parameter digest and rank -> gradient digest (tests, small callers)."""
        votes = open_steps.OpenVotes(max(digests, default=-1) + 1)
        votes.densify()
        for rank, digest in digests.items():
            votes.seen[rank] = 1
            votes.params[rank] = votes.param_values.setdefault(digest, len(votes.param_values))
            if grads.get(rank):
                votes.grads[rank] = votes.grad_values.setdefault(grads[rank], len(votes.grad_values))
        votes.count = len(digests)
        return cls(votes, generation)

    def _sorted_ranks(self) -> Ranks:
        if self._ranks is None:
            self._votes.densify()
            self._param_values, self._grad_values = list(self._votes.param_values), list(self._votes.grad_values)
            self._ranks = self._votes.ranks_seen()
        return self._ranks

    def __len__(self) -> int:
        return self._votes.count

    @overload
    def __getitem__(self, index: int) -> SdcRankDigests: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[SdcRankDigests, ...]: ...

    def __getitem__(self, index: int | slice) -> SdcRankDigests | tuple[SdcRankDigests, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        rank = int(self._sorted_ranks()[index])
        node = self._generation.node_of_rank(rank) or ""
        votes = self._votes
        grad = int(votes.grads[rank])
        return SdcRankDigests(rank, node, self._grad_values[grad] if grad >= 0 else "",
                              self._param_values[int(votes.params[rank])])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, VoteReports)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


def is_committable(progress: GenerationProgress, step: int) -> bool:
    """A snapshot of `step` may be committed: its digests agreed and none before it diverged."""
    diverged = progress.sdc_diverged_step
    return step in progress.sdc_clear_steps and (diverged is None or step < diverged)


def lacks_pairs(held: Mapping[int, frozenset[str]], index: MemberIndex) -> bool:
    """`held` is a StepHoldings with fewer (rank, holder) pairs than a commit needs: not held
    twice, known without a pass (False: a pass must say)."""
    return isinstance(held, StepHoldings) and held.pairs < held.required


def is_held_twice(held: Mapping[int, frozenset[str]], index: MemberIndex) -> bool:
    """Every rank of the generation is held by its node and by its node's buddy, where it has one
    (`held`: rank -> holders, from one step's holdings). A StepHoldings of the generation's exact
    slots answers with two array passes (at 12,500 nodes a commit is otherwise milliseconds of
    Python); anything else is asked member by member."""
    if isinstance(held, StepHoldings):
        if held.pairs < held.required:
            return False
        if held.slots.exact:
            return held.is_whole()
    return all(
        {m.node_id, m.buddy_node_id} - {""} <= held.get(rank, frozenset())
        for m in index.members for rank in m.ranks
    )


def forget_committed(soft: SoftState, up_to_step: int) -> None:
    """Drops holdings at or below a committed step: they can never be committed again."""
    if soft.progress is not None:
        for step in [s for s in soft.progress.holdings if s <= up_to_step]:
            del soft.progress.holdings[step]
        soft.progress.holding_mismatches = {s for s in soft.progress.holding_mismatches if s > up_to_step}
        soft.progress.sdc_clear_steps = {s for s in soft.progress.sdc_clear_steps if s > up_to_step}


def _see_sdc_checks(soft: SoftState, state: ClusterState, now: float) -> None:
    """Open checks' answers are due a timeout after this supervisor first saw them open."""
    open_ids = {c.check_id for c in state.sdc_checks}
    for check_id in [c for c in soft.sdc_check_seen_s if c not in open_ids]:
        del soft.sdc_check_seen_s[check_id]
    for check_id in open_ids:
        soft.sdc_check_seen_s.setdefault(check_id, now)


def _forgive_stall(soft: SoftState, stalled_s: float) -> None:
    """Moves every node's clocks forward by our own stall: silence we could not hear is not theirs
    (nor a shard's: its summaries waited for us)."""
    soft.detector_memo.changed()
    for node in soft.nodes.values():
        node.last_heard_s += stalled_s
        if node.disconnected_at_s is not None:
            node.disconnected_at_s += stalled_s
    for check_id in soft.sdc_check_seen_s:
        soft.sdc_check_seen_s[check_id] += stalled_s
    for shard in soft.shard_heard_s:
        soft.shard_heard_s[shard] += stalled_s


def _shard_heard(soft: SoftState, shard: str, now: float) -> None:
    """A summary from `shard` (one that keeps alive): the end of its quiet, if it was quiet. What
    its nodes could not tell us while it was quiet is forgiven them, as our own stall is: their
    clocks move forward by the quiet (those this summary names are heard now anyway). A shard
    quiet for longer than SHARD_QUIET_LIMIT allowances was gone: its nodes were judged meanwhile
    (policies/failure.py) and the dead stay dead; forgiving the rest changes nothing for them."""
    heard = soft.shard_heard_s
    last = heard.pop(shard, None)  # (re-inserted last: the dict stays oldest first)
    heard[shard] = now
    if last is None:
        while len(heard) > MAX_SHARDS:
            del heard[next(iter(heard))]
        return
    quiet_s = now - last - failure_policy.QUIET_SHARD_AFTER_S
    if quiet_s > 0:
        soft.detector_memo.changed()
        for node in soft.nodes.values():
            if node.shard == shard:
                node.last_heard_s = min(now, node.last_heard_s + quiet_s)


def _heard_all(soft: SoftState, node_ids: Iterable[str], now: float) -> None:
    """`_heard` for each of a fold's nodes (the loop inlined: a fold names thousands)."""
    nodes = soft.nodes
    known = False
    for node_id in node_ids:
        node = nodes.get(node_id)
        if node is not None:
            node.last_heard_s = now
            known = True
    if known:
        soft.detector_memo.heard(now)


def _heard(soft: SoftState, node_id: str, now: float) -> None:
    node = soft.nodes.get(node_id)
    if node is not None:
        node.last_heard_s = now
        soft.detector_memo.heard(now)


def fresh_in_step(soft: SoftState, state: ClusterState, generation: int, step: int,
                  parts: Sequence[StepAggregate]) -> bool:
    """Whether no rank of `parts` was reported yet in `step` of `generation` (neither track
    holds one): then those ranks, each once, can complete the step only at the last of them
    (the condition under which Core.step_aggregates decides them as one). Reads; changes nothing."""
    progress = soft.progress
    if progress is None or progress.generation != generation:
        return True  # (no report of this generation observed yet: every track starts empty)
    tracks = [track for track in (progress.open_times.get(step), progress.open_votes.get(step)) if track is not None]
    if not tracks:
        return True
    ranks = np.concatenate([part.ranks for part in parts]) if parts else np.empty(0, dtype=np.int64)
    for track in tracks:
        seen = np.frombuffer(track.seen, dtype=np.bool_)
        was_seen = bool(seen[ranks[(ranks >= 0) & (ranks < len(seen))]].any())
        del seen  # (a live view would pin the bytearray's size: the track grows it)
        if was_seen:
            return False
    return True


def _progress_for(soft: SoftState, state: ClusterState, generation: int) -> GenerationProgress | None:
    if state.generation is None or state.generation.number != generation:
        return None
    if soft.progress is None or soft.progress.generation != generation:
        start = state.generation.restore_step or 0
        soft.progress = GenerationProgress(generation=generation, max_step=start)
    return soft.progress
