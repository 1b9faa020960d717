"""The leader's side of link shards: LinkShard.Relay, one stream per follower replica.

A shard forwards its agents' messages in batches; each is admitted here exactly as the agent
service admits an agent's own (supervisor/server/agent_service.py: the same translation, the same
runtime queue, the same refusals sent back to that agent), so the leader's core cannot tell a
relayed node from a directly connected one. Each shard session gets a runtime stream whose outbox
(`RelayRoute`) wraps what the runtime sends the node into the relay's outgoing batches.

Authorization: under mTLS only a supervisor replica's certificate may open a relay (a node or an
operator certificate is refused PERMISSION_DENIED): a shard speaks for many nodes, which only a
replica may. Without TLS (loopback lab mode) the relay is as open as agents' streams are.
When the relay ends (the shard died), its nodes' routes are dropped without a stream-closed
signal: they are not dead, they re-home to another shard within the reconnect grace, and if they
do not, their silence is judged by the detector as any node's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import grpc

from ftsup.common import logs
from ftsup.common.deadline import within
from ftsup.common.tls import PeerKind, peer_identity
from ftsup.supervisor.core import inputs
from ftsup.supervisor.core.policies import failure
from ftsup.supervisor.outbox import SharedSender, StreamOutbox
from ftsup.supervisor.runtime import Outcome, Runtime
from ftsup.supervisor.server import holdings_fold, snapshot_holdings, step_aggregate, step_fold
from ftsup.supervisor.server.agent_service import _ROLES, PERMANENT, RETRYABLE, _refusal, to_input
from ftsup.supervisor.server.hello_checks import hello_problem
from ftsup.v1 import agent_pb2, shard_pb2, shard_pb2_grpc

log = logs.get("supervisor.relay")

# Messages for one shard's nodes waiting to be sent at most (directives for a 4,000-node shard at
# a generation start, with room); beyond it the relay is ended and the shard reconnects.
DOWN_CAPACITY = 50_000
MAX_DOWN_ITEMS = 4_096  # items per LeaderBatch
LEADERSHIP_CHECK_S = 0.25  # a relay ends this soon after its leader stepped down


class RelayDown:
    """The relay's outgoing queue: Addressed items, bounded; `overflowed` ends the relay."""

    def __init__(self, capacity: int = DOWN_CAPACITY, *, takes_shared: bool = False) -> None:
        self.capacity = capacity
        self._items: collections.deque[shard_pb2.Addressed] = collections.deque()
        self.ready = asyncio.Event()
        self.overflowed = False
        self.takes_shared = takes_shared  # the shard delivers one item to many sessions (ShardBatch.takes_shared)

    def push(self, item: shard_pb2.Addressed) -> bool:
        if self.overflowed or len(self._items) >= self.capacity:
            self.overflowed = True
            self.ready.set()
            return False
        self._items.append(item)
        self.ready.set()
        return True

    def put_shared(self, sessions: list[int], message: agent_pb2.SupervisorMessage) -> bool:
        """`message` for each of `sessions`, as one item (a commit's SnapshotRetain for a shard's
        2,000-4,000 nodes was as many items, each a copy of the message, issue 14, part 15)."""
        return self.push(shard_pb2.Addressed(sessions=sessions, message=message))

    def take(self, max_items: int = MAX_DOWN_ITEMS) -> list[shard_pb2.Addressed]:
        taken = [self._items.popleft() for _ in range(min(max_items, len(self._items)))]
        if not self._items:
            self.ready.clear()
        return taken

    def __len__(self) -> int:
        return len(self._items)


