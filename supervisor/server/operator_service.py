"""The Operator service behind supervisorctl: views, the event stream and node commands.

Views come from the runtime's pure view functions; this module only converts them to proto.
Job-wide methods (goodput, stragglers, checkpoints, restart) live in operator_jobs.py.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import grpc

from ftsup.common import logs
from ftsup.supervisor import codec
from ftsup.supervisor.core.events import NodeRole
from ftsup.supervisor.core.inputs import OperatorCommandKind, OperatorRequest
from ftsup.supervisor.core.state import Liveness
from ftsup.supervisor.core.views import JobPhase, NodeView
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server.log_digest import LogDigest
from ftsup.supervisor.server.log_relay import LogRelay, RelayRefused
from ftsup.supervisor.server.operator_guard import principal
from ftsup.supervisor.server.operator_jobs import JobMethods, require_reason
from ftsup.v1 import agent_pb2, events_pb2, operator_pb2, operator_pb2_grpc, peer_pb2, state_pb2

_PHASE = {
    JobPhase.WAITING: operator_pb2.JOB_PHASE_WAITING,
    JobPhase.STARTING: operator_pb2.JOB_PHASE_STARTING,
    JobPhase.RUNNING: operator_pb2.JOB_PHASE_RUNNING,
    JobPhase.COMPLETED: operator_pb2.JOB_PHASE_COMPLETED,
    JobPhase.FAILED: operator_pb2.JOB_PHASE_FAILED,
}
_LIVENESS = {
    Liveness.ALIVE: state_pb2.LIVENESS_ALIVE,
    Liveness.SUSPECT: state_pb2.LIVENESS_SUSPECT,
    Liveness.DEAD: state_pb2.LIVENESS_DEAD,
}
log = logs.get("supervisor.operator")

_ROLE = {NodeRole.ACTIVE: events_pb2.NODE_ROLE_ACTIVE, NodeRole.SPARE: events_pb2.NODE_ROLE_SPARE}


class OperatorService(JobMethods, operator_pb2_grpc.OperatorServicer):
    def __init__(self, runtime: Runtime, address: str, digest: LogDigest | None = None,
                 relay: LogRelay | None = None) -> None:
        # Callers are authorized by operator_guard.guarded(), which wraps this servicer.
        self._runtime = runtime
        self._address = address
        # Ranks' output from their agents (plaintext peer channels unless given the replica's TLS files).
        self._relay = relay if relay is not None else LogRelay(lambda: runtime.state, None)
        # Goodput and recent detections, read from the log once: shared with /metrics when served.
        self._digest = digest if digest is not None else LogDigest()

    async def GetStatus(
        self, request: operator_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.GetStatusResponse:
        view = self._runtime.status()
        response = operator_pb2.GetStatusResponse(
            job_name=view.job_name,
            phase=_PHASE[view.phase],
            generation=view.generation,
            step=view.step,
            world_size=view.world_size,
            loss=view.loss if math.isfinite(view.loss) else math.nan,
            head_seq=view.head_seq,
            leader_address=self._address if self._runtime.is_leader else self._runtime.leader_address,
            nodes_alive=view.nodes_alive,
            nodes_suspect=view.nodes_suspect,
            nodes_dead=view.nodes_dead,
            nodes_quarantined=view.nodes_quarantined,
            spares_ready=view.spares_ready,
            waiting_reason=view.waiting_reason,
            final_digest=view.final_digest,
            degraded_reason=self._runtime.degraded_reason,
            first_seq=self._runtime.event_log.first_seq,
            failure=view.failure,
            failure_tail=view.failure_tail,
            restarts=view.restarts,
        )
        max_restarts = self._runtime.config.job.max_restarts
        if max_restarts is not None:
            response.max_restarts = max_restarts
        if view.last_snapshot_step is not None:
            response.last_snapshot_step = view.last_snapshot_step
        if self._runtime.state.checkpoint is not None:
            response.last_checkpoint_step = self._runtime.state.checkpoint.step
        ettr = (await self._goodput()).ettr
        if ettr is not None:
            response.ettr = ettr
        return response

    async def ListNodes(
        self, request: operator_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.ListNodesResponse:
        return operator_pb2.ListNodesResponse(nodes=[_node_info(n) for n in self._runtime.nodes()])

    async def GetLeader(
        self, request: operator_pb2.GetLeaderRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.GetLeaderResponse:
        runtime = self._runtime
        return operator_pb2.GetLeaderResponse(
            address=self._address,
            is_leader=runtime.is_leader,
            leader_address=self._address if runtime.is_leader else runtime.leader_address,
            term=runtime.term,
            applied_seq=runtime.state.applied_seq,
            head_seq=runtime.event_log.head_seq,
            backend=type(runtime.event_log).__name__.removesuffix("Log").lower(),
        )

    async def Quarantine(
        self, request: operator_pb2.NodeCommandRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CommandResponse:
        return await self._command(OperatorCommandKind.QUARANTINE, request, context)

    async def Unquarantine(
        self, request: operator_pb2.NodeCommandRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CommandResponse:
        return await self._command(OperatorCommandKind.UNQUARANTINE, request, context)

    async def Drain(
        self, request: operator_pb2.NodeCommandRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CommandResponse:
        return await self._command(OperatorCommandKind.DRAIN, request, context)

    async def _command(
        self, command: OperatorCommandKind, request: operator_pb2.NodeCommandRequest, context: grpc.aio.ServicerContext
    ) -> operator_pb2.CommandResponse:
        # Authorization happened before this method ran: supervisor/server/operator_guard.py.
        await require_reason(request.reason, context)
        outcome = await self._runtime.submit(
            OperatorRequest(command, request.node_id, request.reason, request.operator or "unknown", principal())
        )
        if outcome.refusal is not None:
            # A node nobody registered is a wrong name, not a state the cluster is in.
            unknown = self._runtime.state.node(request.node_id) is None
            await context.abort(grpc.StatusCode.NOT_FOUND if unknown else grpc.StatusCode.FAILED_PRECONDITION,
                                outcome.refusal)
        first = outcome.records[0] if outcome.records else None
        detail = ", ".join(type(r.event).__name__ for r in outcome.records) or "nothing to do"
        if command == "drain" and not any(type(r.event).__name__ == "NodeDrained" for r in outcome.records):
            detail += "; the node is drained at its generation's next committed step"
        log.info("operator command", command=command, node_id=request.node_id,
                 generation=self._runtime.generation_in_force, operator=request.operator, principal=principal(),
                 reason=request.reason, records=detail)
        return operator_pb2.CommandResponse(detail=detail, seq=first.seq if first else 0)

    async def ListEvents(
        self, request: operator_pb2.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[events_pb2.Record]:
        log = self._runtime.event_log
        # Records a snapshot covered may have been compacted: start at the oldest one kept.
        since = max(request.since_seq, log.first_seq)
        if not request.follow:
            for record in log.read(since):
                yield codec.record_to_proto(record)
            return
        async for record in log.follow(since):
            yield codec.record_to_proto(record)

    async def StreamLogs(
        self, request: operator_pb2.StreamLogsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[peer_pb2.LogLines]:
        """A rank's output from its agent (server/log_relay.py): an agent's refusal passes through."""
        try:
            async for message in self._relay.stream(request):
                yield message
        except RelayRefused as refused:
            await context.abort(refused.code, str(refused))
        except grpc.aio.AioRpcError as error:
            code = error.code()
            if code == grpc.StatusCode.CANCELLED:
                return
            await context.abort(code, f"from the node's agent: {error.details()}")  # ctl/logs.py AGENT_ERROR


def _node_info(n: NodeView) -> operator_pb2.NodeInfo:
    info = operator_pb2.NodeInfo(
        node_id=n.node_id,
        role=_ROLE[n.role],
        liveness=_LIVENESS[n.liveness],
        quarantined=n.is_quarantined,
        quarantine_reason=n.quarantine_reason,
        ranks=n.ranks,
        last_heartbeat_age_s=n.last_heartbeat_age_s,
        incarnation=n.incarnation,
        host=n.host,
        connected=n.is_connected,
        xid_count=n.xid_count,
        straggler_score=n.straggler_score,
        failure_domain=n.failure_domain,
        drained=n.is_drained,
    )
    memory = n.snapshot_memory
    if memory is not None:
        info.snapshot_memory.CopyFrom(agent_pb2.SnapshotMemory(
            limit_bytes=memory.limit_bytes, derived_bytes=memory.derived_bytes, basis=memory.basis,
            ranks=memory.ranks, reason=memory.reason))
    return info
