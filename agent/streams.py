"""Snapshot chunk streams on the wire (peer.proto `SnapshotChunk`) to and from the snapshot store.

Owns the reading and writing of chunk streams for every agent endpoint (TrainerLink, AgentPeer)
and the peer client: a stream is read into an `Incoming` (bytes land in the store's buffer as
they arrive) and is kept only when it ended properly - one header first, the closing SHA-256
last, nothing after it, exactly the declared bytes; anything else raises an `InvalidSnapshot`
(the store has already discarded the partial bytes). Outgoing streams are sliced from a held
blob or from a snapshot still arriving (`Incoming.follow`), one chunk in flight at a time.
Chunks are encoded and decoded by common/chunk_wire.py (no protobuf copies of the payload): the
servers register their snapshot methods with `add_peer_service` / `add_trainer_link`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from ftsup.agent.snapshots import Blob, Incoming, SnapshotId
from ftsup.common import chunk_wire
from ftsup.common.chunk_wire import Chunk, as_chunk
from ftsup.common.chunks import CHUNK_BYTES, InvalidSnapshot, spans
from ftsup.v1 import peer_pb2, peer_pb2_grpc

# context.read / call.read: a Chunk (a SnapshotChunk from a server registered with the generated
# codec), or grpc.aio.EOF once the stream ended. A stream is read while what arrives is a chunk.
Read = Callable[[], Awaitable[object]]
Write = Callable[[Chunk], Awaitable[None]]


def add_peer_service(servicer: peer_pb2_grpc.AgentPeerServicer, server: grpc.aio.Server) -> None:
    """AgentPeer on `server`, its snapshot streams with the chunk codec (common/chunk_wire.py)."""
    chunk_wire.add_servicer(peer_pb2_grpc.add_AgentPeerServicer_to_server, servicer, server)


def add_trainer_link(servicer: peer_pb2_grpc.TrainerLinkServicer, server: grpc.aio.Server) -> None:
    """TrainerLink on `server`, its snapshot streams with the chunk codec (common/chunk_wire.py)."""
    chunk_wire.add_servicer(peer_pb2_grpc.add_TrainerLinkServicer_to_server, servicer, server)


def header_of(ident: SnapshotId, size_bytes: int) -> peer_pb2.SnapshotHeader:
    return peer_pb2.SnapshotHeader(generation=ident.generation, rank=ident.rank, step=ident.step,
                                   owner_node_id=ident.owner_node_id, size_bytes=size_bytes)


def ident_of(header: peer_pb2.SnapshotHeader, owner_node_id: str = "") -> SnapshotId:
    """The snapshot a header names (`owner_node_id` stands in when the header leaves it empty)."""
    return SnapshotId(header.generation, header.rank, header.step, header.owner_node_id or owner_node_id)


def opening_chunk(first: object) -> tuple[Chunk, peer_pb2.SnapshotHeader]:
    """A stream's first message, checked to be a chunk carrying the header, and that header;
    InvalidSnapshot when the stream is empty (EOF) or its first chunk has no header."""
    chunk = as_chunk(first)
    if chunk is None:
        raise InvalidSnapshot("snapshot stream ended before its first chunk")
    if chunk.header is None:
        raise InvalidSnapshot("snapshot stream's first chunk carries no header")
    return chunk, chunk.header


async def receive(first: Chunk, read: Read, incoming: Incoming) -> Blob:
    """Feeds `first` and the messages `read` returns into `incoming` until the stream ends.

    Returns the verified blob (in the store when `incoming` came from one). Raises InvalidSnapshot
    for a truncated, oversized or repeated-header stream, data after the SHA-256, a size or hash
    mismatch; `incoming` is discarded then, and also when the read fails or is cancelled.
    """
    chunk: Chunk | None = first
    sha256 = ""
    try:
        while chunk is not None:  # until EOF
            if sha256:
                raise InvalidSnapshot(f"{incoming.ident.describe()}: a chunk arrived after the one carrying the sha256")
            if chunk is not first and chunk.header is not None:
                raise InvalidSnapshot(f"{incoming.ident.describe()}: a second header in the stream")
            for part in chunk_wire.parts(chunk):
                if part:
                    incoming.add(part)
            sha256 = chunk.sha256
            chunk = as_chunk(await read())
        if not sha256:
            raise incoming.truncated()
        await incoming.hashed()  # the hashing lane (off the event loop) caught up with the bytes
        return incoming.finish(sha256)
    except InvalidSnapshot as exc:
        incoming.discard(exc)
        raise
    except BaseException:  # the sender died, the deadline passed, the call was cancelled
        incoming.truncated()
        raise


async def held_pieces(blob: Blob, chunk_bytes: int = CHUNK_BYTES) -> AsyncIterator[tuple[memoryview, str]]:
    """A held (verified) blob as `cut` would slice it, with its known SHA-256: no hashing pass."""
    view = memoryview(blob.payload).cast("B")
    bounds = spans(len(view), chunk_bytes)
    for index, (start, end) in enumerate(bounds):
        yield view[start:end], blob.sha256 if index == len(bounds) - 1 else ""


async def send(write: Write, header: peer_pb2.SnapshotHeader, pieces: AsyncIterator[tuple[memoryview, str]],
               *, header_sent: bool = False) -> None:
    """Writes the header with the first piece, then one message per piece (each write waits for
    the transport: one chunk in flight, so memory stays bounded however slow the receiver is).
    `header_sent`: the header went out alone already (a handshake); only the pieces follow."""
    is_first = not header_sent
    async for piece, sha256 in pieces:
        # A view of the payload: the codec copies it once, into the message's wire bytes.
        await write(Chunk(header if is_first else None, piece, sha256))
        is_first = False


async def send_blob(write: Write, blob: Blob, chunk_bytes: int = CHUNK_BYTES) -> None:
    await send(write, header_of(blob.ident, blob.size_bytes), held_pieces(blob, chunk_bytes))
