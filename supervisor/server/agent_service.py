"""The agents' side of the wire: Supervisor.Connect streams, translated to and from core inputs.

One stream per node. The first message must be Hello; every later message is stamped with the
node id of that Hello (an agent cannot speak for another node). Refusals go back on the same
stream, typed RETRYABLE (not decided now) or PERMANENT; a refused Hello ends the stream.
Every queue is bounded and a stream that floods is closed with RESOURCE_EXHAUSTED (see the limits
below and supervisor/outbox.py). Closing the stream is reported to the runtime at once: it is the
fastest death signal there is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from ftsup.common import logs
from ftsup.common.tls import PeerKind, peer_identity
from ftsup.supervisor.core import inputs
from ftsup.supervisor.core.events import NodeRole, SdcRankDigests
from ftsup.supervisor.core.limits import MAX_TEXT
from ftsup.supervisor.core.token_bucket import TokenBucket
from ftsup.supervisor.outbox import OUTBOX_CAPACITY, StreamOutbox
from ftsup.supervisor.runtime import Outcome, Runtime
from ftsup.supervisor.server import snapshot_holdings, step_aggregate
from ftsup.supervisor.server.hello_checks import hello_problem
from ftsup.supervisor.shard import LinkShard
from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2

log = logs.get("supervisor.agents")

_ROLES = {events_pb2.NODE_ROLE_ACTIVE: NodeRole.ACTIVE, events_pb2.NODE_ROLE_SPARE: NodeRole.SPARE}


MAX_OUTPUT_TAIL = 8192  # characters of a rank's output kept in the log: a bound whatever an agent sends


RETRYABLE = agent_pb2.REFUSAL_KIND_RETRYABLE
PERMANENT = agent_pb2.REFUSAL_KIND_PERMANENT

@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Flood control per agent stream (issue 16, item 9); each bound with why.

    A healthy agent sends a heartbeat a second, a step report per rank per step and, on
    (re)connecting, its held snapshots and once-only facts (a few thousand at once): the burst
    covers that, the rate 64 ranks at 15 steps/s. Refusals are a misbehaving stream's signature
    (a healthy one gets a few after a restart). Inputs of one stream waiting for the loop are
    capped so one stream cannot fill the runtime's queue for everyone: beyond it the reader stops
    reading and gRPC flow control slows the sender.
    """

    messages_per_s: float = 2_000.0
    message_burst: float = 20_000.0
    refusals_per_s: float = 20.0
    refusal_burst: float = 500.0
    max_in_flight: int = 256
    outbox_capacity: int = OUTBOX_CAPACITY


def _refusal(reason: str, refused: str, kind: int = PERMANENT, *, ends_stream: bool = False) -> agent_pb2.SupervisorMessage:
    return agent_pb2.SupervisorMessage(refusal=agent_pb2.Refusal(
        reason=reason, refused=refused, kind=kind, ends_stream=ends_stream))  # type: ignore[arg-type]


def to_input(node_id: str, incarnation: int, message: agent_pb2.AgentMessage) -> inputs.Input | None:
    kind = message.WhichOneof("kind")
    if kind == "heartbeat":
        hb = message.heartbeat
        return inputs.Heartbeat(node_id=node_id, incarnation=incarnation, running_generation=hb.running_generation)
    if kind == "step_report":
        return step_aggregate.report_from_proto(node_id, message.step_report)
    if kind == "step_aggregate":  # raises MalformedAggregate, said to the sender as a refusal
        return step_aggregate.to_input(node_id, message.step_aggregate)
    if kind == "snapshot_report":
        return snapshot_holdings.report_from_proto(node_id, message.snapshot_report)
    if kind == "snapshot_holdings":  # raises MalformedHoldings, said to the sender as a refusal
        return snapshot_holdings.to_input(node_id, message.snapshot_holdings)
    if kind == "rank_finished":
        f = message.rank_finished
        return inputs.RankFinished(node_id, f.generation, f.rank, f.step, f.param_digest)
    if kind == "trainer_exit":
        e = message.trainer_exit
        return inputs.TrainerExit(node_id, e.generation, e.rank, e.exit_code, e.finished,
                                  output_tail=e.output_tail[:MAX_OUTPUT_TAIL], is_plain_script=e.is_plain_script)
    if kind == "xid_event":
        x = message.xid_event
        return inputs.XidReport(node_id, x.pci, x.gpu if x.HasField("gpu") else None, x.code, x.message)
    if kind == "trainer_hung":
        h = message.trainer_hung
        return inputs.TrainerHung(node_id, h.generation, h.rank, h.last_step, h.silent_for_s, h.limit_s)
    if kind == "checkpoint_shard":
        c = message.checkpoint_shard
        return inputs.CheckpointShardReport(node_id, c.generation, c.rank, c.checkpoint_id, c.step, c.key, c.sha256,
                                            c.size_bytes, c.error)
    if kind == "snapshot_memory":
        m = message.snapshot_memory
        return inputs.SnapshotMemoryReport(node_id, m.limit_bytes, m.derived_bytes if m.HasField("derived_bytes") else None,
                                           m.basis, m.ranks, m.reason[:MAX_TEXT])
    if kind == "sdc_check_result":
        answer = message.sdc_check_result
        # Every recomputed digest is the sender's own: the node id comes from the stream, never the message.
        recomputed = tuple(SdcRankDigests(d.rank, node_id, d.grad_digest, d.param_digest) for d in answer.recomputed)
        return inputs.SdcCheckResult(node_id, answer.check_id, answer.step, answer.rank, recomputed, answer.error,
                                     answer.replay_s)
    return None


