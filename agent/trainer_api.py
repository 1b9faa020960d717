"""TrainerLink service on the local unix socket: the only door a trainer rank has to ftsup.

Relays step reports and finished ranks to the supervisor, takes snapshots into the RAM store and
replicates them to the buddy in the background, and hands each rank its restore. Every request
is checked against the generation and ranks this node runs; bad input gets a clear gRPC error
(INVALID_ARGUMENT / FAILED_PRECONDITION) and a log line, never a crash.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog
from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc

from agent.codec import blob_from_proto, blob_to_proto, holding_report
from agent.launcher import Launcher
from agent.link import Reports
from agent.peers import PeerClient, PeerUnavailable
from agent.progress import ProgressTracker
from agent.restore import RestoreBook, RestoreUnavailable, UnknownRank
from agent.snapshots import Blob, InvalidBlob, SnapshotStore

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
    ) -> None:
        self._progress = progress or ProgressTracker()
        self._node_id = node_id
        self._launcher = launcher
        self._store = store
        self._restores = restores
        self._peers = peers
        self._reports = reports
        self._log = log

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

    async def GetRestore(self, request: peer_pb2.GetRestoreRequest, context: Context) -> peer_pb2.GetRestoreResponse:  # noqa: N802
        try:
            blob = await self._restores.get(request.rank, request.generation)
        except UnknownRank as exc:
            self._log.warning("trainer_request_rejected", generation=request.generation, rank=request.rank,
                              reason=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except RestoreUnavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if blob is None:
            return peer_pb2.GetRestoreResponse(has_state=False)
        return peer_pb2.GetRestoreResponse(has_state=True, blob=blob_to_proto(blob))

    async def ReportStep(self, request: agent_pb2.StepReport, context: Context) -> peer_pb2.LinkAck:  # noqa: N802
        await self._check_rank(context, "ReportStep", request.generation, request.rank)
        self._progress.record_step(request.generation, request.rank, request.step, request.step_time_s)
        self._reports.send(agent_pb2.AgentMessage(step_report=request))
        run = self._launcher.run
        ahead = [s for s in run.checkpoint_steps if s > request.step] if run is not None else []
        return peer_pb2.LinkAck(checkpoint_steps=ahead)

    async def ReportFinished(self, request: agent_pb2.RankFinished, context: Context) -> peer_pb2.LinkAck:  # noqa: N802
        await self._check_rank(context, "ReportFinished", request.generation, request.rank)
        self._launcher.mark_finished(request.generation, request.rank)
        self._log.info("rank_finished", generation=request.generation, rank=request.rank, step=request.step)
        self._reports.send(agent_pb2.AgentMessage(rank_finished=request), sticky=True)
        return peer_pb2.LinkAck()

    async def ReportCheckpointShard(self, request: agent_pb2.CheckpointShard, context: Context) -> peer_pb2.LinkAck:  # noqa: N802
        await self._check_rank(context, "ReportCheckpointShard", request.generation, request.rank)
        self._log.info("checkpoint_shard_written", generation=request.generation, rank=request.rank,
                       checkpoint_id=request.checkpoint_id, step=request.step, error=request.error or None)
        self._reports.send(agent_pb2.AgentMessage(checkpoint_shard=request), sticky=True)
        return peer_pb2.LinkAck()

    async def AwaitGeneration(  # noqa: N802
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

    async def WatchGeneration(  # noqa: N802
        self, request: peer_pb2.WatchGenerationRequest, context: Context
    ) -> peer_pb2.LinkAck:
        run = self._launcher.watching(request.generation, request.rank)
        if run is not None:
            await run.replaced.wait()
        return peer_pb2.LinkAck()

    async def PutSnapshot(self, request: peer_pb2.PutSnapshotRequest, context: Context) -> peer_pb2.LinkAck:  # noqa: N802
        blob = blob_from_proto(request.blob)
        await self._check_rank(context, "PutSnapshot", blob.generation, blob.rank)
        if not blob.owner_node_id:
            blob = Blob(blob.generation, blob.rank, blob.step, self._node_id, blob.payload, blob.sha256)
        try:
            await self._store.put_off_loop(blob)
        except InvalidBlob as exc:
            self._log.warning("trainer_snapshot_rejected", generation=blob.generation, rank=blob.rank, step=blob.step,
                              error=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._reports.send(holding_report(blob, self._node_id))
        # Replicate before answering: the trainer keeps one hand-off in flight, so answering only
        # once the buddy holds the copy bounds the uncommitted work to about one step.
        if not await self._replicate(blob):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"generation {blob.generation} was replaced while its snapshot was being replicated")
        return peer_pb2.LinkAck()

    async def _replicate(self, blob: Blob) -> bool:
        """Copies the blob to the buddy, which reports its own holding to the supervisor. False:
        a directive replaced the generation meanwhile (the copy was abandoned: a dead buddy's
        retries must not hold the rank back from the next generation)."""
        run = self._launcher.run
        buddy_address = run.buddy_address if run is not None else ""
        if not buddy_address or run is None:
            return True
        store = asyncio.ensure_future(self._peers.store(buddy_address, blob))
        replaced = asyncio.ensure_future(run.replaced.wait())
        try:
            await asyncio.wait({store, replaced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            replaced.cancel()
        if not store.done():
            store.cancel()
            self._log.info("buddy_replication_abandoned", buddy=buddy_address, generation=blob.generation,
                           rank=blob.rank, step=blob.step)
            return False
        try:
            store.result()
        except (PeerUnavailable, Exception) as exc:  # noqa: BLE001 - the step just stays uncommitted
            self._log.warning(
                "buddy_replication_failed", buddy=buddy_address, generation=blob.generation, rank=blob.rank,
                step=blob.step, error=str(exc)
            )
        self._log.debug("snapshot_replicated", generation=blob.generation, rank=blob.rank, step=blob.step,
                        bytes_held=self._store.bytes_held)
        return True
