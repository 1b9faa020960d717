"""Snapshot chunk streams on the wire (peer.proto `SnapshotChunk`) to and from the snapshot store.

Owns the reading and writing of chunk streams for every agent endpoint (TrainerLink, AgentPeer)
and the peer client: a stream is read into an `Incoming` (bytes land in the store's buffer as
they arrive) and is kept only when it ended properly - one header first, the closing SHA-256
last, nothing after it, exactly the declared bytes; anything else raises an `InvalidSnapshot`
(the store has already discarded the partial bytes). Outgoing streams are sliced from a held
blob or from a snapshot still arriving (`Incoming.follow`), one chunk in flight at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from ftsup.agent.snapshots import Blob, Incoming, SnapshotId
from ftsup.common.chunks import CHUNK_BYTES, InvalidSnapshot, spans
from ftsup.v1 import peer_pb2

# context.read / call.read: a SnapshotChunk, or grpc.aio.EOF once the stream ended. A stream is read
# while what arrives is a chunk (isinstance narrows it; grpc-stubs 1.53 does not declare EOF).
Read = Callable[[], Awaitable[object]]
Write = Callable[[peer_pb2.SnapshotChunk], Awaitable[None]]


def header_of(ident: SnapshotId, size_bytes: int) -> peer_pb2.SnapshotHeader:
    return peer_pb2.SnapshotHeader(generation=ident.generation, rank=ident.rank, step=ident.step,
                                   owner_node_id=ident.owner_node_id, size_bytes=size_bytes)


def ident_of(header: peer_pb2.SnapshotHeader, owner_node_id: str = "") -> SnapshotId:
    """The snapshot a header names (`owner_node_id` stands in when the header leaves it empty)."""
    return SnapshotId(header.generation, header.rank, header.step, header.owner_node_id or owner_node_id)


def opening_chunk(first: object) -> peer_pb2.SnapshotChunk:
    """A stream's first message, checked to be a chunk carrying the header; InvalidSnapshot when
    the stream is empty (EOF) or its first chunk has no header."""
    if not isinstance(first, peer_pb2.SnapshotChunk):
        raise InvalidSnapshot("snapshot stream ended before its first chunk")
    if not first.HasField("header"):
        raise InvalidSnapshot("snapshot stream's first chunk carries no header")
    return first


async def receive(first: peer_pb2.SnapshotChunk, read: Read, incoming: Incoming) -> Blob:
    """Feeds `first` and the messages `read` returns into `incoming` until the stream ends.

    Returns the verified blob (in the store when `incoming` came from one). Raises InvalidSnapshot
    for a truncated, oversized or repeated-header stream, data after the SHA-256, a size or hash
    mismatch; `incoming` is discarded then, and also when the read fails or is cancelled.
    """
    message: object = first
    sha256 = ""
    try:
        while isinstance(message, peer_pb2.SnapshotChunk):  # until EOF
            if sha256:
                raise InvalidSnapshot(f"{incoming.ident.describe()}: a chunk arrived after the one carrying the sha256")
            if message is not first and message.HasField("header"):
                raise InvalidSnapshot(f"{incoming.ident.describe()}: a second header in the stream")
            if message.data:
                incoming.add(message.data)
            sha256 = message.sha256
            message = await read()
        if not sha256:
            raise incoming.truncated()
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
        message = peer_pb2.SnapshotChunk(data=bytes(piece), sha256=sha256)  # protobuf takes bytes only
        if is_first:
            message.header.CopyFrom(header)
            is_first = False
        await write(message)


async def send_blob(write: Write, blob: Blob, chunk_bytes: int = CHUNK_BYTES) -> None:
    await send(write, header_of(blob.ident, blob.size_bytes), held_pieces(blob, chunk_bytes))