class AgentService(agent_pb2_grpc.SupervisorServicer):
    def __init__(self, runtime: Runtime, *, is_tls: bool = False, limits: StreamLimits = StreamLimits(),
                 clock: Callable[[], float] = time.monotonic, shard: LinkShard | None = None) -> None:
        self._runtime = runtime
        # Link shards (replicated supervisors): every replica holds its share of the agents' streams;
        # a follower relays its share to the leader (supervisor/shard.py). None: the leader holds all.
        self._shard = shard
        self._held: dict[int, tuple[str, StreamOutbox]] = {}  # stream id -> (node, outbox) of streams held here
        self._moved: set[int] = set()  # streams ended to move their node to another shard (no death signal)
        self._limits = limits
        self.limit_closures: list[str] = []  # why each stream a limit ended was ended, oldest first (bounded)
        self._is_tls = is_tls  # mTLS: the client certificate must name the Hello's node id
        self._clock = clock

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.SupervisorMessage]:
        outbox = StreamOutbox(self._limits.outbox_capacity)
        stream_id = self._runtime.open_stream(outbox)
        peer = context.peer()
        try:
            first = await anext(aiter(request_iterator), None)
        except grpc.aio.AioRpcError:
            first = None
        except DecodeError as exc:  # bytes that are no AgentMessage: say so, not a bare UNKNOWN
            self._runtime.close_stream(stream_id, None, 0)
            yield _refusal(f"undecodable message: {exc}", "undecodable", ends_stream=True)
            return
        if first is None or first.WhichOneof("kind") != "hello":
            self._runtime.close_stream(stream_id, None, 0)
            got = first.WhichOneof("kind") if first is not None else "nothing"
            yield _refusal(f"the first message on a stream must be Hello, got {got}", got or "unknown",
                           ends_stream=True)
            return
        hello = first.hello
        problem = hello_problem(hello)  # bounded before anything logs or decides on its strings
        if problem is not None:
            self._runtime.close_stream(stream_id, None, 0)
            log.warning("hello refused", reason=problem, peer=peer)
            yield _refusal(problem, "hello", ends_stream=True)
            return
        if self._is_tls:
            identity = peer_identity(context)
            if identity is None or identity.kind is not PeerKind.NODE or identity.name != hello.node_id:
                self._runtime.close_stream(stream_id, None, 0)
                log.warning("node refused: certificate does not match", node_id=hello.node_id,
                            generation=self._runtime.generation_in_force,
                            identity=str(identity) if identity else None, peer=peer)
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"certificate identity {identity or 'none'} may not speak for node {hello.node_id!r}:"
                    f" the agent's certificate must carry spiffe://ftsup/node/{hello.node_id}")
        if self._shard is not None:
            home = self._shard.home_of(hello.node_id, hello.unreachable_replicas)
            if home != self._shard.address:  # another replica's share: tell the agent its shard
                self._runtime.close_stream(stream_id, None, 0)
                yield agent_pb2.SupervisorMessage(not_leader=agent_pb2.NotLeader(leader_address=home,
                                                                                 shard_address=home))
                return
            if not self._runtime.is_leader:  # our share, relayed to the leader
                self._runtime.close_stream(stream_id, None, 0)
                async for message in self._shard.serve(first, request_iterator, peer):
                    yield message
                return
        elif not self._runtime.is_leader:
            # Agents know every replica; a follower points them at the leader (empty: retry).
            self._runtime.close_stream(stream_id, None, 0)
            yield agent_pb2.SupervisorMessage(not_leader=agent_pb2.NotLeader(leader_address=self._runtime.leader_address))
            return
        role = _ROLES.get(hello.role)
        if role is None:
            self._runtime.close_stream(stream_id, None, 0)
            yield _refusal(f"Hello has no valid role ({hello.role}); use active or spare", "hello", ends_stream=True)
            return
        outcome = await self._runtime.submit(
            inputs.AgentHello(hello.node_id, hello.incarnation, role, hello.host, hello.peer_port, hello.gpus, stream_id,
                              hello.failure_domain, takes_snapshot_retain=hello.takes_snapshot_retain)
        )
        if outcome.refusal is not None:
            self._runtime.close_stream(stream_id, None, 0)
            # Not decided now (log unavailable, leadership changing) is no verdict on the node:
            # the agent retries while its trainers go on. Anything else is final for this Hello.
            yield _refusal(outcome.refusal, "hello", RETRYABLE if outcome.is_retryable else PERMANENT,
                           ends_stream=True)
            return
        log.info("node connected", node_id=hello.node_id, generation=self._runtime.generation_in_force,
                 incarnation=hello.incarnation, peer=peer)
        reader = asyncio.create_task(self._read(hello.node_id, hello.incarnation, request_iterator, outbox))
        self._held[stream_id] = (hello.node_id, outbox)
        try:
            while True:
                sent = await outbox.get()
                if sent is None:
                    break
                yield sent
        finally:
            reader.cancel()
            self._held.pop(stream_id, None)
            if stream_id in self._moved:  # moved to its shard: the agent reconnects there at once
                self._moved.discard(stream_id)
                self._runtime.close_stream(stream_id, None, 0)
            else:
                self._runtime.close_stream(stream_id, hello.node_id, hello.incarnation)
            log.info("node stream closed", node_id=hello.node_id, generation=self._runtime.generation_in_force,
                     incarnation=hello.incarnation, peer=peer)
        if outbox.close_reason:
            self.limit_closures = [*self.limit_closures[-99:], outbox.close_reason]
            log.warning("agent stream closed by a limit", node_id=hello.node_id, reason=outbox.close_reason,
                        generation=self._runtime.generation_in_force, peer=peer)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, outbox.close_reason)

    def rehome(self) -> int:
        """Link shards, on the leader: moves the nodes held here whose shard is now another replica
        (one joined the live set), telling each its shard; the leader takes no move for a death."""
        if self._shard is None or not self._runtime.is_leader:
            return 0
        moved = 0
        for stream_id, (node_id, outbox) in list(self._held.items()):
            home = self._shard.home_of(node_id)
            if home != self._shard.address and not outbox.is_closed:
                self._moved.add(stream_id)
                outbox.put(agent_pb2.SupervisorMessage(not_leader=agent_pb2.NotLeader(leader_address=home,
                                                                                     shard_address=home)))
                outbox.close()
                moved += 1
        if moved:
            log.info("nodes moved to their new shards", moved=moved, generation=self._runtime.generation_in_force)
        return moved

    async def _read(self, node_id: str, incarnation: int, requests: AsyncIterator[agent_pb2.AgentMessage],
                    outbox: StreamOutbox) -> None:
        limits, now = self._limits, self._clock()
        messages = TokenBucket.full(limits.messages_per_s, limits.message_burst, now)
        refusals = TokenBucket.full(limits.refusals_per_s, limits.refusal_burst, now)
        in_flight = asyncio.Semaphore(limits.max_in_flight)

        def refuse(reason: str, kind: str, refusal_kind: int = PERMANENT) -> None:
            if refusals.take(self._clock()):
                outbox.put(_refusal(reason, kind, refusal_kind))
            else:
                outbox.close(f"too many refused messages (over {limits.refusals_per_s:g}/s after a burst of"
                             f" {limits.refusal_burst:g}): closing the stream")

        try:
            async for message in requests:
                if outbox.is_closed:
                    return
                if not messages.take(self._clock()):
                    outbox.close(f"flooding: more than {limits.messages_per_s:g} messages/s after a burst of"
                                 f" {limits.message_burst:g}; closing the stream")
                    return
                try:
                    inp = to_input(node_id, incarnation, message)
                except step_aggregate.MalformedAggregate as exc:
                    refuse(f"malformed step aggregate: {exc}", "step_aggregate")
                    continue
                except snapshot_holdings.MalformedHoldings as exc:
                    refuse(f"malformed snapshot holdings: {exc}", "snapshot_holdings")
                    continue
                if inp is None:
                    kind = message.WhichOneof("kind") or "empty"
                    refuse(f"unexpected {kind} message after Hello", kind)
                    continue
                await in_flight.acquire()  # back-pressure: stop reading while this stream has many queued
                reply = await self._runtime.submit_from_stream(inp)  # queued now: order is kept
                reply.add_done_callback(lambda _: in_flight.release())
                if isinstance(inp, inputs.Heartbeat):
                    if message.heartbeat.want_ack:  # acked once the runtime loop handled it
                        reply.add_done_callback(_ack_on(outbox, message.heartbeat.seq))
                    continue
                reply.add_done_callback(_refuse_on(refuse, type(inp).__name__))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except DecodeError as exc:  # the stream cannot go on after corrupt bytes: end it, saying why
            outbox.put(_refusal(f"undecodable message: {exc}; closing the stream", "undecodable", ends_stream=True))
        finally:
            outbox.close()


def _refuse_on(refuse: Callable[[str, str, int], None], kind: str) -> Callable[[asyncio.Future[Outcome]], None]:
    def done(reply: asyncio.Future[Outcome]) -> None:
        outcome = reply.result() if not reply.cancelled() else None
        if outcome is not None and outcome.refusal is not None:
            refuse(outcome.refusal, kind, RETRYABLE if outcome.is_retryable else PERMANENT)

    return done


def _ack_on(outbox: StreamOutbox, seq: int) -> Callable[[asyncio.Future[Outcome]], None]:
    def done(reply: asyncio.Future[Outcome]) -> None:
        if not reply.cancelled() and reply.result().refusal is None:
            outbox.put(agent_pb2.SupervisorMessage(heartbeat_ack=agent_pb2.HeartbeatAck(seq=seq)))

    return done
