"""The trainer's gRPC link to its node's agent (service TrainerLink in peer.proto).

Owns the channel, its message-size limits and per-call deadlines, and translates every gRPC
failure into `AgentLinkError` naming the agent address and the call, so a training script never
sees raw grpc exceptions. Blocking calls only; `session.py` decides what runs in the background.
"""

from __future__ import annotations

import grpc

from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc

# Snapshots are sent whole for now, so the channel must carry a full model + optimizer state.
MAX_MESSAGE_BYTES = 512 * 1024 * 1024

RESTORE_DEADLINE_S = 120.0  # the agent may fetch the blob from a peer first
SNAPSHOT_DEADLINE_S = 120.0
REPORT_DEADLINE_S = 30.0

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class AgentLinkError(RuntimeError):
    """A call to the local agent failed; `retryable` says whether trying again may help."""

    def __init__(self, address: str, method: str, code: grpc.StatusCode | None, detail: str):
        self.address = address
        self.method = method
        self.code = code
        self.retryable = code in _RETRYABLE
        code_name = code.name if code is not None else "UNKNOWN"
        super().__init__(f"agent at {address!r}: {method} failed with {code_name}: {detail}")


class AgentClient:
    """Blocking TrainerLink calls to the agent at `address` (a gRPC target, e.g. unix:/path)."""

    def __init__(self, address: str) -> None:
        if not address:
            raise ValueError("agent address is empty (FTSUP_AGENT_ADDRESS not set?)")
        self.address = address
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = peer_pb2_grpc.TrainerLinkStub(self._channel)

    def get_restore(self, rank: int, generation: int) -> peer_pb2.GetRestoreResponse:
        request = peer_pb2.GetRestoreRequest(rank=rank, generation=generation)
        return self._call("GetRestore", self._stub.GetRestore, request, RESTORE_DEADLINE_S)

    def report_step(self, report: agent_pb2.StepReport) -> peer_pb2.LinkAck:
        """The agent's answer carries the checkpoint steps requested off the cadence."""
        return self._call("ReportStep", self._stub.ReportStep, report, REPORT_DEADLINE_S)

    def put_snapshot(self, blob: peer_pb2.SnapshotBlob) -> None:
        request = peer_pb2.PutSnapshotRequest(blob=blob)
        self._call("PutSnapshot", self._stub.PutSnapshot, request, SNAPSHOT_DEADLINE_S)

    def report_finished(self, finished: agent_pb2.RankFinished) -> None:
        self._call("ReportFinished", self._stub.ReportFinished, finished, REPORT_DEADLINE_S)

    def report_checkpoint_shard(self, shard: agent_pb2.CheckpointShard) -> None:
        self._call("ReportCheckpointShard", self._stub.ReportCheckpointShard, shard, REPORT_DEADLINE_S)

    def await_generation(self, generation: int, rank: int, wait_s: float) -> peer_pb2.AwaitGenerationResponse:
        """Blocks until the agent gives this process the next generation's rank, or says no."""
        request = peer_pb2.AwaitGenerationRequest(generation=generation, rank=rank, wait_s=wait_s)
        return self._call("AwaitGeneration", self._stub.AwaitGeneration, request, wait_s + REPORT_DEADLINE_S)

    def watch_generation(self, generation: int, rank: int, deadline_s: float) -> None:
        """Returns once the agent replaced `generation` (raises AgentLinkError at the deadline)."""
        request = peer_pb2.WatchGenerationRequest(generation=generation, rank=rank)
        self._call("WatchGeneration", self._stub.WatchGeneration, request, deadline_s)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, fn, request, deadline_s: float):
        try:
            # wait_for_ready: ride out a socket that is still coming up, within the deadline.
            return fn(request, timeout=deadline_s, wait_for_ready=True)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise AgentLinkError(self.address, method, code, detail or "") from exc
