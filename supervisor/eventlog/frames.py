"""Record framing on disk: u32 length, u32 CRC-32C of the payload, payload.

`scan` walks a buffer of frames and stops at the first frame that is incomplete or fails its
check, saying where; whether that is a torn tail (a crash mid-write: truncate) or corruption
(good frames follow: refuse) is the caller's judgement, with `has_frame_after` as the evidence.

No record is empty, so a frame of length 0 is never valid. This matters because CRC-32C of no
bytes is 0: without the rule, a zero-filled tail (what some file systems expose after power loss:
the size grew, the data never landed) would read as a run of valid empty frames.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

HEADER = struct.Struct("<II")
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
RECORD_FIRST_BYTE = b"\x08"  # protobuf tag of Record.seq (field 1, varint)


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def frame(payload: bytes) -> bytes:
    if not payload:
        raise ValueError("an empty record cannot be framed (a zero-length frame reads as zeroed bytes)")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit")
    return HEADER.pack(len(payload), google_crc32c.value(payload)) + payload


@dataclass(frozen=True, slots=True)
class ScanResult:
    payloads: list[bytes]
    good_end: int  # offset just past the last good frame
    problem: str  # why scanning stopped before the end; empty when it reached the end cleanly


def scan(data: bytes, start: int = 0) -> ScanResult:
    payloads: list[bytes] = []
    offset = start
    end = len(data)
    while offset < end:
        if offset + HEADER.size > end:
            return ScanResult(payloads, offset, "incomplete frame header")
        length, crc = HEADER.unpack_from(data, offset)
        body = offset + HEADER.size
        if length == 0:
            return ScanResult(payloads, offset, "zero-length frame (zeroed bytes)")
        if length > MAX_PAYLOAD_BYTES:
            return ScanResult(payloads, offset, f"frame length {length} is beyond the limit")
        if body + length > end:
            return ScanResult(payloads, offset, "incomplete frame body")
        payload = data[body : body + length]
        if google_crc32c.value(payload) != crc:
            return ScanResult(payloads, offset, "CRC-32C mismatch")
        payloads.append(payload)
        offset = body + length
    return ScanResult(payloads, offset, "")


def has_frame_after(data: bytes, offset: int) -> bool:
    """Whether a well-formed frame starts anywhere after `offset`.

    Every payload is an `ftsup.v1.Record` whose first byte is the tag of its non-zero `seq`
    (0x08), so only positions 8 bytes before a 0x08 byte can start a frame: C-speed hops.
    """
    pos = data.find(RECORD_FIRST_BYTE, offset + 1 + HEADER.size)
    while pos != -1:
        candidate = pos - HEADER.size
        length, crc = HEADER.unpack_from(data, candidate)
        if (0 < length <= MAX_PAYLOAD_BYTES and pos + length <= len(data)
                and google_crc32c.value(data[pos : pos + length]) == crc):
            return True
        pos = data.find(RECORD_FIRST_BYTE, pos + 1)
    return False
