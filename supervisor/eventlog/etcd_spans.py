"""Spans: one etcd value holding every record of one append, so any append is one transaction.

etcd refuses a transaction of more than `--max-txn-ops` operations (128 by default). A decision
the core makes atomically can be longer than that: a Tick that judges a rack or a switch lost
writes NodeDeclaredDead, GenerationEnded and NodeQuarantined for each of its nodes, then
GenerationStarted. Splitting it over several transactions would leave a half-committed decision
(deaths without the GenerationEnded) that no later leader repairs. So an append with more records
than fit one per key stores them all as one span value, under the key of its LAST seq: a ranged
read from any seq inside it (`log/<seq>` onwards) still reaches it, and a compaction that deletes
keys up to a seq inside it keeps it.

Value format (a marker no Record proto can start with: 'F' = tag of field 8 with wire type 6,
which does not exist; and distinct from the blob pointer's marker):
    b"FTSUP-SPAN/1 " + b"<first seq> <count>\\n" + count x (4-byte big-endian length + Record proto)
A span larger than a chunk goes out of line like any large value: the key holds a pointer whose
chunks, joined, are the span. Logs written before spans (one record per key) read unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

SPAN_MAGIC = b"FTSUP-SPAN/1 "
_LENGTH = struct.Struct(">I")
_MAX_HEADER = 64  # the decimal header line, bounded before it is parsed


class SpanFormatError(ValueError):
    """A value that starts like a span but is not a well-formed one."""


def is_span(value: bytes) -> bool:
    return value.startswith(SPAN_MAGIC)


def encode_span(first_seq: int, records: Sequence[bytes]) -> bytes:
    """`records` (serialized Record protos of seqs first_seq, first_seq + 1, ...) as one value."""
    if first_seq < 1 or not records:
        raise ValueError(f"a span needs a first seq >= 1 and records, got {first_seq} and {len(records)}")
    parts = [SPAN_MAGIC, b"%d %d\n" % (first_seq, len(records))]
    for record in records:
        parts.append(_LENGTH.pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def decode_span(value: bytes) -> tuple[int, list[bytes]]:
    """(first seq, the serialized records) of a span value; SpanFormatError if it is malformed."""
    if not is_span(value):
        raise SpanFormatError(f"not a span value: {value[:40]!r}")
    start = len(SPAN_MAGIC)
    newline = value.find(b"\n", start, start + _MAX_HEADER)
    try:
        if newline < 0:
            raise ValueError("no header line")
        first_text, count_text = value[start:newline].split(b" ")
        first_seq, count = int(first_text), int(count_text)
    except ValueError as exc:
        raise SpanFormatError(f"malformed span header {value[start:start + _MAX_HEADER]!r}: {exc}") from exc
    if first_seq < 1 or count < 1:
        raise SpanFormatError(f"span header names first seq {first_seq} and {count} records")
    records: list[bytes] = []
    at = newline + 1
    for index in range(count):
        if at + _LENGTH.size > len(value):
            raise SpanFormatError(f"span from seq {first_seq} ends after {index} of {count} records")
        (length,) = _LENGTH.unpack_from(value, at)
        at += _LENGTH.size
        if at + length > len(value):
            raise SpanFormatError(f"span from seq {first_seq}: record {index} runs past the value's end")
        records.append(value[at : at + length])
        at += length
    if at != len(value):
        raise SpanFormatError(f"span from seq {first_seq} has {len(value) - at} bytes after its {count} records")
    return first_seq, records
