"""The agents' side of the wire: Supervisor.Connect streams, translated to and from core inputs.

One stream per node. The first message must be Hello; every later message is stamped with the
node id of that Hello (an agent cannot speak for another node). Refusals go back on the same
stream; a refused Hello ends it. Closing the stream is reported to the runtime at once: it is the
fastest death signal there is.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from ftsup.v1 import agent_pb2, agent_pb2_grpc, events_pb2
from ftsup.common import logs
from ftsup.supervisor.core import inputs
from ftsup.supervisor.core.events import NodeRole, SdcRankDigests
from ftsup.supervisor.runtime import Outbox, Outcome, Runtime
from ftsup.common.tls import PeerKind, peer_identity

log = logs.get("supervisor.agents")

_ROLES = {events_pb2.NODE_ROLE_ACTIVE: NodeRole.ACTIVE, events_pb2.NODE_ROLE_SPARE: NodeRole.SPARE}


MAX_OUTPUT_TAIL = 8192  # characters of a rank's output kept in the log: a bound whatever an agent sends


def _refusal(reason: str, refused: str) -> agent_pb2.SupervisorMessage:
    return agent_pb2.SupervisorMessage(refusal=agent_pb2.Refusal(reason=reason, refused=refused))


def to_input(node_id: str, incarnation: int, message: agent_pb2.AgentMessage) -> inputs.Input | None:
    kind = message.WhichOneof("kind")
    if kind == "heartbeat":
        hb = message.heartbeat
        return inputs.Heartbeat(node_id=node_id, incarnation=incarnation, running_generation=hb.running_generation)
    if kind == "step_report":
        r = message.step_report
        return inputs.StepReport(node_id, r.generation, r.rank, r.step, r.step_time_s, r.compute_time_s,
                                 r.loss, r.param_digest,
                                 r.grad_norm if r.HasField("grad_norm") else math.nan, r.tokens, r.local_grad_digest)
    if kind == "snapshot_report":
        s = message.snapshot_report
        return inputs.SnapshotReport(node_id, s.generation, s.rank, s.step, tuple(s.holder_node_ids), s.size_bytes)
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
    if kind == "sdc_check_result":
        c = message.sdc_check_result
        # Every recomputed digest is the sender's own: the node id comes from the stream, never the message.
        recomputed = tuple(SdcRankDigests(d.rank, node_id, d.grad_digest, d.param_digest) for d in c.recomputed)
        return inputs.SdcCheckResult(node_id, c.check_id, c.step, c.rank, recomputed, c.error, c.replay_s)
    return None


class AgentService(agent_pb2_grpc.SupervisorServicer):
    def __init__(self, runtime: Runtime, *, is_tls: bool = False) -> None:
        self._runtime = runtime
        self._is_tls = is_tls  # mTLS: the client certificate must name the Hello's node id

    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.SupervisorMessage]:
        outbox: Outbox = asyncio.Queue()
        stream_id = self._runtime.open_stream(outbox)
        peer = context.peer()
        try:
            first = await anext(aiter(request_iterator), None)
        except grpc.aio.AioRpcError:
            first = None
        except DecodeError as exc:  # bytes that are no AgentMessage: say so, not a bare UNKNOWN
            self._runtime.close_stream(stream_id, None, 0)
            yield _refusal(f"undecodable message: {exc}", "undecodable")
            return
        if first is None or first.WhichOneof("kind") != "hello":
            self._runtime.close_stream(stream_id, None, 0)
            got = first.WhichOneof("kind") if first is not None else "nothing"
            yield _refusal(f"the first message on a stream must be Hello, got {got}", got or "unknown")
            return
        hello = first.hello
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
        if not self._runtime.is_leader:
            # Agents know every replica; a follower points them at the leader (empty: retry).
            self._runtime.close_stream(stream_id, None, 0)
            yield agent_pb2.SupervisorMessage(not_leader=agent_pb2.NotLeader(leader_address=self._runtime.leader_address))
            return
        role = _ROLES.get(hello.role)
        if role is None:
            self._runtime.close_stream(stream_id, None, 0)
            yield _refusal(f"Hello has no valid role ({hello.role}); use active or spare", "hello")
            return
        reason = (await self._runtime.submit(
            inputs.AgentHello(hello.node_id, hello.incarnation, role, hello.host, hello.peer_port, hello.gpus, stream_id,
                              hello.failure_domain)
        )).refusal
        if reason is not None:
            self._runtime.close_stream(stream_id, None, 0)
            yield _refusal(reason, "hello")
            return
        log.info("node connected", node_id=hello.node_id, generation=self._runtime.generation_in_force,
                 incarnation=hello.incarnation, peer=peer)
        reader = asyncio.create_task(self._read(hello.node_id, hello.incarnation, request_iterator, outbox))
        try:
            while True:
                message = await outbox.get()
                if message is None:
                    return
                yield message
        finally:
            reader.cancel()
            self._runtime.close_stream(stream_id, hello.node_id, hello.incarnation)
            log.info("node stream closed", node_id=hello.node_id, generation=self._runtime.generation_in_force,
                     incarnation=hello.incarnation, peer=peer)

    async def _read(self, node_id: str, incarnation: int, requests: AsyncIterator[agent_pb2.AgentMessage], outbox: Outbox) -> None:
        try:
            async for message in requests:
                inp = to_input(node_id, incarnation, message)
                if inp is None:
                    kind = message.WhichOneof("kind") or "empty"
                    outbox.put_nowait(_refusal(f"unexpected {kind} message after Hello", kind))
                    continue
                if isinstance(inp, inputs.Heartbeat):
                    if message.heartbeat.want_ack:  # acked once the runtime loop handled it
                        self._runtime.submit(inp).add_done_callback(_ack_on(outbox, message.heartbeat.seq))
                    else:
                        self._runtime.post(inp)
                    continue
                reply = self._runtime.submit(inp)  # queued now: order is kept
                reply.add_done_callback(_refuse_on(outbox, type(inp).__name__))
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except DecodeError as exc:  # the stream cannot go on after corrupt bytes: end it, saying why
            outbox.put_nowait(_refusal(f"undecodable message: {exc}; closing the stream", "undecodable"))
        finally:
            outbox.put_nowait(None)


def _refuse_on(outbox: Outbox, kind: str):  # type: ignore[no-untyped-def]
    def done(reply: asyncio.Future[Outcome]) -> None:
        reason = reply.result().refusal if not reply.cancelled() else None
        if reason is not None:
            outbox.put_nowait(_refusal(reason, kind))

    return done


def _ack_on(outbox: Outbox, seq: int):  # type: ignore[no-untyped-def]
    def done(reply: asyncio.Future[Outcome]) -> None:
        if not reply.cancelled() and reply.result().refusal is None:
            outbox.put_nowait(agent_pb2.SupervisorMessage(heartbeat_ack=agent_pb2.HeartbeatAck(seq=seq)))

    return done
