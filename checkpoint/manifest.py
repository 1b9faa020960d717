"""The checkpoint manifest and the keys a checkpoint lives under. Pure: no I/O, clock or randomness.

The manifest is the commit record: written last, conditionally, it names every object of the
checkpoint with its size and SHA-256, the topology that wrote it (world size, parallel degrees,
rank map, how the state is sharded) and the data and tokenizer versions. A checkpoint without a
valid manifest does not exist for readers. JSON, versioned by `format_version`; decoding is strict
and names the field at fault, since a reader must never act on a manifest it half understands.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ftsup.checkpoint.digest import Chunking, validate_digest
from ftsup.checkpoint.errors import IncompleteCheckpoint
from ftsup.checkpoint.store import ObjectInfo, join_key, validate_key

FORMAT_VERSION = 1
MANIFEST_NAME = "MANIFEST.json"
DCP_METADATA_NAME = ".metadata"
_CHECKPOINT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
_STEP_ID = re.compile(r"^step-(\d{10,})-")


class Sharding(enum.Enum):
    """How the saved state is laid out across ranks, which decides what DCP can reshard."""

    REPLICATED = "replicated"  # plain tensors, identical on every rank (DDP): any world size loads them
    DTENSOR = "dtensor"  # DTensor / FSDP2 / TP state: DCP maps shards onto any mesh
    MANUAL = "manual"  # per-rank tensors whose shapes depend on the tp/pp layout: only that layout loads them


@dataclass(frozen=True, slots=True)
class Topology:
    world_size: int
    dp: int
    tp: int = 1
    pp: int = 1
    rank_map: tuple[str, ...] = ()  # node id of each rank, index = rank; () when not recorded
    sharding: Sharding = Sharding.DTENSOR

    def __post_init__(self) -> None:
        for name in ("world_size", "dp", "tp", "pp"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Topology.{name} must be an integer >= 1, got {value!r}")
        if self.dp * self.tp * self.pp != self.world_size:
            raise ValueError(
                f"Topology degrees dp={self.dp} tp={self.tp} pp={self.pp} multiply to"
                f" {self.dp * self.tp * self.pp}, not world_size={self.world_size}"
            )
        if self.rank_map and len(self.rank_map) != self.world_size:
            raise ValueError(f"Topology.rank_map has {len(self.rank_map)} entries for world_size={self.world_size}")

    def describe(self) -> str:
        return f"world {self.world_size} (dp {self.dp}, tp {self.tp}, pp {self.pp}, {self.sharding.value})"


@dataclass(frozen=True, slots=True)
class Versions:
    """What the training data and tokenizer were when the state was saved (opaque caller strings)."""

    data_version: str
    tokenizer_version: str


@dataclass(frozen=True, slots=True)
class ShardIndex:
    """What one rank wrote for a checkpoint: stored as an object, reported to the supervisor."""

    checkpoint_id: str
    rank: int
    objects: tuple[ObjectInfo, ...]


@dataclass(frozen=True, slots=True)
class ShardReport:
    """A rank's report that its shard is written: its shard index object (mirrors CheckpointShardWritten)."""

    rank: int
    key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    checkpoint_id: str
    step: int
    topology: Topology
    versions: Versions
    chunking: Chunking
    shards: tuple[ShardReport, ...]
    objects: tuple[ObjectInfo, ...]
    commit_nonce: str  # unique per commit call: a second commit never writes identical bytes
    committed_at: str  # wall time stamped by the committing shell (ISO 8601), for operators only
    format_version: int = FORMAT_VERSION


# -- layout ----------------------------------------------------------------------------------------
def validate_checkpoint_id(checkpoint_id: str) -> str:
    if not isinstance(checkpoint_id, str) or not _CHECKPOINT_ID.match(checkpoint_id):
        raise ValueError(f"invalid checkpoint id {checkpoint_id!r}: use 1-128 of [A-Za-z0-9._-], not starting with . - _")
    return checkpoint_id


