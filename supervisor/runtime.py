"""The supervisor's one loop: input -> refuse or observe -> decide -> append -> evolve -> directives.

One asyncio task owns the live ClusterState and SoftState; gRPC handlers only submit inputs and
read immutable snapshots of the state. Appends happen before the state changes, so a replica
replaying the log reaches exactly the state this one acted on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ftsup.common import logs
from ftsup.supervisor import agent_probe, codec
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.directives import Directive, directives_for
from ftsup.supervisor.core.events import Record, SnapshotCommitted
from ftsup.supervisor.core.inputs import (
    AgentGone,
    AgentHello,
    HeardFrom,
    Heartbeat,
    HoldingsFold,
    Input,
    LeadershipAcquired,
    SnapshotHoldings,
    StepAggregate,
    StreamClosed,
    Tick,
)
from ftsup.supervisor.core.limits import HELLO_BATCH, PUSH_SLICE, STREAM_INPUT_CAPACITY
from ftsup.supervisor.core.policies import failure
from ftsup.supervisor.core.policies import interval as interval_policy
from ftsup.supervisor.core.state import ClusterState, SoftState
from ftsup.supervisor.core.step import BatchReady, Core, Ready, Refusal
from ftsup.supervisor.core.views import NodeFigures, NodeView, StatusView, node_figures, node_views, status_view
from ftsup.supervisor.event_lines import EventLines
from ftsup.supervisor.eventlog.api import Deposed, EventLog, Fenced, LogError
from ftsup.supervisor.outbox import SharedSender, StreamOutbox
from ftsup.supervisor.push_slices import OwedPushes
from ftsup.supervisor.refusal_log import RefusalLog
from ftsup.supervisor.slot_pool import SlotPool
from ftsup.v1 import agent_pb2

if TYPE_CHECKING:
    from ftsup.supervisor.metrics import SupervisorMetrics

log = logs.get("supervisor.runtime")

Outbox = StreamOutbox

# A closed stream's grace ends in a Tick scheduled for it (Runtime._tick_after): closes
# within one bucket share it; the slack puts it past the core's `>= grace` comparison.
GRACE_WAKE_S = 0.02
GRACE_WAKE_SLACK_S = 0.002


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one input: refused (and why), or the records it caused (maybe none).

    `is_retryable` marks a refusal that says nothing about the input: this replica could not
    decide now (event log unavailable, leadership changing, an internal error). The sender may
    send it again later; every other refusal is the input's own fault and final."""

    refusal: str | None = None
    records: tuple[Record, ...] = ()
    is_retryable: bool = False


@dataclass(frozen=True, slots=True)
class InputRun:
    """Inputs a link shard's relay batch brought, handed to the loop as one queue item with one
    reply (`Runtime.submit_run_from_stream`): each is still admitted, decided and enacted alone,
    in order, exactly as if queued one by one; only the queueing, the reply future and its
    callbacks are paid once per run instead of once per node-step (issue 14)."""

    inputs: tuple[Input, ...]
    # Or, with no inputs: a link shard's holdings fold (ShardHoldingsFold), decided as its parts
    # would be, one outcome per part (Runtime.submit_holdings_fold)...
    holdings: HoldingsFold | None = None
    # ...or its step fold (ShardStepFold: `segments` name the parts' nodes), likewise
    # (Runtime.submit_step_fold).
    step_fold: StepAggregate | None = None


_LIVENESS_LANE, _ARRIVAL_LANE = 0, 1  # (the queue's lanes: lower first)


@dataclass(slots=True)
class _Pending:
    inp: Input | InputRun
    reply: asyncio.Future[Any] | None  # of an Outcome; of a list of them for an InputRun
    # When the input arrived: it is decided as of then. Under load the queue lags, and a Tick
    # judged at its (late) handling time would blame nodes whose heartbeats wait behind it.
    at_s: float | None = None
    slots: int = 0  # agent streams' inputs: the stream-input slots it frees once taken


