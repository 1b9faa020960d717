"""Encoding the big records: a fleet-sized GenerationStarted and state snapshot, compiled adders against field-by-field.

The leader encodes every record it appends, on its loop. At 12,500 nodes x 8 ranks a
GenerationStarted carries 12,500 RankAssignments and 100,000 RankRestores, and the state snapshot
taken after it as many node and rank entries. The baseline, in the same run and process, is the
codec's field-by-field path for repeated items (one attribute set per field per item, as every
list was encoded before the compiled adders); both must produce the same bytes. Reported per
shape: median seconds to encode (to proto and serialized), the speed-up, the record's size, and
the decode time for reference. Prints one JSON object.

    ftsup bench codec --json                      # 12,500 nodes x 8 ranks
    ftsup bench codec --nodes 200 --quick --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from google.protobuf.message import Message

from ftsup.supervisor import codec
from ftsup.supervisor.core.events import (
    GenerationStarted,
    NodeRegistered,
    NodeRole,
    RankAssignment,
    RankRestore,
    Record,
    RestoreKind,
)
from ftsup.supervisor.core.evolve import apply_records
from ftsup.supervisor.core.state import ClusterState
from ftsup.v1 import events_pb2, state_pb2


def fleet_records(nodes: int, ranks_per_node: int) -> list[Record]:
    """The nodes register, then a generation restores every rank from its buddy's RAM."""
    ids = [f"node-{i:06d}" for i in range(nodes)]
    records = [Record(i + 1, 1, 0.0, NodeRegistered(node, 1, NodeRole.ACTIVE, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                                                       7071, ranks_per_node))
               for i, node in enumerate(ids)]
    members = tuple(RankAssignment(node, tuple(range(i * ranks_per_node, (i + 1) * ranks_per_node)), ids[(i + 1) % nodes])
                    for i, node in enumerate(ids))
    restores = tuple(RankRestore(rank, RestoreKind.PEER_SNAPSHOT, ids[(rank // ranks_per_node + 1) % nodes])
                     for rank in range(nodes * ranks_per_node))
    started = GenerationStarted(1, members, nodes * ranks_per_node, "10.0.0.1", 29500, 1000, 1, restores,
                                "node-000000 lost: restore from buddies")
    records.append(Record(nodes + 1, 1, 0.0, started))
    return records


def _field_by_field(message: Message, name: str, items: Sequence[Any]) -> None:
    target = getattr(message, name)
    for item in items:
        codec.to_proto(item, target.add())


@contextlib.contextmanager
def baseline_codec() -> Iterator[None]:
    """The codec with its repeated items encoded one field at a time (the baseline)."""
    compiled = codec._add_items
    codec._add_items = _field_by_field
    try:
        yield
    finally:
        codec._add_items = compiled


def _median_s(encode: Callable[[], bytes], repeat: int) -> tuple[float, bytes]:
    times = []
    wire = b""
    for _ in range(repeat):
        started = time.perf_counter()
        wire = encode()
        times.append(time.perf_counter() - started)
    return statistics.median(times), wire


def measure(name: str, encode: Callable[[], bytes], decode: Callable[[bytes], Any], repeat: int) -> dict[str, Any]:
    with baseline_codec():
        baseline_s, baseline_wire = _median_s(encode, repeat)
    compiled_s, wire = _median_s(encode, repeat)
    if wire != baseline_wire:
        raise AssertionError(f"{name}: the compiled encoding differs from the field-by-field one")
    started = time.perf_counter()
    decode(wire)
    return {
        "bytes": len(wire),
        "encode_s": round(compiled_s, 4),
        "baseline_encode_s": round(baseline_s, 4),
        "speedup": round(baseline_s / compiled_s, 2) if compiled_s else None,
        "decode_s": round(time.perf_counter() - started, 4),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    records = fleet_records(args.nodes, args.ranks_per_node)
    started = records[-1]
    state = apply_records(ClusterState(), records)
    return {
        "nodes": args.nodes,
        "ranks_per_node": args.ranks_per_node,
        "repeat": args.repeat,
        "generation_started": measure(
            "GenerationStarted", lambda: codec.record_to_proto(started).SerializeToString(),
            lambda wire: codec.record_from_proto(events_pb2.Record.FromString(wire)), args.repeat),
        "state_snapshot": measure(
            "ClusterState", lambda: codec.state_to_proto(state).SerializeToString(),
            lambda wire: codec.state_from_proto(state_pb2.ClusterState.FromString(wire)), args.repeat),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftsup bench codec", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5, help="encodings per path; the median is reported")
    parser.add_argument("--quick", action="store_true", help="one encoding per path, for tests")
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.ranks_per_node < 1 or args.repeat < 1:
        parser.error("--nodes must be >= 2, --ranks-per-node and --repeat >= 1")
    if args.quick:
        args.repeat = 1
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
