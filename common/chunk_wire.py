"""`SnapshotChunk` messages (peer.proto) to and from their wire bytes without protobuf's copies.

Every snapshot hop moves its payload as SnapshotChunk messages. Built and parsed by the generated
protobuf code, each chunk's data was copied three times on the way out (a `bytes` of the slice,
into the message, into the serialized string) and twice on the way in (into the parsed message,
out of it as `bytes`): at ~4 MiB a chunk those copies, not the transport, set the rate. This
module writes the same wire bytes with one copy (`encode`: the field tags and lengths joined with
the payload's slices) and parses them with none (`decode`: the data is a view of the received
message). The bytes are exactly what protobuf writes (fields in number order, none at its default
left out), so either end may still use the generated code: both parse the other's messages.

The snapshot-stream methods (TrainerLink.PutSnapshot and GetRestore, AgentPeer.StoreSnapshot and
FetchSnapshot) use it on both ends: servers register them with `add_servicer` (every other method
of the service keeps the generated codec), clients call them through `stream_unary` /
`unary_stream`. Integrity is not this module's business: every receiver still checks the declared
size and the SHA-256 of what arrived (common/chunks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ftsup.v1 import peer_pb2

Buffer = bytes | bytearray | memoryview
_HEADER_TAG = b"\x0a"  # field 1 (header), wire type 2 (length-delimited)
_DATA_TAG = b"\x12"  # field 2 (data)
_SHA256_TAG = b"\x1a"  # field 3 (sha256)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One SnapshotChunk: `header` on the first only (None elsewhere), then the next slice of the
    payload, and the hex SHA-256 on the last. Decoded, `data` is one view of the received message;
    to be encoded it may also be a tuple of buffers sent back to back (one chunk's slices of a
    payload kept in several buffers), never copied before the single join in `encode`."""

    header: peer_pb2.SnapshotHeader | None = None
    data: Buffer | tuple[Buffer, ...] = b""
    sha256: str = ""

    @property
    def size(self) -> int:
        """Payload bytes the chunk carries."""
        return sum(_nbytes(part) for part in parts(self))


def parts(chunk: Chunk) -> tuple[Buffer, ...]:
    """The buffers a chunk's data is made of, in order (one, for a decoded chunk)."""
    return chunk.data if isinstance(chunk.data, tuple) else (chunk.data,)


def as_chunk(message: object) -> Chunk | None:
    """A received message as a Chunk (a generated SnapshotChunk is converted), None when it is not a
    chunk at all (grpc.aio.EOF: the stream ended)."""
    if isinstance(message, Chunk):
        return message
    if isinstance(message, peer_pb2.SnapshotChunk):
        return Chunk(message.header if message.HasField("header") else None, message.data, message.sha256)
    return None


def encode(message: Chunk | peer_pb2.SnapshotChunk) -> bytes:
    """The wire bytes of `message`: as SnapshotChunk.SerializeToString() would write them, with the
    payload copied once (a generated SnapshotChunk is serialized by protobuf itself)."""
    if isinstance(message, peer_pb2.SnapshotChunk):
        return message.SerializeToString()
    out: list[Buffer] = []
    if message.header is not None:
        header = message.header.SerializeToString()
        out += (_HEADER_TAG, _varint(len(header)), header)
    data = parts(message)
    size = sum(_nbytes(part) for part in data)
    if size:
        out += (_DATA_TAG, _varint(size), *data)
    if message.sha256:
        sha256 = message.sha256.encode()
        out += (_SHA256_TAG, _varint(len(sha256)), sha256)
    return b"".join(out)


def decode(raw: bytes) -> Chunk:
    """A SnapshotChunk's wire bytes as a Chunk whose data is a view of `raw` (no copy).

    Parsed as protobuf does: fields in any order, the last of a repeated singular field wins,
    repeated headers merge, unknown fields are skipped. Raises DecodeError on malformed bytes
    (gRPC then fails the call, as it would with the generated parser).
    """
    view = memoryview(raw)
    size = len(raw)
    header: peer_pb2.SnapshotHeader | None = None
    data: Buffer = b""
    sha256 = ""
    pos = 0
    while pos < size:
        key, pos = _read_varint(raw, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise DecodeError("SnapshotChunk: field number 0")
        if wire_type == 2:
            length, pos = _read_varint(raw, pos)
            end = pos + length
            if end > size:
                raise DecodeError(f"SnapshotChunk: field {field} runs {end - size} bytes past the message")
            if field == 1:
                if header is None:
                    header = peer_pb2.SnapshotHeader()
                header.MergeFromString(raw[pos:end])
            elif field == 2:
                data = view[pos:end]
            elif field == 3:
                try:
                    sha256 = str(raw[pos:end], "utf-8")
                except UnicodeDecodeError as exc:
                    raise DecodeError(f"SnapshotChunk: sha256 is not UTF-8: {exc}") from exc
            pos = end
        elif wire_type == 0:
            _, pos = _read_varint(raw, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise DecodeError(f"SnapshotChunk: unsupported wire type {wire_type} (field {field})")
        if pos > size:
            raise DecodeError("SnapshotChunk: truncated message")
    return Chunk(header, data, sha256)


def add_servicer(add: Callable[[Any, Any], None], servicer: Any, server: Any) -> None:
    """Registers `servicer` on `server` (a grpc.aio.Server) as the generated
    `add_<Service>Servicer_to_server` would, except that its methods streaming SnapshotChunk
    messages (either way) use this module's codec."""
    capture = _Capture()
    add(servicer, capture)
    name, handlers = capture.service, dict(capture.handlers)
    chunk = peer_pb2.SnapshotChunk.DESCRIPTOR
    for method in peer_pb2.DESCRIPTOR.services_by_name[name.rpartition(".")[2]].methods:
        handler = handlers[method.name]
        if method.input_type is chunk:
            handler = handler._replace(request_deserializer=decode)
        if method.output_type is chunk:
            handler = handler._replace(response_serializer=encode)
        handlers[method.name] = handler
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


def stream_unary(channel: Any, method: str, response: type[Any]) -> Any:
    """A client-streaming multi-callable sending Chunks (or SnapshotChunks) with `encode`."""
    return channel.stream_unary(method, request_serializer=encode, response_deserializer=response.FromString,
                                _registered_method=True)


def unary_stream(channel: Any, method: str, request: type[Any]) -> Any:
    """A server-streaming multi-callable whose answers are decoded into Chunks."""
    return channel.unary_stream(method, request_serializer=request.SerializeToString, response_deserializer=decode,
                                _registered_method=True)


class _Capture:
    """Stands in for a server to read the handlers a generated `add_..._to_server` registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        pass  # the same handlers come again through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers


def _nbytes(buffer: Buffer) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw):
            raise DecodeError("SnapshotChunk: truncated varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise DecodeError("SnapshotChunk: varint longer than 10 bytes")
