"""TrainerLink service on the local unix socket: the only door a trainer rank has to ftsup.

Relays step reports and finished ranks to the supervisor, takes snapshots into the RAM store,
streaming each to the buddy while it still arrives, and hands each rank its restore. Snapshots
travel both ways as chunk streams (agent/streams.py). Every request is checked against the
generation and ranks this node runs; bad input gets a clear gRPC error (INVALID_ARGUMENT /
FAILED_PRECONDITION / RESOURCE_EXHAUSTED) and a log line, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import structlog

from ftsup.agent.codec import holding_report
from ftsup.agent.core.hang import MAX_PHASE_TIMEOUT_S, Phase
from ftsup.agent.launcher import Launcher
from ftsup.agent.link import Reports
from ftsup.agent.peers import PeerClient, PeerUnavailable
from ftsup.agent.progress import ProgressTracker
from ftsup.agent.restore import RestoreBook, RestoreUnavailable, UnknownRank
from ftsup.agent.snapshots import Incoming, InvalidSnapshot, SnapshotMemoryFull, SnapshotStore
from ftsup.agent.streams import ident_of, opening_chunk, receive, send_blob
from ftsup.common.chunks import CHUNK_BYTES
from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc

Logger = structlog.typing.FilteringBoundLogger
Context = grpc.aio.ServicerContext
MAX_AWAIT_S = 600.0  # the longest a broken rank may wait for its next generation


class TrainerLinkService(peer_pb2_grpc.TrainerLinkServicer):
    def __init__(
        self,
        node_id: str,
        launcher: Launcher,
        store: SnapshotStore,
        restores: RestoreBook,
        peers: PeerClient,
        reports: Reports,
        log: Logger,
        progress: ProgressTracker | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self._chunk_bytes = chunk_bytes
        self._forwards: set[asyncio.Task[None]] = set()  # buddy streams, referenced until done
        self._progress = progress or ProgressTracker()
        self._node_id = node_id
        self._launcher = launcher
        self._store = store
        self._restores = restores
        self._peers = peers
        self._reports = reports
        self._log = log

    def _attach(self, generation: int, rank: int) -> None:
        """The rank uses a Session: its exit 0 is not a finish by itself, and hangs are watched."""
        self._launcher.mark_attached(generation, rank)
        self._progress.attach(generation, rank)

    async def _check_rank(self, context: Context, what: str, generation: int, rank: int) -> None:
        run = self._launcher.run
        if run is None or run.generation != generation:
            running = run.generation if run is not None else 0
            message = f"{what}: generation {generation} is not running on node {self._node_id} (running {running})"
            self._log.warning("trainer_request_rejected", generation=generation, rank=rank, reason=message)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        if rank not in run.ranks:
            message = f"{what}: rank {rank} is not run by node {self._node_id} (ranks {list(run.ranks)})"
            self._log.warning("trainer_request_rejected", generation=generation, rank=rank, reason=message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    # mypy-protobuf types a server-streaming servicer method as an iterator; grpc.aio also serves a
    # coroutine that writes with context.write (here, so that the blob stays pinned while it is written).
    async def GetRestore(self, request: peer_pb2.GetRestoreRequest, context: Context) -> None:  # type: ignore[override]
        self._attach(request.generation, request.rank)
        try:
            blob = await self._restores.get(request.rank, request.generation)
        except UnknownRank as exc:
            self._log.warning("trainer_request_rejected", generation=request.generation, rank=request.rank,
                              reason=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RestoreUnavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if blob is not None:  # no chunk at all: start fresh
            with self._store.pin(blob):  # counted until the trainer took it, even if retention drops it
                await send_blob(context.write, blob, self._chunk_bytes)

    async def ReportStep(self, request: agent_pb2.StepReport, context: Context) -> peer_pb2.LinkAck:
        await self._check_rank(context, "ReportStep", request.generation, request.rank)
        self._record_step(request)
        return self._step_ack(request.step)

    async def ReportSteps(self, request: peer_pb2.StepReports, context: Context) -> peer_pb2.LinkAck:
        """A window of one rank's step reports: each handled as by ReportStep, in order."""
        for report in request.reports:
            await self._check_rank(context, "ReportSteps", report.generation, report.rank)
            self._record_step(report)
        return self._step_ack(max((r.step for r in request.reports), default=0))

    def _record_step(self, report: agent_pb2.StepReport) -> None:
        self._attach(report.generation, report.rank)
        self._progress.record_step(report.generation, report.rank, report.step, report.step_time_s)
        self._reports.send(agent_pb2.AgentMessage(step_report=report))

    def _step_ack(self, step: int) -> peer_pb2.LinkAck:
        """The checkpoint steps requested beyond `step`: what the rank must know for its next steps."""
        run = self._launcher.run
        ahead = [s for s in run.checkpoint_steps if s > step] if run is not None else []
        return peer_pb2.LinkAck(checkpoint_steps=ahead)

    async def ReportFinished(self, request: agent_pb2.RankFinished, context: Context) -> peer_pb2.LinkAck:
        await self._check_rank(context, "ReportFinished", request.generation, request.rank)
        self._attach(request.generation, request.rank)
        self._launcher.mark_finished(request.generation, request.rank)
        self._log.info("rank_finished", generation=request.generation, rank=request.rank, step=request.step)
        self._reports.send(agent_pb2.AgentMessage(rank_finished=request), sticky=True)
        return peer_pb2.LinkAck()

    async def ReportCheckpointShard(self, request: agent_pb2.CheckpointShard, context: Context) -> peer_pb2.LinkAck:
        await self._check_rank(context, "ReportCheckpointShard", request.generation, request.rank)
        self._log.info("checkpoint_shard_written", generation=request.generation, rank=request.rank,
                       checkpoint_id=request.checkpoint_id, step=request.step, error=request.error or None)
        self._reports.send(agent_pb2.AgentMessage(checkpoint_shard=request), sticky=True)
        return peer_pb2.LinkAck()

    async def AwaitGeneration(
        self, request: peer_pb2.AwaitGenerationRequest, context: Context
    ) -> peer_pb2.AwaitGenerationResponse:
        """The in-process fast path: the rank's group broke; it waits here for the next generation
        this node runs, and gets its new rank's environment instead of being restarted."""
        if not (0.0 < request.wait_s <= MAX_AWAIT_S):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"wait_s must be in (0, {MAX_AWAIT_S:g}]")
        outcome = await self._launcher.await_generation(request.generation, request.rank, request.wait_s)
        if isinstance(outcome, str):
            self._log.info("rejoin_declined", generation=request.generation, rank=request.rank, reason=outcome)
            return peer_pb2.AwaitGenerationResponse(assigned=False, reason=outcome)
        return peer_pb2.AwaitGenerationResponse(
            assigned=True, env=[agent_pb2.EnvVar(name=k, value=v) for k, v in sorted(outcome.items())])

    async def WatchGeneration(
        self, request: peer_pb2.WatchGenerationRequest, context: Context
    ) -> peer_pb2.LinkAck:
        self._attach(request.generation, request.rank)
        run = self._launcher.watching(request.generation, request.rank)
        if run is not None:
            await run.replaced.wait()
        return peer_pb2.LinkAck()

    async def ReportLiveness(self, request: peer_pb2.LivenessReport, context: Context) -> peer_pb2.LinkAck:
        """Level 1: a heartbeat or a phase change counts as progress for the hang watcher."""
        await self._check_rank(context, "ReportLiveness", request.generation, request.rank)
        timeout_s = request.phase_timeout_s
        if not (0.0 <= timeout_s <= MAX_PHASE_TIMEOUT_S) or len(request.phase) > 128:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"phase must be at most 128 characters and phase_timeout_s within"
                                f" [0, {MAX_PHASE_TIMEOUT_S:g}], got {request.phase[:40]!r}, {timeout_s!r}")
        phase = Phase(request.phase, timeout_s) if request.phase else None
        self._attach(request.generation, request.rank)
        self._progress.record_liveness(request.generation, request.rank, phase)
        return peer_pb2.LinkAck()

    async def PutSnapshot(self, request_iterator: Any, context: Context) -> peer_pb2.LinkAck:
        try:
            first, header = opening_chunk(await context.read())
        except InvalidSnapshot as exc:
            self._log.warning("trainer_snapshot_rejected", error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        await self._check_rank(context, "PutSnapshot", header.generation, header.rank)
        where = {"generation": header.generation, "rank": header.rank, "step": header.step}
        try:
            incoming = self._store.receive(ident_of(header, self._node_id), header.size_bytes)
        except InvalidSnapshot as exc:
            self._log.warning("trainer_snapshot_rejected", error=str(exc), **where)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SnapshotMemoryFull as exc:
            self._log.warning("trainer_snapshot_rejected", error=str(exc), **where)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        # Pipelined: the buddy gets each chunk as soon as it landed here, not after the whole payload.
        replication = asyncio.create_task(self._replicate(incoming))
        self._forwards.add(replication)
        replication.add_done_callback(self._forwards.discard)
        try:
            blob = await receive(first, context.read, incoming)
        except InvalidSnapshot as exc:
            self._log.warning("trainer_snapshot_rejected", error=str(exc), **where)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            if incoming.blob is None:  # the forwarder sees the discard and cancels the buddy's stream
                replication.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replication
        self._reports.send(holding_report(blob, self._node_id))
        # Answer once the buddy holds the copy too: the trainer keeps one hand-off in flight, so
        # this bounds the uncommitted work to about one step. Shielded: a trainer that goes away
        # now does not stop its buddy copy (the step may still commit). But once a directive
        # replaced the generation the copy is moot: a dead buddy's retries must not hold the rank
        # back from the next generation (the fast path), so it is abandoned and the rank told.
        run = self._launcher.run
        if run is not None and run.generation == blob.generation:
            replaced = asyncio.ensure_future(run.replaced.wait())
            try:
                await asyncio.wait({replication, replaced}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                replaced.cancel()
            if not replication.done():
                replication.cancel()
                self._log.info("buddy_replication_abandoned", generation=blob.generation, rank=blob.rank,
                               step=blob.step)
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"generation {blob.generation} was replaced while its snapshot was being replicated")
        await asyncio.shield(replication)
        return peer_pb2.LinkAck()

    async def _replicate(self, incoming: Incoming) -> None:
        """Streams the snapshot to the buddy as it arrives; the buddy reports its own holding."""
        run = self._launcher.run
        if run is None or not run.buddy_address:
            return
        buddy_address = run.buddy_address
        ident = incoming.ident
        try:
            await self._peers.store(buddy_address, ident, incoming.size_bytes,
                                    lambda: incoming.follow(self._chunk_bytes), node_id=run.buddy_node_id)
        except InvalidSnapshot:
            return  # discarded here: the trainer is told why, the buddy kept nothing
        except (PeerUnavailable, Exception) as exc:
            self._log.warning(
                "buddy_replication_failed", buddy=buddy_address, generation=ident.generation, rank=ident.rank,
                step=ident.step, error=str(exc)
            )
            return
        self._log.debug("snapshot_replicated", generation=ident.generation, rank=ident.rank, step=ident.step,
                        bytes_held=self._store.bytes_held)