class Runtime:
    def __init__(
        self,
        config: CoreConfig,
        event_log: EventLog,
        *,
        term: int = 0,
        tick_s: float = 0.1,
        snapshot_every: int = 10_000,
        stream_input_capacity: int = STREAM_INPUT_CAPACITY,
        hello_batch: int = HELLO_BATCH,
        push_slice: int = PUSH_SLICE,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.event_log = event_log
        self.term = term
        self._tick_s = tick_s
        self._clock = clock
        self._wall = wall_clock
        self._snapshot_every = snapshot_every
        if hello_batch < 1:
            raise ValueError(f"hello_batch must be >= 1, got {hello_batch}")
        self._hello_batch = hello_batch  # 1: every Hello decided and appended alone (the bench's baseline)
        # The state, the soft state and the Young/Daly inputs (checkpoint costs, failures) as far
        # as the log still shows them: every decision is the core's step (core/step.py).
        self.core = Core(config, event_log.load_snapshot() or ClusterState(), SoftState(started_at_s=clock()))
        self._snapshot_seq = self.state.applied_seq
        self._fold(event_log.read(self.state.applied_seq + 1))
        self.degraded_reason = ""  # set while the event log cannot be written: nothing is decided
        # Replication: only the leader decides. An embedded (single) supervisor always leads.
        self.is_leader = True
        self.leader_address = ""  # who leads, for NotLeader answers (empty: unknown or us)
        self.deposed = asyncio.Event()  # set when an append shows another replica leads now
        # Internal inputs (ticks, stream closes, operators, checkpoint results) are few and never
        # wait; agent streams' inputs are bounded by the slots (submit_from_stream).
        # Inputs in arrival order, except that a link shard's liveness summary (HeardFrom) is taken
        # first: it only marks nodes heard, and the acks it releases must not wait behind a
        # synchronous step's burst of a shard's aggregates (issue 14: p99 0.4-1.2 s behind them at
        # 2,000 nodes stepping together every second). A node it names whose Hello still waits is
        # not in the soft state yet and is skipped, as a summary that raced a Hello always was (the
        # Hello marks it heard). Ties keep arrival order (the sequence number).
        self._queue: asyncio.PriorityQueue[tuple[int, int, _Pending]] = asyncio.PriorityQueue()
        self._arrivals = itertools.count()
        self._grace_wakes: set[int] = set()  # GRACE_WAKE_S buckets with a Tick pending (close_stream)
        self.probes = agent_probe.AgentProbes(lambda: self.generation_in_force)  # a closed stream's agent gone?
        self._event_lines = EventLines(log)  # (a batch's registrations: one line)
        self._refusal_log = RefusalLog(log)  # (a failure's tail of refusals: counted, not a line each)
        self._stream_slots = SlotPool(stream_input_capacity)
        self._stream_capacity = stream_input_capacity
        self._stream_ids = itertools.count(1)
        self._outboxes: dict[int, Outbox] = {}
        self._node_stream: dict[str, int] = {}
        self._sent: dict[str, Directive] = {}
        self._owed = OwedPushes(push_slice, log, clock)  # a push's nodes past its first slice
        self._takes_retain: set[str] = set()  # nodes whose Hello said takes_snapshot_retain
        # The newest commit said in a SnapshotRetain: a notice-taking node's `_sent` directive
        # of that generation holds it as retain_from_step, though `_sent` is not rewritten per notice
        self._retain_said = SnapshotCommitted(generation=0, step=0)
        self._announcement: LeadershipAcquired | None = None  # decided before anything else
        self._held: _Pending | None = None  # the input that ended a Hello batch: handled next
        self.metrics: SupervisorMetrics | None = None  # set by the daemon when metrics are served
        self.checkpointer: Any = None  # supervisor.checkpointer.Checkpointer, set when a store is configured
        log.info("state replayed", from_snapshot_seq=self._snapshot_seq, head_seq=self.state.applied_seq,
                 nodes=len(self.state.nodes), generation=self.generation_in_force)

    @property
    def state(self) -> ClusterState:
        """The cluster state as folded so far (immutable: readers may keep it)."""
        return self.core.state

    @property
    def soft(self) -> SoftState:
        return self.core.soft

    @property
    def generation_in_force(self) -> int | None:
        """The number of the generation in force, None between generations: every log line about
        a node carries it (`generation`), here and in the servers."""
        generation = self.state.generation
        return generation.number if generation is not None else None

    # -- called by the servers -------------------------------------------------------------
    def submit(self, inp: Input) -> asyncio.Future[Outcome]:
        """Queues an input; the future resolves once it was refused or handled."""
        reply: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._put(_Pending(inp, reply, self._clock()))
        return reply

    def post(self, inp: Input) -> None:
        self._put(_Pending(inp, None, self._clock()))

    def _put(self, pending: _Pending) -> None:
        lane = _LIVENESS_LANE if isinstance(pending.inp, HeardFrom) else _ARRIVAL_LANE
        self._queue.put_nowait((lane, next(self._arrivals), pending))

    async def submit_from_stream(self, inp: Input) -> asyncio.Future[Outcome]:
        """Like submit, for an agent stream's input: waits while STREAM_INPUT_CAPACITY inputs
        from streams are queued (back-pressure instead of unbounded memory)."""
        await self._stream_slots.take(1)
        reply: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._put(_Pending(inp, reply, self._clock(), slots=1))
        return reply

    async def submit_run_from_stream(self, inputs: Sequence[Input]) -> asyncio.Future[list[Outcome]]:
        """Like submit_from_stream for several inputs, handled back to back in order (InputRun):
        the future resolves to their outcomes, in order. Takes a slot per input, so the queue's
        bound counts inputs either way; a run must not be longer than the capacity."""
        return await self._submit_run(InputRun(tuple(inputs)), len(inputs))

    async def submit_holdings_fold(self, fold: HoldingsFold) -> asyncio.Future[list[Outcome]]:
        """A link shard's holdings fold (several nodes' SnapshotHoldings of one step, each node
        once) as one run: the future resolves to each part's outcome, in order. A slot per part,
        as its messages would take."""
        return await self._submit_run(InputRun((), holdings=fold), len(fold))

    async def submit_step_fold(self, fold: StepAggregate) -> asyncio.Future[list[Outcome]]:
        """A link shard's step fold (several nodes' aggregates of one step, each node once, named
        by its `segments`) as one run: the future resolves to each part's outcome, in order. A
        slot per part, as its messages would take."""
        return await self._submit_run(InputRun((), step_fold=fold), len(fold.segments))

    async def _submit_run(self, run: InputRun, size: int) -> asyncio.Future[list[Outcome]]:
        if size > self._stream_capacity:
            raise ValueError(f"a run of {size} inputs exceeds the stream capacity {self._stream_capacity}")
        await self._stream_slots.take(size)  # (all at once; cancelled while waiting, it holds none)
        reply: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        self._put(_Pending(run, reply, self._clock(), slots=size))
        return reply

    @property
    def stream_capacity(self) -> int:
        """Stream inputs queued at most (a run may not be longer)."""
        return self._stream_capacity

    @property
    def directives_owed(self) -> int:
        """Nodes whose directive a sliced push has yet to send (0 unless one is under way)."""
        return len(self._owed)

    def queued(self) -> int:
        """Inputs waiting for the loop (a gauge, and what the flood test bounds)."""
        return self._queue.qsize()

    def open_stream(self, outbox: Outbox) -> int:
        stream_id = next(self._stream_ids)
        self._outboxes[stream_id] = outbox
        return stream_id

    def close_stream(self, stream_id: int, node_id: str | None, incarnation: int) -> None:
        outbox = self._outboxes.pop(stream_id, None)
        if node_id is not None:
            self.post(StreamClosed(node_id=node_id, incarnation=incarnation, stream_id=stream_id))
            self._tick_after(self.config.detector.reconnect_grace_s)
            probed_by_shard = outbox is not None and outbox.probed_by_shard  # (its report: agent_gone)
            if not probed_by_shard and self._probe_agent(node_id, incarnation, stream_id):
                self._tick_after(failure.AGENT_GONE_SETTLE_S)  # when a gone agent's node is declared dead

    def agent_gone(self, node_id: str, incarnation: int, stream_id: int, detail: str) -> None:
        """A node's agent was found gone after its stream closed: by this replica's probe, or by
        the link shard that held the stream (Forwarded.agent_gone)."""
        if self.is_leader:
            self.post(AgentGone(node_id, incarnation, stream_id, detail))
            self._tick_after(failure.AGENT_GONE_SETTLE_S)

    def _probe_agent(self, node_id: str, incarnation: int, stream_id: int) -> bool:
        """After a close: one connect to the node's peer port (supervisor/agent_probe.py); refused,
        the node's agent is gone and the detector need not wait out the grace (AgentGone). True
        when a probe may be under way."""
        node = self.state.nodes.get(node_id)
        if not self.is_leader or node is None or node.peer_port <= 0 or not self.config.detector.agent_probe:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test): the grace decides
            return False

        gone = functools.partial(self.agent_gone, node_id, incarnation, stream_id)  # (as a shard's report)
        return self.probes.after_close(node_id, (node.host, node.peer_port), self.config.detector.reconnect_grace_s,
                                       gone)

    def _peer_address_while_open(self, node_id: str) -> tuple[str, int] | None:
        node, soft = self.state.nodes.get(node_id), self.soft.nodes.get(node_id)
        if node is None or soft is None or soft.stream_id is None or node.peer_port <= 0:
            return None
        if not self.config.detector.agent_probe:
            return None
        outbox = self._outboxes.get(soft.stream_id)
        if outbox is not None and outbox.probed_by_shard:
            return None  # (its shard calibrates it)
        return node.host, node.peer_port

    def _tick_after(self, delay_s: float) -> None:
        """A closed stream's node is declared dead by the first Tick after its reconnect grace (or
        after AGENT_GONE_SETTLE_S when its agent is found gone); waiting for the periodic one added
        up to --tick-s (0.1 s) to every node-loss recovery. A Tick is scheduled just past it
        instead, one per GRACE_WAKE_S bucket, so a rack's streams closing together schedule a
        handful, not one per node."""
        due = self._clock() + delay_s
        bucket = math.ceil(due / GRACE_WAKE_S)
        if bucket in self._grace_wakes:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous test): the periodic tick decides
            return
        self._grace_wakes.add(bucket)

        def wake() -> None:
            self._grace_wakes.discard(bucket)
            if self.is_leader:
                self.post(Tick())

        loop.call_later(bucket * GRACE_WAKE_S - self._clock() + GRACE_WAKE_SLACK_S, wake)

    def wall_now(self) -> float:
        """Wall-clock seconds, as stamped on appended records (injectable for tests)."""
        return self._wall()

    def status(self) -> StatusView:
        return status_view(self.state, self.soft, self.config.job.name, self.config.job.world_size)

    def nodes(self) -> list[NodeView]:
        return node_views(self.state, self.soft, self._clock())

    def node_figures(self) -> NodeFigures:
        """Every node's figures the metrics export, as columns (cheaper than `nodes` per scrape)."""
        return node_figures(self.state, self.soft, self._clock())

    # -- replication roles -------------------------------------------------------------------
    def become_follower(self, leader_address: str = "") -> None:
        """Stops deciding; agents' streams are closed so they find the new leader."""
        self.is_leader = False
        self.leader_address = leader_address
        for outbox in self._outboxes.values():
            outbox.close()
        self._node_stream.clear()
        self._sent.clear()
        self._owed.clear()
        self._takes_retain.clear()
        log.info("following", leader=leader_address or "unknown", applied_seq=self.state.applied_seq,
                 generation=self.generation_in_force)

    def apply_followed(self, record: Record) -> None:
        """A follower folds the leader's records as they appear (its hot copy of the state)."""
        if not self.is_leader and record.seq == self.state.applied_seq + 1:
            self._fold([record])

    def become_leader(self, term: int, address: str = "") -> None:
        """Catch up to the head, then decide with fresh soft state: every node gets one full
        timeout of grace (soft state is rebuilt from what agents send, never replayed).

        A replicated leader's first decision is LeaderElected (see run()): it marks the term's
        first record, before anything queued while following is decided at this term."""
        self._fold(self.event_log.read(self.state.applied_seq + 1))
        self.term = term
        # Grace counts from a moment in the future: agents need the failover grace to find us.
        self.core.reset_soft(started_at_s=self._clock() + self.config.detector.failover_grace_s)
        self.degraded_reason = ""
        self.deposed = asyncio.Event()
        self.leader_address = ""
        self.is_leader = True
        self._announcement = LeadershipAcquired(term, address) if address else None
        self.post(Tick())  # wakes the loop, which announces first
        log.info("leading", term=term, applied_seq=self.state.applied_seq, generation=self.generation_in_force)

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        ticker = asyncio.create_task(self._tick_forever())
        between_slices = 0  # inputs handled before the next slice of an owed push
        try:
            while True:
                pending = self._next_pending()
                if pending is None and self._owed:
                    if between_slices <= 0:  # a slice, then what arrived during it, then the next
                        self._push_directives(self._owed.take(self.generation_in_force), owed=True)
                        await asyncio.sleep(0)  # the streams take the slice; inputs arrive meanwhile
                        between_slices = self._queue.qsize()
                    pending = self._take_nowait()
                    if pending is None:
                        between_slices = 0
                        continue
                    between_slices -= 1
                if pending is None:
                    pending = await self._take()
                if self._announcement is not None and self.is_leader:
                    await self._announce(self._announcement)
                if isinstance(pending.inp, InputRun):
                    _reply(pending, await self._handle_run(pending.inp, pending.at_s))
                    continue
                if isinstance(pending.inp, AgentHello):
                    batch = await self._gather_hellos(pending)
                    try:
                        outcomes = await self._handle_hellos(batch)
                    except Exception as exc:  # a bug must not take the control plane down
                        log.exception("hello batch handling failed", hellos=len(batch),
                                      generation=self.generation_in_force)
                        outcomes = [Outcome(refusal=f"internal error: {exc}", is_retryable=True)] * len(batch)
                    for each, outcome in zip(batch, outcomes):
                        _reply(each, outcome)
                    continue
                _reply(pending, await self._handle_guarded(pending.inp, pending.at_s))
        finally:
            ticker.cancel()
            self.probes.cancel()

    async def _handle_guarded(self, inp: Input, at_s: float | None) -> Outcome:
        try:
            return await self._handle(inp, at_s)
        except Exception as exc:  # a bug must not take the control plane down
            log.exception("input handling failed", input=type(inp).__name__,
                          node_id=getattr(inp, "node_id", None), generation=self.generation_in_force)
            return Outcome(refusal=f"internal error: {exc}", is_retryable=True)

    async def _handle_run(self, run: InputRun, at_s: float | None) -> list[Outcome]:
        """A run's inputs, each decided alone and in order, except that back-to-back step
        aggregates of one step from distinct nodes (a shard's nodes reporting a step) are decided
        as one fold (Core.step_aggregates: what they decide one by one, issue 14), and so are
        back-to-back SnapshotHoldings of one step from distinct nodes (Core.step_holdings). A
        heartbeat met among them is handled when met: it only marks its node heard as of the run's
        arrival, which every part of the run marks too, so its place among them changes nothing."""
        if run.holdings is not None:
            return await self._handle_holdings_fold(run.holdings, at_s)
        if run.step_fold is not None:
            return await self._handle_step_fold(run.step_fold, at_s)
        outcomes: list[Outcome | None] = [None] * len(run.inputs)
        fold: list[StepAggregate | SnapshotHoldings] = []  # the open fold's parts (all of one type)...
        at: list[int] = []  # ...and their positions in the run
        named: set[str] = set()  # ...and their nodes

        async def close_fold() -> None:
            if len(fold) == 1:
                outcomes[at[0]] = await self._handle_guarded(fold[0], at_s)
            elif fold:
                decided = (await self._handle_fold(cast(list[StepAggregate], fold), at_s)
                           if isinstance(fold[0], StepAggregate)
                           else await self._handle_holdings(cast(list[SnapshotHoldings], fold), at_s))
                for position, outcome in zip(at, decided):
                    outcomes[position] = outcome
            fold.clear()
            at.clear()
            named.clear()

        for position, inp in enumerate(run.inputs):
            if (isinstance(inp, StepAggregate) and not inp.segments) or isinstance(inp, SnapshotHoldings):
                if fold and (type(inp) is not type(fold[0])
                             or (inp.generation, inp.step) != (fold[0].generation, fold[0].step)
                             or inp.node_id in named):
                    await close_fold()
                fold.append(inp)
                at.append(position)
                named.add(inp.node_id)
            elif fold and isinstance(inp, Heartbeat):
                outcomes[position] = await self._handle_guarded(inp, at_s)
            else:
                await close_fold()
                outcomes[position] = await self._handle_guarded(inp, at_s)
        await close_fold()
        return [outcome if outcome is not None else Outcome() for outcome in outcomes]

    async def _handle_holdings_fold(self, fold: HoldingsFold, at_s: float | None) -> list[Outcome]:
        """A shard's holdings fold: the usual one decided whole on its columns
        (Core.step_holdings_fold), any other (a part refused, or one that may complete the step)
        part by part."""
        def admitted(metrics: SupervisorMetrics) -> None:
            metrics.on_admitted_count("SnapshotHoldings", len(fold))
        return await self._handle_whole(
            len(fold), at_s, "holdings", lambda now: self.core.step_holdings_fold(fold, now), admitted,
            lambda: self._handle_holdings(fold.parts(), at_s, tried_whole=True))

    async def _handle_step_fold(self, fold: StepAggregate, at_s: float | None) -> list[Outcome]:
        """A shard's step fold: the usual one decided whole on its arrays (Core.step_fold), any
        other (a part refused, a rank already reported in the step) as its parts."""
        count = len(fold.segments)

        def admitted(metrics: SupervisorMetrics) -> None:
            metrics.on_admitted_fold(fold, count)
            metrics.on_fold(count)
        return await self._handle_whole(count, at_s, "step", lambda now: self.core.step_fold(fold, now), admitted,
                                        lambda: self._handle_fold(fold.parts(), at_s, fold))

    async def _handle_whole(self, count: int, at_s: float | None, kind: str,
                            decide_whole: Callable[[float], BatchReady | None],
                            admitted: Callable[[SupervisorMetrics], None],
                            by_parts: Callable[[], Awaitable[list[Outcome]]]) -> list[Outcome]:
        """A shard's fold of `count` parts decided whole (`decide_whole`: every part admitted, one
        Ready, one outcome for all; the metrics count them with `admitted`) or, declined (None),
        part by part (`by_parts`), each part then refused or decided in its own words."""
        if not self.is_leader:
            return [self._not_leader()] * count
        now = self._clock() if at_s is None else at_s
        try:
            stepped = decide_whole(now)
            if stepped is not None:
                if self.metrics is not None:
                    admitted(self.metrics)
                return [await self._enact(stepped.ready, [])] * count
        except Exception as exc:  # a bug must not take the control plane down
            log.exception(f"{kind} fold handling failed", parts=count, generation=self.generation_in_force)
            return [Outcome(refusal=f"internal error: {exc}", is_retryable=True)] * count
        return await by_parts()

    async def _handle_holdings(self, parts: list[SnapshotHoldings], at_s: float | None, *,
                               tried_whole: bool = False) -> list[Outcome]:
        """Several nodes' holdings of one step decided as one (Core.step_holdings); the parts after
        the one that commits the step are handled alone after it. `tried_whole`: their fold was
        just declined whole (once a step per leader: the fold that may complete the step)."""
        return await self._handle_together(
            parts, at_s, lambda now: self.core.step_holdings(parts, now, tried_whole=tried_whole), "holdings")

    async def _handle_fold(self, parts: list[StepAggregate], at_s: float | None,
                           folded: StepAggregate | None = None) -> list[Outcome]:
        """Several nodes' aggregates of one step decided as one (Core.step_aggregates, which
        declines when a rank of them was already reported in the step); refused parts after the
        last admitted one are handled alone after it."""
        def stepped(now: float) -> BatchReady | None:
            return (self.core.step_aggregates(parts, now) if folded is None
                    else self.core.step_aggregates(parts, now, folded))
        return await self._handle_together(parts, at_s, stepped, "step", folded)

    async def _handle_together(self, parts: Sequence[Input], at_s: float | None,
                               step_together: Callable[[float], BatchReady | None], kind: str,
                               folded: StepAggregate | None = None) -> list[Outcome]:
        """Parts the core decides as one input (`step_together`): each part's refusal its own, one
        append for the rest; the parts past the Ready's (`len(refusals)`) are handled alone after
        it. Declined by the core (None), each part is handled alone. `folded`: the parts' fold
        (aggregates), whose figures the metrics keep once when every part is admitted."""
        if not self.is_leader:
            return [self._not_leader() for _ in parts]
        now = self._clock() if at_s is None else at_s
        try:
            stepped = step_together(now)
            if stepped is None:
                return [await self._handle_guarded(part, at_s) for part in parts]
            if self.metrics is not None and folded is not None and stepped.refusals == (None,) * len(parts):
                self.metrics.on_admitted_fold(folded, len(parts))
            elif self.metrics is not None and not any(stepped.refusals):
                self.metrics.on_admitted(parts[:len(stepped.refusals)])
            else:
                for part, refusal in zip(parts, stepped.refusals):
                    self._count(part, refusal)
            if self.metrics is not None and kind == "step":
                self.metrics.on_fold(len(stepped.refusals))
            enacted = await self._enact(stepped.ready, [])
        except Exception as exc:  # a bug must not take the control plane down
            log.exception(f"{kind} fold handling failed", parts=len(parts), generation=self.generation_in_force)
            return [Outcome(refusal=f"internal error: {exc}", is_retryable=True)] * len(parts)
        outcomes = [enacted if refusal is None else _refused(refusal) for refusal in stepped.refusals]
        return outcomes + [await self._handle_guarded(part, at_s) for part in parts[len(stepped.refusals):]]

    async def _take(self) -> _Pending:
        _, _, pending = await self._queue.get()
        self._free_slots(pending)
        return pending

    def _take_nowait(self) -> _Pending | None:
        if self._queue.empty():
            return None
        _, _, pending = self._queue.get_nowait()
        self._free_slots(pending)
        return pending

    def _free_slots(self, pending: _Pending) -> None:
        if pending.slots:
            self._stream_slots.give(pending.slots)

    def _next_pending(self) -> _Pending | None:
        """The input a Hello batch stopped at, handled next; else None (take from the queue)."""
        pending, self._held = self._held, None
        return pending

    async def _gather_hellos(self, first: _Pending) -> list[_Pending]:
        """`first` and the Hellos of other nodes queued right behind it, up to `hello_batch`.
        Heartbeats of nodes outside the batch met on the way are handled at once (they change
        soft state only, and no Hello of the batch is about their node); anything else ends the
        batch and is handled right after it, so no input is decided out of its order."""
        assert isinstance(first.inp, AgentHello), first.inp  # only a Hello starts a batch
        batch, named = [first], {first.inp.node_id}
        while len(batch) < self._hello_batch and not self._queue.empty():
            _, _, pending = self._queue.get_nowait()
            self._free_slots(pending)
            inp = pending.inp
            if isinstance(inp, AgentHello) and inp.node_id not in named:
                batch.append(pending)
                named.add(inp.node_id)
            elif isinstance(inp, HeardFrom) or (isinstance(inp, Heartbeat) and inp.node_id not in named):
                # (a summary naming a Hello's node is harmless: being heard before the Hello is
                # observed refreshes the old soft state the Hello then replaces)
                try:
                    outcome = await self._handle(inp, pending.at_s)
                except Exception as exc:  # as in run()
                    log.exception("input handling failed", input=type(inp).__name__,
                                  node_id=getattr(inp, "node_id", None))
                    outcome = Outcome(refusal=f"internal error: {exc}", is_retryable=True)
                _reply(pending, outcome)
            else:
                self._held = pending
                break
        return batch

    async def _announce(self, announcement: LeadershipAcquired) -> None:
        """Appends LeaderElected; kept for the next input while the log refuses it (degraded)."""
        try:
            outcome = await self._handle(announcement)
        except Exception:  # a bug must not take the control plane down
            log.exception("leadership announcement failed")
            return
        if not outcome.refusal:
            self._announcement = None

    async def _tick_forever(self) -> None:
        # A tick that comes much later than asked means this process did not run meanwhile; the
        # core is told, so that our stall is not judged as every node's silence.
        threshold_s = max(0.25, self.config.detector.heartbeat_interval_s / 2)
        while True:
            asked_at = self._clock()
            await asyncio.sleep(self._tick_s)
            late_s = self._clock() - asked_at - self._tick_s
            if self.metrics is not None:
                self.metrics.loop_late_seconds.observe(max(0.0, late_s))  # (a follower's too: its shard's loop)
            if not self.is_leader and late_s > threshold_s:
                # (a follower's loop is its link shard's: its agents' streams were not read meanwhile,
                # and the leader hears of its nodes that much later)
                log.warning("follower stalled; its link shard read no agent meanwhile", stalled_s=round(late_s, 3))
            if self.is_leader:
                if late_s > threshold_s:
                    log.warning("supervisor stalled; not counting it as node silence", stalled_s=round(late_s, 3))
                # A push's slices keep this ticker on time, yet the agents' streams were read only
                # between them: their time is forgiven as the one long turn's lateness was.
                pushing_s = self._owed.take_busy_s()
                self.post(Tick(stalled_s=max(late_s if late_s > threshold_s else 0.0, pushing_s)))
                self._refusal_log.roll(self._clock(), self.generation_in_force)
                self.probes.calibrate(self._peer_address_while_open)

    async def _handle(self, inp: Input, arrived_s: float | None = None) -> Outcome:
        if not self.is_leader:
            return self._not_leader()
        now = self._clock() if arrived_s is None else arrived_s
        ready = self.core.step(inp, now)
        self._count(inp, ready.refusal)
        if ready.refusal is not None:
            return _refused(ready.refusal)
        if isinstance(inp, (Heartbeat, HeardFrom)):
            return Outcome()  # the hot path: soft state only, nothing to persist or push
        return await self._enact(ready, [inp] if isinstance(inp, AgentHello) else [])

    async def _handle_hellos(self, batch: list[_Pending]) -> list[Outcome]:
        """A batch of Hellos (distinct nodes, queued back to back): each admitted and observed as
        alone, then decided together and appended at once, so a fleet connecting costs one fsync'd
        append per batch instead of one per node."""
        if not self.is_leader:
            return [self._not_leader() for _ in batch]
        hellos: list[tuple[AgentHello, float]] = []
        for pending in batch:
            assert isinstance(pending.inp, AgentHello)
            hellos.append((pending.inp, self._clock() if pending.at_s is None else pending.at_s))
        stepped = self.core.step_hellos(hellos)
        for (hello, _), refusal in zip(hellos, stepped.refusals):
            self._count(hello, refusal)
        admitted = [hellos[i][0] for i in stepped.admitted]
        enacted = await self._enact(stepped.ready, admitted) if admitted else Outcome()
        return [enacted if refusal is None else _refused(refusal) for refusal in stepped.refusals]

    def _not_leader(self) -> Outcome:
        return Outcome(refusal=f"not the leader; the leader is {self.leader_address or 'being elected'}",
                       is_retryable=True)

    def _count(self, inp: Input, refusal: Refusal | None) -> None:
        """Logs a refused input and counts every input (refused or not) in the metrics."""
        if refusal is not None:
            self._refusal_log.refused(type(inp).__name__, refusal.reason, self._clock(),
                                      node_id=getattr(inp, "node_id", None), generation=self.generation_in_force)
        if self.metrics is not None:
            self.metrics.on_input(inp, refusal.reason if refusal is not None else None)

    async def _enact(self, ready: Ready, hellos: list[AgentHello]) -> Outcome:
        """Appends a step's events, folds them, welcomes the Hellos and pushes directives."""
        records: list[Record] = []
        if ready.events:
            try:
                append_started = self._clock()
                records = await self.event_log.append(
                    ready.events, term=self.term, time_unix_s=self._wall(), expect_seq=self.state.applied_seq
                )
                if self.metrics is not None:
                    self.metrics.on_append(self._clock() - append_started)
            except Deposed as exc:
                log.warning("deposed: another replica leads now; stepping down", error=str(exc))
                self.deposed.set()
                return Outcome(refusal=f"not decided: {exc}", is_retryable=True)
            except Fenced as exc:
                # Our state is behind the log (an earlier append whose outcome we did not learn
                # did commit): catch up and decide again on a later input.
                await self._catch_up()
                return Outcome(refusal=f"not decided: {exc}", is_retryable=True)
            except LogError as exc:
                # Without a durable record nothing may change: the decision is dropped and made
                # again from the same state on a later input, once the log is writable.
                if not self.degraded_reason:
                    log.error("event log unavailable: not deciding until it recovers", error=str(exc))
                self.degraded_reason = f"event log unavailable: {exc}"
                return Outcome(refusal=f"not decided: {self.degraded_reason}", is_retryable=True)
            if self.degraded_reason:
                log.info("event log writable again: deciding", was=self.degraded_reason)
                self.degraded_reason = ""
        was_waiting = self.core.waiting_reason
        self.core.advance(ready, records, clock_offset_s=self._clock() - self._wall(), on_record=self._applied)
        self._event_lines.flush()
        if records:
            if self.checkpointer is not None:
                self.checkpointer.after(self.state, records)  # commit / abort / gc, off the loop
            await self._maybe_snapshot()
        if ready.waiting_reason != was_waiting and ready.waiting_reason:
            log.info("waiting", reason=ready.waiting_reason)
        for hello in hellos:
            self._attach(hello)
            # After the fold: a calibration that ran while the append was awaited found no
            # record of the node and dropped it for good (1 node of 15 in a bench run).
            self.probes.admitted(hello.node_id)
        if ready.events or hellos:
            retained = ready.retained if ready.affected is not None else None
            if retained is not None:
                self._say_retained(retained, ready.affected or ())
            else:
                self._push_directives(ready.affected)
        return Outcome(records=tuple(records))

    async def _catch_up(self) -> None:
        sync = getattr(self.event_log, "sync", None)
        if sync is not None:
            await sync()
        self._fold(self.event_log.read(self.state.applied_seq + 1))

    async def _maybe_snapshot(self) -> None:
        if self.state.applied_seq - self._snapshot_seq < self._snapshot_every:
            return
        try:
            await self.event_log.save_snapshot(self.state)
            removed = await self.event_log.compact()
        except LogError as exc:
            log.warning("snapshot failed; replay stays longer until the next one", error=str(exc))
            return
        self._snapshot_seq = self.state.applied_seq
        log.info("state snapshot written", seq=self._snapshot_seq, records_compacted=removed)

    def checkpoint_advice(self) -> interval_policy.IntervalAdvice:
        """The Young/Daly interval now, from the costs and failures the log shows (and why)."""
        return self.core.checkpoint_advice(self._clock())

    def _fold(self, records: Iterable[Record]) -> None:
        """Folds stored records (replay, a follower's copy, a catch-up): their wall times are moved
        onto the monotonic clock the core decides with."""
        self.core.fold(list(records), clock_offset_s=self._clock() - self._wall())

    def _applied(self, record: Record) -> None:
        """Called as each appended record is folded in: metrics and the event's log line."""
        if self.metrics is not None:
            self.metrics.on_record(record)
        # An event naming its generation keeps it (its fields win); any other gets the one in force.
        self._event_lines.add(record, self.generation_in_force)

    def _attach(self, hello: AgentHello) -> None:
        self._node_stream[hello.node_id] = hello.stream_id
        self._sent.pop(hello.node_id, None)
        if hello.takes_snapshot_retain:
            self._takes_retain.add(hello.node_id)
        else:
            self._takes_retain.discard(hello.node_id)
        welcome = agent_pb2.Welcome(
            node_id=hello.node_id,
            incarnation=hello.incarnation,
            heartbeat_interval_s=self.config.detector.heartbeat_interval_s,
            term=self.term,
            takes_step_aggregates=True,
            takes_snapshot_holdings=True,
        )
        self._send(hello.node_id, agent_pb2.SupervisorMessage(welcome=welcome))

    def _push_directives(self, node_ids: Iterable[str] | None = None, *, owed: bool = False) -> None:
        """Each node's directive from the state now, unless its agent holds it; past a slice of
        nodes, the rest a slice per turn of the loop (PUSH_SLICE: a generation's start). `owed`:
        this is such a slice. The time of a push that is or leaves slices is forgiven as a stall."""
        started_s = self._clock()
        targets = self._owed.split([n for n in (self.state.nodes if node_ids is None else dict.fromkeys(node_ids))
                                    if n in self._node_stream and n in self.state.nodes], self.generation_in_force)
        computed = directives_for(self.state, self.config.job, targets, self.core.waiting_reason)
        encoder = codec.DirectiveEncoder()
        for node_id, directive in zip(targets, computed):
            if self._has(node_id, directive):
                continue
            if self._send(node_id, agent_pb2.SupervisorMessage(directive=encoder.encode(directive))):
                self._sent[node_id] = directive
        if owed or self._owed:
            self._owed.note_busy(self._clock() - started_s)

    def _has(self, node_id: str, directive: Directive) -> bool:
        """The node's agent holds `directive` already: it was sent, or it was sent with an older
        retain floor that a SnapshotRetain has moved since."""
        sent = self._sent.get(node_id)
        if sent is None or sent == directive:
            return sent is not None
        said = self._retain_said
        return (node_id in self._takes_retain and sent.generation == said.generation == directive.generation
                and directive.retain_from_step == said.step and sent.action is directive.action  # (cheap first)
                and dataclasses.replace(sent, retain_from_step=said.step) == directive)

    def _say_retained(self, committed: SnapshotCommitted, named: Iterable[str]) -> None:
        """A commit moved every directive's retain floor and nothing else (but `named` nodes'): a
        SnapshotRetain to each agent that takes one and holds a directive of the commit's
        generation, a whole directive to the rest (an older agent, a node not directed yet). At
        12,500 nodes with a snapshot every step, the whole push was ~0.8 s of the leader's CPU a
        step (issue 14)."""
        self._retain_said = committed
        notice = agent_pb2.SupervisorMessage(snapshot_retain=agent_pb2.SnapshotRetain(
            generation=committed.generation, retain_from_step=committed.step))
        rest = list(named)
        told: list[str] = []
        for node_id in list(self._node_stream):
            sent = self._sent.get(node_id)
            if node_id in self._takes_retain and sent is not None and sent.generation == committed.generation:
                told.append(node_id)
            else:
                rest.append(node_id)
        self._send_each(told, notice)
        self._push_directives(rest)

    def _send_each(self, node_ids: Iterable[str], message: agent_pb2.SupervisorMessage) -> None:
        """`message` to each node: once per link shard for the nodes it relays (if it takes shared
        messages; it delivers the one item to each), else one put per stream."""
        shared: dict[int, tuple[SharedSender, list[int]]] = {}
        for node_id in node_ids:
            stream_id = self._node_stream.get(node_id)
            outbox = self._outboxes.get(stream_id) if stream_id is not None else None
            route = outbox.shared_route() if outbox is not None else None
            if route is None:
                self._send(node_id, message)
                continue
            sender, session = route
            gathered = shared.get(id(sender))
            if gathered is None:
                shared[id(sender)] = (sender, [session])
            else:
                gathered[1].append(session)
        for sender, sessions in shared.values():
            sender.put_shared(sessions, message)  # (refused: the relay is ending; its nodes' Hellos resend)

    def _send(self, node_id: str, message: agent_pb2.SupervisorMessage) -> bool:
        stream_id = self._node_stream.get(node_id)
        outbox = self._outboxes.get(stream_id) if stream_id is not None else None
        if outbox is None:
            self._node_stream.pop(node_id, None)
            return False
        if not outbox.put(message):  # full: the stream is being closed; its next Hello resends
            log.warning("agent stream closed: outbound queue full", node_id=node_id, capacity=outbox.capacity,
                        generation=self.generation_in_force)
            return False
        return True


def _refused(refusal: Refusal) -> Outcome:
    return Outcome(refusal=refusal.reason, is_retryable=refusal.is_retryable)


def _reply(pending: _Pending, outcome: Outcome | list[Outcome]) -> None:
    if pending.reply is not None and not pending.reply.done():
        pending.reply.set_result(outcome)