def checkpoint_id_for(step: int, nonce: str) -> str:
    """Ids that sort by step, so gc can tell an old abandoned attempt from a newer one in flight."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return validate_checkpoint_id(f"step-{step:010d}-{nonce}")


def step_of(checkpoint_id: str) -> int | None:
    match = _STEP_ID.match(checkpoint_id)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class Layout:
    """Keys of checkpoints under `prefix` ('' = bucket or directory root)."""

    prefix: str = "checkpoints"

    def __post_init__(self) -> None:
        if self.prefix:
            validate_key(self.prefix)

    def root(self) -> str:
        return f"{self.prefix.strip('/')}/" if self.prefix.strip("/") else ""

    def directory(self, checkpoint_id: str) -> str:
        return join_key(self.prefix, validate_checkpoint_id(checkpoint_id)) + "/"

    def manifest_key(self, checkpoint_id: str) -> str:
        return self.directory(checkpoint_id) + MANIFEST_NAME

    def data_key(self, checkpoint_id: str, name: str) -> str:
        return self.directory(checkpoint_id) + validate_key(name)

    def shard_index_key(self, checkpoint_id: str, rank: int) -> str:
        return self.directory(checkpoint_id) + f"shards/rank-{rank:05d}.json"

    def checkpoint_of(self, key: str) -> str | None:
        """The checkpoint id a key under the root belongs to, or None."""
        root = self.root()
        if not key.startswith(root):
            return None
        head, sep, _ = key[len(root):].partition("/")
        return head if sep and _CHECKPOINT_ID.match(head) else None


# -- pure checks -----------------------------------------------------------------------------------
def check_shard_reports(reports: Sequence[ShardReport], world_size: int, checkpoint_id: str,
                        layout: Layout) -> tuple[ShardReport, ...]:
    """Every rank reported exactly once, each naming its own shard index key; sorted by rank."""
    ranks = [r.rank for r in reports]
    missing = sorted(set(range(world_size)) - set(ranks))
    extra = sorted({r for r in ranks if not 0 <= r < world_size})
    duplicated = sorted({r for r in ranks if ranks.count(r) > 1})
    problems = []
    if missing:
        problems.append(f"no report from ranks {missing}")
    if extra:
        problems.append(f"reports from ranks {extra} outside world size {world_size}")
    if duplicated:
        problems.append(f"ranks {duplicated} reported twice")
    for report in reports:
        if 0 <= report.rank < world_size and report.key != layout.shard_index_key(checkpoint_id, report.rank):
            problems.append(f"rank {report.rank} reported key {report.key!r}, expected"
                            f" {layout.shard_index_key(checkpoint_id, report.rank)!r}")
    if problems:
        raise IncompleteCheckpoint(f"checkpoint {checkpoint_id!r} cannot commit: {'; '.join(problems)}")
    return tuple(sorted(reports, key=lambda r: r.rank))


def check_shard_indexes(indexes: Sequence[ShardIndex], checkpoint_id: str, layout: Layout) -> tuple[ObjectInfo, ...]:
    """All objects the ranks wrote: inside the checkpoint's directory, each written once, DCP metadata included."""
    directory = layout.directory(checkpoint_id)
    seen: dict[str, int] = {}
    problems = []
    for index in indexes:
        if index.checkpoint_id != checkpoint_id:
            problems.append(f"rank {index.rank}'s index is for checkpoint {index.checkpoint_id!r}")
        for obj in index.objects:
            if not obj.key.startswith(directory) or obj.key == layout.manifest_key(checkpoint_id):
                problems.append(f"rank {index.rank} wrote {obj.key!r} outside {directory!r}")
            elif obj.key in seen:
                problems.append(f"{obj.key!r} reported by ranks {seen[obj.key]} and {index.rank}")
            seen[obj.key] = index.rank
    if layout.data_key(checkpoint_id, DCP_METADATA_NAME) not in seen:
        problems.append("no rank wrote the DCP metadata object")
    if problems:
        raise IncompleteCheckpoint(f"checkpoint {checkpoint_id!r} cannot commit: {'; '.join(problems)}")
    return tuple(sorted((o for i in indexes for o in i.objects), key=lambda o: o.key))


def mismatch(expected: ObjectInfo, observed: ObjectInfo) -> str | None:
    """Why the stored object is not the one reported, or None when it is."""
    if expected.size_bytes != observed.size_bytes:
        return f"{expected.key!r} is {observed.size_bytes} bytes, reported {expected.size_bytes}"
    if expected.sha256 != observed.sha256:
        return f"{expected.key!r} has SHA-256 {observed.sha256}, reported {expected.sha256}"
    return None


# -- JSON codec ------------------------------------------------------------------------------------
def _obj(o: ObjectInfo) -> dict[str, Any]:
    return {"key": o.key, "size_bytes": o.size_bytes, "sha256": o.sha256}


