"""The trainer's gRPC link to its node's agent (service TrainerLink in peer.proto).

Owns the channel, its message-size limits and per-call deadlines, the snapshot chunk streams in
both directions (common/chunks.py: ~4 MiB slices; common/chunk_wire.py: each slice copied once,
into its message), and translates every gRPC failure
into `AgentLinkError` naming the agent address and the call, so a training script never sees raw
grpc exceptions. Blocking calls only; `session.py` decides what runs in the background.
An outgoing snapshot's SHA-256 is computed by a second thread while the chunks go out (hashlib lets
go of the GIL), and carried by the last chunk; an incoming one is checked while it lands.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import grpc

from ftsup.common import chunk_wire
from ftsup.common.chunk_wire import Buffer, Chunk, as_chunk
from ftsup.common.chunks import (
    CHUNK_BYTES,
    HASH_SLICE_BYTES,
    Assembly,
    InvalidSnapshot,
    cut_parts,
    spans,
    stream_deadline_s,
)
from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc

# Snapshots travel in chunks, so no message comes near this (the agent's endpoints use the same).
MAX_MESSAGE_BYTES = 2 * CHUNK_BYTES

RESTORE_DEADLINE_S = 300.0  # the agent may fetch the snapshot from a peer first, then streams it
SNAPSHOT_EXTRA_S = 60.0  # on top of the stream's own deadline: the agent answers once the buddy holds it
REPORT_DEADLINE_S = 30.0


@dataclass(frozen=True, slots=True)
class HeldSnapshot:
    """A snapshot the agent handed back; `payload` matched `sha256` as it streamed in."""

    generation: int
    rank: int
    step: int
    owner_node_id: str
    sha256: str
    payload: memoryview

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

    def __init__(
        self, address: str, *, chunk_bytes: int = CHUNK_BYTES, max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        if not address:
            raise ValueError("agent address is empty (FTSUP_AGENT_ADDRESS not set?)")
        self.address = address
        self._chunk_bytes = chunk_bytes
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", max_message_bytes),
            ],
        )
        self._stub = peer_pb2_grpc.TrainerLinkStub(self._channel)
        # The snapshot streams, through the chunk codec (the other calls keep the generated stub's).
        self._put_snapshot = chunk_wire.stream_unary(self._channel, f"{_LINK}/PutSnapshot", peer_pb2.LinkAck)
        self._get_restore = chunk_wire.unary_stream(self._channel, f"{_LINK}/GetRestore", peer_pb2.GetRestoreRequest)

    def get_restore(self, rank: int, generation: int) -> HeldSnapshot | None:
        """The rank's snapshot (None: start fresh), verified as it streams in.

        Raises AgentLinkError when the call fails, InvalidSnapshot when the stream is malformed
        (truncated, oversized, a size or hash mismatch).
        """
        request = peer_pb2.GetRestoreRequest(rank=rank, generation=generation)
        messages = self._get_restore(request, timeout=RESTORE_DEADLINE_S, wait_for_ready=True)
        try:
            return _assemble(messages)
        except grpc.RpcError as exc:
            raise self._error("GetRestore", exc) from exc
        except InvalidSnapshot:
            messages.cancel()  # the rest of a bad stream is not worth receiving
            raise

    def report_step(self, report: agent_pb2.StepReport) -> peer_pb2.LinkAck:
        """The agent's answer carries the checkpoint steps requested off the cadence."""
        return self._call("ReportStep", self._stub.ReportStep, report, REPORT_DEADLINE_S)

    def report_steps(self, reports: list[agent_pb2.StepReport]) -> peer_pb2.LinkAck:
        """Several step reports of this rank in one call (an agent older than ReportSteps answers
        UNIMPLEMENTED: send them one by one then)."""
        request = peer_pb2.StepReports(reports=reports)
        return self._call("ReportSteps", self._stub.ReportSteps, request, REPORT_DEADLINE_S)

    def put_snapshot(self, header: peer_pb2.SnapshotHeader, payload: bytes | memoryview) -> str:
        """Streams `payload` (the snapshot `header` names; its size is filled in) to the agent and
        returns its hex SHA-256, once the agent and its buddy hold it."""
        return self.put_snapshot_parts(header, (payload,))

    def put_snapshot_parts(self, header: peer_pb2.SnapshotHeader, parts: Sequence[Buffer]) -> str:
        """`put_snapshot` of the payload `parts` make back to back, never joined: each chunk's
        slices are copied once, into its message. The parts must not change until this returns."""
        views = [memoryview(part).cast("B") for part in parts]
        size = sum(len(view) for view in views)
        opening = peer_pb2.SnapshotHeader()
        opening.CopyFrom(header)
        opening.size_bytes = size
        last = len(spans(size, self._chunk_bytes)) - 1
        stop = threading.Event()
        digest = _hash_in_background(views, stop)

        def chunks() -> Iterator[Chunk]:
            # Pulled by gRPC one message at a time: one ~4 MiB message of the payload exists at once.
            for index, pieces in enumerate(cut_parts(views, self._chunk_bytes)):
                yield Chunk(opening if index == 0 else None, pieces, digest.result() if index == last else "")

        deadline_s = stream_deadline_s(size) + SNAPSHOT_EXTRA_S
        try:
            self._call("PutSnapshot", self._put_snapshot, chunks(), deadline_s)
        finally:
            stop.set()  # a failed call: the hashing thread stops at its next slice
        return digest.result()

    def report_liveness(self, report: peer_pb2.LivenessReport) -> None:
        self._call("ReportLiveness", self._stub.ReportLiveness, report, REPORT_DEADLINE_S)

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
            raise self._error(method, exc) from exc

    def _error(self, method: str, exc: grpc.RpcError) -> AgentLinkError:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        return AgentLinkError(self.address, method, code, detail or "")