class RelayRoute(StreamOutbox):
    """One relayed node's outbox as the runtime sees it: what is put goes into the relay."""

    def __init__(self, down: RelayDown, session: int, *, probed_by_shard: bool = False) -> None:
        super().__init__(capacity=1)
        self._down = down
        self.session = session
        self.probed_by_shard = probed_by_shard

    def put(self, message: agent_pb2.SupervisorMessage) -> bool:
        if self.is_closed:
            return False
        return self._down.push(shard_pb2.Addressed(session=self.session, message=message))

    def close(self, reason: str = "") -> None:
        if not self.is_closed:
            self._down.push(shard_pb2.Addressed(session=self.session, close=True))
        super().close(reason)

    def shared_route(self) -> tuple[SharedSender, int] | None:
        return (self._down, self.session) if self._down.takes_shared and not self.is_closed else None


@dataclass(slots=True)
class _Relayed:
    stream_id: int
    node_id: str
    incarnation: int
    route: RelayRoute


class RelayService(shard_pb2_grpc.LinkShardServicer):
    def __init__(self, runtime: Runtime, *, is_tls: bool = False) -> None:
        self._runtime = runtime
        self._is_tls = is_tls
        self.relays: dict[str, int] = {}  # shard replica -> nodes it relays now (for views and tests)
        self._sessions: dict[str, dict[int, _Relayed]] = {}  # shard replica -> its relay's sessions
        # replica -> its relay's sessions, for relays whose shard keeps alive (ShardBatch.keeps_alive)
        self._keeping_alive: dict[str, dict[int, _Relayed]] = {}
        # replica -> its relay's sessions closed lately (not moves), for relays whose shard probes
        # its agents (ShardBatch.probes_agents): what a later agent_gone report names
        self._closed: dict[str, collections.OrderedDict[int, _Relayed]] = {}

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        if self._is_tls:
            identity = peer_identity(context)
            if identity is None or identity.kind is not PeerKind.SUPERVISOR:
                log.warning("relay refused: not a supervisor replica's certificate",
                            identity=str(identity) if identity else None, peer=context.peer())
                await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                    f"certificate identity {identity or 'none'} may not relay agents: only a"
                                    " supervisor replica (spiffe://ftsup/supervisor/...) holds a link shard")
        runtime = self._runtime
        if not runtime.is_leader:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"not the leader; the leader is {runtime.leader_address or 'being elected'}")

    async def Relay(self, request_iterator: AsyncIterator[shard_pb2.ShardBatch],
                    context: grpc.aio.ServicerContext) -> AsyncIterator[shard_pb2.LeaderBatch]:
        await self._authorize(context)
        runtime = self._runtime
        term = runtime.term
        first = await anext(aiter(request_iterator), None)
        replica = first.replica if first is not None and first.replica else context.peer()
        down = RelayDown(takes_shared=first is not None and first.takes_shared)
        sessions: dict[int, _Relayed] = {}
        self._sessions[replica] = sessions
        if first is not None and first.keeps_alive:
            self._keeping_alive[replica] = sessions
        closed: collections.OrderedDict[int, _Relayed] = collections.OrderedDict()
        if first is not None and first.probes_agents and runtime.config.detector.agent_probe:
            self._closed[replica] = closed
        log.info("link shard relaying", replica=replica, term=term)
        reader = asyncio.create_task(self._read(request_iterator, down, sessions, replica,
                                                first.items if first is not None else ()))
        try:
            yield shard_pb2.LeaderBatch(term=term, takes_liveness_summaries=True, takes_snapshot_holdings=True,
                                        takes_step_folds=True, takes_holdings_folds=True,
                                        takes_agent_gone=runtime.config.detector.agent_probe)
            while runtime.is_leader and runtime.term == term and not down.overflowed:
                if not len(down):
                    with contextlib.suppress(TimeoutError):
                        await within(down.ready.wait(), LEADERSHIP_CHECK_S)
                    if reader.done():
                        break
                    continue
                yield shard_pb2.LeaderBatch(items=down.take(), term=term)
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            for relayed in sessions.values():
                runtime.close_stream(relayed.stream_id, None, 0)  # a route gone, no death signal
            self.relays.pop(replica, None)
            if self._sessions.get(replica) is sessions:
                del self._sessions[replica]
            if self._keeping_alive.get(replica) is sessions:
                del self._keeping_alive[replica]
            if self._closed.get(replica) is closed:
                del self._closed[replica]
            log.warning("link shard relay ended", replica=replica, nodes=len(sessions), term=term,
                        overflowed=down.overflowed)

    async def Liveness(self, request_iterator: AsyncIterator[shard_pb2.ShardLiveness],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[shard_pb2.LivenessAdmitted]:
        """A shard's liveness summaries: each admitted as one HeardFrom of the nodes its sessions
        name (those of the shard's current relay; others are skipped), answered once admitted.
        Not held back by the relay's back-pressure: a summary is one input per shard every
        SUMMARY_INTERVAL_S at most, queued without waiting for a stream slot, and stamped with its
        arrival, so a backlog of reports delays when it is observed, never what it says."""
        await self._authorize(context)
        runtime = self._runtime
        term = runtime.term
        admitted: asyncio.Queue[int] = asyncio.Queue()

        async def read() -> None:
            replica = ""
            heard_at = None
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                async for summary in request_iterator:
                    replica = summary.replica or replica
                    shard = replica if replica in self._keeping_alive else ""
                    sessions = self._sessions.get(replica, {})
                    node_ids = tuple(relayed.node_id for session in summary.heard
                                     if (relayed := sessions.get(session)) is not None)
                    number = summary.summary
                    if shard:
                        now = time.monotonic()
                        if heard_at is not None and now - heard_at > failure.QUIET_SHARD_AFTER_S:
                            # (its nodes' silence meanwhile is not counted as theirs: core/policies/failure.py)
                            log.warning("no liveness summary from the link shard for a while",
                                        replica=replica, quiet_s=round(now - heard_at, 3))
                        heard_at = now
                    elif not node_ids:
                        if number:
                            admitted.put_nowait(number)
                        continue
                    reply = runtime.submit(inputs.HeardFrom(node_ids, shard))
                    if number:
                        reply.add_done_callback(_on_success(functools.partial(admitted.put_nowait, number)))
            admitted.put_nowait(0)  # (the end)

        reader = asyncio.create_task(read())
        try:
            while runtime.is_leader and runtime.term == term:
                with contextlib.suppress(TimeoutError):
                    number = await within(admitted.get(), LEADERSHIP_CHECK_S)
                    if not number:
                        break
                    while not admitted.empty():  # (the newest covers the older)
                        newer = admitted.get_nowait()
                        if not newer:
                            return
                        number = max(number, newer)
                    yield shard_pb2.LivenessAdmitted(summary=number)
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _read(self, requests: AsyncIterator[shard_pb2.ShardBatch], down: RelayDown,
                    sessions: dict[int, _Relayed], replica: str, first: Iterable[shard_pb2.Forwarded] = ()) -> None:
        try:
            for item in first:  # (a shard sends its name alone first; anything with it is handled too)
                await self._on_item(item, down, sessions, replica)
            async for batch in requests:
                # Nodes' messages go to the loop in runs (one queue item and one reply per run,
                # runtime.InputRun); a Hello, a closed stream or a packed step fold is handled in
                # its place, after the run before it, so every session's messages keep their order.
                run: list[_Message] = []
                for item in batch.items:
                    if not _is_plain_message(item):
                        await self._submit(run)
                        run = []
                        await self._on_item(item, down, sessions, replica)
                        continue
                    message = self._to_message(item, sessions)
                    if message is not None:
                        run.append(message)
                        if len(run) >= RUN_MAX:
                            await self._submit(run)
                            run = []
                await self._submit(run)
                self.relays[replica] = len(sessions)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass

    def _to_message(self, item: shard_pb2.Forwarded, sessions: dict[int, _Relayed]) -> _Message | None:
        """A node's message (not its Hello) as the input it stands for; None when there is nothing
        to submit: a session whose Hello was refused or that ended, or a message refused here
        (malformed, unexpected), the refusal sent on its route."""
        relayed = sessions.get(item.session)
        if relayed is None:
            return None  # a session whose Hello was refused, or one already ended: nothing to admit
        message, route = item.message, relayed.route
        try:
            inp = to_input(relayed.node_id, relayed.incarnation, message)
        except step_aggregate.MalformedAggregate as exc:
            route.put(_refusal(f"malformed step aggregate: {exc}", "step_aggregate"))
            return None
        except snapshot_holdings.MalformedHoldings as exc:
            route.put(_refusal(f"malformed snapshot holdings: {exc}", "snapshot_holdings"))
            return None
        if inp is None:
            sent = message.WhichOneof("kind") or "empty"
            route.put(_refusal(f"unexpected {sent} message after Hello", sent))
            return None
        return _Message(inp, route, message)

    async def _submit_fold(self, fold: shard_pb2.ShardStepFold, sessions: dict[int, _Relayed]) -> None:
        """A shard's packed step fold (several sessions' aggregates of one step), decoded once into
        its arrays (step_fold.to_fold) and handed to the loop whole, each part answered on its own
        node's route (Runtime.submit_step_fold). Parts of sessions that ended (or whose Hello was
        refused) are dropped as their messages would be; then, or when a node has two parts, the
        rest go as runs the loop folds as it would the per-node messages."""
        relayed = [sessions.get(session) for session in fold.sessions]
        try:
            folded = step_fold.to_fold(_node_ids(relayed), fold)
        except step_aggregate.MalformedAggregate as exc:
            _refuse_fold(relayed, "step", "step aggregate", "step_aggregate", exc)
            return
        routes = [each.route for each in relayed if each is not None]
        if (len(routes) == len(folded.segments) > 1 and len(set(folded.node_ids())) == len(routes)
                and len(routes) <= min(MAX_FOLD_PARTS, self._runtime.stream_capacity)):
            replies = await self._runtime.submit_step_fold(folded)
            replies.add_done_callback(functools.partial(_answer_parts, routes, "StepAggregate"))
            return
        run = [_Message(part, each.route, _PACKED) for part, each in zip(folded.parts(), relayed) if each is not None]
        for start in range(0, len(run), RUN_MAX):
            await self._submit(run[start:start + RUN_MAX])

    async def _submit_holdings_fold(self, fold: shard_pb2.ShardHoldingsFold, sessions: dict[int, _Relayed]) -> None:
        """A shard's packed holdings fold (several sessions' SnapshotHoldings of one step), decoded
        once into its columns (holdings_fold.to_input) and handed to the loop whole, each part
        answered on its own node's route (Runtime.submit_holdings_fold). Parts of sessions that
        ended (or whose Hello was refused) are dropped as their messages would be; then, or when a
        node has two parts, the rest go as runs the loop folds as it would the per-node messages."""
        relayed = [sessions.get(session) for session in fold.sessions]
        try:
            columns = holdings_fold.to_input(_node_ids(relayed), fold)
        except snapshot_holdings.MalformedHoldings as exc:
            _refuse_fold(relayed, "holdings", "snapshot holdings", "snapshot_holdings", exc)
            return
        routes = [each.route for each in relayed if each is not None]
        if (len(routes) == len(columns) > 1 and len(set(columns.node_ids)) == len(columns)
                and len(columns) <= min(MAX_FOLD_PARTS, self._runtime.stream_capacity)):
            replies = await self._runtime.submit_holdings_fold(columns)
            replies.add_done_callback(functools.partial(_answer_parts, routes, "SnapshotHoldings"))
            return
        run = [_Message(part, each.route, _PACKED) for part, each in zip(columns.parts(), relayed) if each is not None]
        for start in range(0, len(run), RUN_MAX):
            await self._submit(run[start:start + RUN_MAX])

    async def _submit(self, run: list[_Message]) -> None:
        """Hands `run` to the loop (one input alone as before) and answers each message once
        decided: a heartbeat's ack if asked for, a refusal on its node's route."""
        if not run:
            return
        if len(run) == 1:
            only = run[0]
            reply = await self._runtime.submit_from_stream(only.inp)
            reply.add_done_callback(functools.partial(_answer_one, only))
            return
        replies = await self._runtime.submit_run_from_stream([message.inp for message in run])
        replies.add_done_callback(functools.partial(_answer_run, run))

    async def _on_item(self, item: shard_pb2.Forwarded, down: RelayDown, sessions: dict[int, _Relayed],
                       replica: str = "") -> None:
        runtime = self._runtime
        kind = item.WhichOneof("kind")
        if kind == "closed":
            relayed = sessions.pop(item.session, None)
            if relayed is not None:
                # A move is no death signal (the node reconnects to its new shard at once).
                node = None if item.closed.moved else relayed.node_id
                runtime.close_stream(relayed.stream_id, node, relayed.incarnation)
                closed = self._closed.get(replica)
                if node is not None and closed is not None and relayed.route.probed_by_shard:
                    closed[item.session] = relayed
                    if len(closed) > CLOSED_KEPT:
                        closed.popitem(last=False)
            return
        if kind == "agent_gone":
            closed = self._closed.get(replica)
            gone = closed.pop(item.session, None) if closed is not None else None
            if gone is not None:
                runtime.agent_gone(gone.node_id, gone.incarnation, gone.stream_id, item.agent_gone.detail)
            return
        if kind == "step_fold":
            await self._submit_fold(item.step_fold, sessions)
            return
        if kind == "holdings_fold":
            await self._submit_holdings_fold(item.holdings_fold, sessions)
            return
        if kind != "message":
            return
        if item.message.WhichOneof("kind") == "hello":
            self._on_hello(item, down, sessions, replica)
            return
        message = self._to_message(item, sessions)
        if message is not None:
            await self._submit([message])

    def _on_hello(self, item: shard_pb2.Forwarded, down: RelayDown, sessions: dict[int, _Relayed],
                  replica: str = "") -> None:
        runtime = self._runtime
        hello = item.message.hello
        route = RelayRoute(down, item.session, probed_by_shard=replica in self._closed)
        if hello.node_id != item.node_id or hello.incarnation != item.incarnation:
            route.put(_refusal("the shard's session does not match its Hello", "hello", ends_stream=True))
            route.close()
            return
        problem = hello_problem(hello)  # (the shard checked it too; a replica's bug must not reach the core)
        if problem is not None:
            route.put(_refusal(problem, "hello", ends_stream=True))
            route.close()
            return
        role = _ROLES.get(hello.role)
        if role is None:
            route.put(_refusal(f"Hello has no valid role ({hello.role}); use active or spare", "hello",
                               ends_stream=True))
            route.close()
            return
        stream_id = runtime.open_stream(route)
        old = sessions.pop(item.session, None)
        if old is not None:  # a session id reused would be a shard bug; keep the newest
            runtime.close_stream(old.stream_id, None, 0)
        relayed = _Relayed(stream_id, hello.node_id, hello.incarnation, route)
        sessions[item.session] = relayed
        reply = runtime.submit(inputs.AgentHello(hello.node_id, hello.incarnation, role, hello.host, hello.peer_port,
                                                 hello.gpus, stream_id, hello.failure_domain,
                                                 replica if replica in self._keeping_alive else "",
                                                 takes_snapshot_retain=hello.takes_snapshot_retain))

        def answered(future: asyncio.Future[Outcome]) -> None:
            outcome = future.result() if not future.cancelled() else Outcome(refusal="cancelled", is_retryable=True)
            if outcome.refusal is None:
                return
            if sessions.get(item.session) is relayed:
                del sessions[item.session]
            runtime.close_stream(stream_id, None, 0)
            route.put(_refusal(outcome.refusal, "hello", RETRYABLE if outcome.is_retryable else PERMANENT,
                               ends_stream=True))
            route.close()

        reply.add_done_callback(answered)


# Closed sessions a relay remembers for its shard's agent_gone reports (which follow a close by
# a connect's round trip, or up to agent_probe.VERDICT_WINDOW_S): the oldest are forgotten first,
# and a report about a forgotten one decides nothing (the reconnect grace does).
CLOSED_KEPT = 8_192
# Messages of one relay batch handed to the loop as one run at most (a slot of the loop's
# stream-input capacity each; see runtime.InputRun).
RUN_MAX = 512
# Parts of a shard's packed step fold handed to the loop as one run at most (a shard packs at most
# a batch's items: shard_queue.MAX_BATCH_ITEMS); a larger one goes in runs of RUN_MAX.
MAX_FOLD_PARTS = 4_096
def _node_ids(relayed: list[_Relayed | None]) -> list[str]:
    """A fold's parts' nodes ("" for a session the relay does not hold: its part is dropped)."""
    return [r.node_id if r is not None else "" for r in relayed]


def _refuse_fold(relayed: list[_Relayed | None], fold: str, what: str, refused: str, exc: Exception) -> None:
    """A shard's fold that does not decode (a shard's bug: it packs only well-formed parts): each
    part's node hears that its message was malformed, as it would alone."""
    log.warning(f"malformed {fold} fold from a link shard", error=str(exc), parts=len(relayed))
    for each in relayed:
        if each is not None:
            each.route.put(_refusal(f"malformed {what} (in its shard's fold): {exc}", refused))


_PACKED = agent_pb2.AgentMessage()  # (a packed part's message: only a heartbeat's is ever read)


@dataclass(slots=True)
class _Message:
    """A relayed node's message, the input it stands for and where its answers go."""

    inp: inputs.Input
    route: RelayRoute
    message: agent_pb2.AgentMessage


def _is_plain_message(item: shard_pb2.Forwarded) -> bool:
    """A node's message other than its Hello (what goes to the loop in runs)."""
    return item.WhichOneof("kind") == "message" and item.message.WhichOneof("kind") != "hello"


def _answer(message: _Message, outcome: Outcome | None) -> None:
    """What a decided message gets back: a heartbeat its ack when it asked (never a refusal); any
    other message a refusal when refused. None: the loop never answered (cancelled)."""
    if outcome is None:
        return
    if isinstance(message.inp, inputs.Heartbeat):
        if outcome.refusal is None and message.message.heartbeat.want_ack:
            message.route.put(agent_pb2.SupervisorMessage(
                heartbeat_ack=agent_pb2.HeartbeatAck(seq=message.message.heartbeat.seq)))
        return
    if outcome.refusal is not None:
        kind = type(message.inp).__name__
        message.route.put(_refusal(outcome.refusal, kind, RETRYABLE if outcome.is_retryable else PERMANENT))


def _answer_one(message: _Message, reply: asyncio.Future[Outcome]) -> None:
    _answer(message, None if reply.cancelled() else reply.result())


def _answer_run(run: list[_Message], replies: asyncio.Future[list[Outcome]]) -> None:
    if replies.cancelled():
        return
    for message, outcome in zip(run, replies.result()):
        _answer(message, outcome)


def _answer_parts(routes: list[RelayRoute], kind: str, replies: asyncio.Future[list[Outcome]]) -> None:
    """A fold's parts' outcomes, each on its node's route: a refusal when refused (a part of a
    fold is never a heartbeat, so nothing else is said)."""
    if replies.cancelled():
        return
    for route, outcome in zip(routes, replies.result()):
        if outcome.refusal is not None:
            route.put(_refusal(outcome.refusal, kind, RETRYABLE if outcome.is_retryable else PERMANENT))


def _on_success(then: Callable[[], object]) -> Callable[[asyncio.Future[Outcome]], None]:
    def done(reply: asyncio.Future[Outcome]) -> None:
        if not reply.cancelled() and reply.result().refusal is None:
            then()

    return done