def encode_shard_index(index: ShardIndex) -> bytes:
    body = {"format_version": FORMAT_VERSION, "checkpoint_id": index.checkpoint_id, "rank": index.rank,
            "objects": [_obj(o) for o in index.objects]}
    return json.dumps(body, sort_keys=True, indent=1).encode()


def encode_manifest(m: Manifest) -> bytes:
    t = m.topology
    body = {
        "format_version": m.format_version, "checkpoint_id": m.checkpoint_id, "step": m.step,
        "topology": {"world_size": t.world_size, "dp": t.dp, "tp": t.tp, "pp": t.pp,
                     "rank_map": list(t.rank_map), "sharding": t.sharding.value},
        "versions": {"data_version": m.versions.data_version, "tokenizer_version": m.versions.tokenizer_version},
        "chunking": {"multipart_threshold_bytes": m.chunking.multipart_threshold_bytes,
                     "part_size_bytes": m.chunking.part_size_bytes},
        "shards": [{"rank": s.rank, "key": s.key, "sha256": s.sha256, "size_bytes": s.size_bytes} for s in m.shards],
        "objects": [_obj(o) for o in m.objects],
        "commit_nonce": m.commit_nonce, "committed_at": m.committed_at,
    }
    return json.dumps(body, sort_keys=True, indent=1).encode()


class _Fields:
    """Typed access to a decoded JSON object that names the missing or mistyped field."""

    def __init__(self, where: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
        self.where, self.value = where, value

    def get(self, name: str, kind: type) -> Any:
        if name not in self.value:
            raise ValueError(f"{self.where}: missing field {name!r}")
        value = self.value[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{self.where}.{name}: expected {kind.__name__}, got {value!r}")
        return value

    def sub(self, name: str) -> _Fields:
        return _Fields(f"{self.where}.{name}", self.get(name, dict))


def _decode_object(where: str, raw: Any) -> ObjectInfo:
    f = _Fields(where, raw)
    return ObjectInfo(validate_key(f.get("key", str)), f.get("size_bytes", int), validate_digest(f.get("sha256", str)))


def _decode_json(where: str, data: bytes) -> _Fields:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from exc
    fields = _Fields(where, value)
    if fields.get("format_version", int) != FORMAT_VERSION:
        raise ValueError(f"{where}: format_version {fields.value['format_version']} is not {FORMAT_VERSION}")
    return fields


def decode_shard_index(data: bytes) -> ShardIndex:
    f = _decode_json("shard index", data)
    objects = tuple(_decode_object(f"shard index.objects[{i}]", o) for i, o in enumerate(f.get("objects", list)))
    return ShardIndex(validate_checkpoint_id(f.get("checkpoint_id", str)), f.get("rank", int), objects)


def decode_manifest(data: bytes) -> Manifest:
    """The manifest in `data`; ValueError naming the field when anything is missing or malformed."""
    f = _decode_json("manifest", data)
    t, v, c = f.sub("topology"), f.sub("versions"), f.sub("chunking")
    try:
        sharding = Sharding(t.get("sharding", str))
    except ValueError as exc:
        raise ValueError(f"manifest.topology.sharding: unknown {t.value['sharding']!r}") from exc
    topology = Topology(t.get("world_size", int), t.get("dp", int), t.get("tp", int), t.get("pp", int),
                        tuple(t.get("rank_map", list)), sharding)
    shards = []
    for i, raw in enumerate(f.get("shards", list)):
        s = _Fields(f"manifest.shards[{i}]", raw)
        shards.append(ShardReport(s.get("rank", int), validate_key(s.get("key", str)),
                                  validate_digest(s.get("sha256", str)), s.get("size_bytes", int)))
    objects = tuple(_decode_object(f"manifest.objects[{i}]", o) for i, o in enumerate(f.get("objects", list)))
    return Manifest(
        checkpoint_id=validate_checkpoint_id(f.get("checkpoint_id", str)), step=f.get("step", int),
        topology=topology,
        versions=Versions(v.get("data_version", str), v.get("tokenizer_version", str)),
        chunking=Chunking(c.get("multipart_threshold_bytes", int), c.get("part_size_bytes", int)),
        shards=tuple(shards), objects=objects,
        commit_nonce=f.get("commit_nonce", str), committed_at=f.get("committed_at", str),
    )