_LINK = "/" + peer_pb2.DESCRIPTOR.services_by_name["TrainerLink"].full_name


def _hash_in_background(views: Sequence[memoryview], stop: threading.Event) -> Future[str]:
    """The hex SHA-256 of the payload `views` make, computed on a thread of its own; the thread
    gives up (the future fails) once `stop` is set."""
    result: Future[str] = Future()

    def run() -> None:
        try:
            digest = hashlib.sha256()
            for view in views:
                for start in range(0, len(view), HASH_SLICE_BYTES):
                    if stop.is_set():
                        raise RuntimeError("the snapshot stream ended before its payload was hashed")
                    digest.update(view[start:start + HASH_SLICE_BYTES])
            result.set_result(digest.hexdigest())
        except BaseException as exc:
            result.set_exception(exc)

    threading.Thread(target=run, name="ftsup-snapshot-sha256", daemon=True).start()
    return result


def _assemble(messages: Iterable[object]) -> HeldSnapshot | None:
    """A GetRestore stream put back together; None when it carries no chunk at all (start fresh)."""
    assembly: Assembly | None = None
    header = peer_pb2.SnapshotHeader()
    sha256 = ""
    for message in messages:
        chunk = as_chunk(message)
        if chunk is None:
            raise InvalidSnapshot(f"restore stream carried a {type(message).__name__}, not a snapshot chunk")
        if assembly is None:
            if chunk.header is None:
                raise InvalidSnapshot("restore stream's first chunk carries no header")
            header = chunk.header
            what = f"snapshot of rank {header.rank} step {header.step} (generation {header.generation})"
            # Bounded by this machine's RAM: a declared size beyond it is refused before allocating.
            assembly = Assembly(what, header.size_bytes, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        elif chunk.header is not None:
            raise InvalidSnapshot(f"{assembly.what}: a second header in the stream")
        if sha256:
            raise InvalidSnapshot(f"{assembly.what}: a chunk arrived after the one carrying the sha256")
        for part in chunk_wire.parts(chunk):
            assembly.add(part)
        sha256 = chunk.sha256
    if assembly is None:
        return None
    if not sha256:
        raise assembly.truncated()
    payload = assembly.finish(sha256)
    return HeldSnapshot(header.generation, header.rank, header.step, header.owner_node_id, sha256.lower(), payload)
