"""The manifest and its pure checks: what may be committed, and what a reader accepts."""

from __future__ import annotations

import ast
import hashlib
import json
import pathlib

import pytest

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import IncompleteCheckpoint
from ftsup.checkpoint.manifest import (
    Layout,
    Manifest,
    ShardIndex,
    Sharding,
    ShardReport,
    Topology,
    Versions,
    check_shard_indexes,
    check_shard_reports,
    checkpoint_id_for,
    decode_manifest,
    decode_shard_index,
    encode_manifest,
    encode_shard_index,
    mismatch,
    step_of,
)
from ftsup.checkpoint.store import ObjectInfo

L = Layout("jobs/j1")
CID = checkpoint_id_for(42, "abc")
SHA = "ab" * 32


def report(rank: int) -> ShardReport:
    return ShardReport(rank, L.shard_index_key(CID, rank), SHA, 100)


def manifest() -> Manifest:
    objects = (ObjectInfo(L.data_key(CID, ".metadata"), 10, SHA), ObjectInfo(L.data_key(CID, "__0_0.distcp"), 99, SHA + "-3"))
    return Manifest(CID, 42, Topology(4, 2, 2, 1, ("n0", "n0", "n1", "n1"), Sharding.DTENSOR), Versions("d7", "t3"),
                    digest.Chunking(), (report(0), report(1), report(2), report(3)), objects, "nonce", "2026-01-01T00:00:00Z")


def test_manifest_round_trips_through_json():
    assert decode_manifest(encode_manifest(manifest())) == manifest()


def test_shard_index_round_trips_through_json():
    index = ShardIndex(CID, 3, (ObjectInfo(L.data_key(CID, "__3_0.distcp"), 5, SHA),))
    assert decode_shard_index(encode_shard_index(index)) == index


@pytest.mark.parametrize("path, value, message", [
    (("topology", "world_size"), "4", "manifest.topology.world_size: expected int"),
    (("versions",), None, "manifest.versions: expected dict"),
    (("objects", 0, "sha256"), "nope", "not a SHA-256"),
    (("objects", 1, "key"), "../x", "invalid object key"),
    (("format_version",), 2, "format_version 2"),
    (("topology", "sharding"), "weird", "unknown 'weird'"),
])
def test_a_malformed_manifest_is_rejected_naming_the_field(path, value, message):
    body = json.loads(encode_manifest(manifest()))
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=message):
        decode_manifest(json.dumps(body).encode())


def test_a_manifest_missing_a_field_names_it():
    body = json.loads(encode_manifest(manifest()))
    del body["topology"]["dp"]
    with pytest.raises(ValueError, match="manifest.topology: missing field 'dp'"):
        decode_manifest(json.dumps(body).encode())


def test_topology_degrees_must_multiply_to_the_world_size():
    with pytest.raises(ValueError, match="dp=2 tp=2 pp=2 multiply to 8, not world_size=4"):
        Topology(4, 2, 2, 2)
    with pytest.raises(ValueError, match="rank_map has 1 entries for world_size=2"):
        Topology(2, 2, rank_map=("n0",))


def test_checkpoint_ids_sort_by_step_and_reveal_it():
    assert step_of(checkpoint_id_for(7, "x")) == 7
    assert checkpoint_id_for(9, "z") < checkpoint_id_for(10, "a")
    assert step_of("hand-made") is None
    with pytest.raises(ValueError, match=r"invalid checkpoint id 'step-0000000001-/\.\./up'"):
        checkpoint_id_for(1, "/../up")


def test_every_rank_must_report_exactly_once_with_its_own_key():
    assert [r.rank for r in check_shard_reports([report(1), report(0)], 2, CID, L)] == [0, 1]
    with pytest.raises(IncompleteCheckpoint, match=r"no report from ranks \[2, 3\]"):
        check_shard_reports([report(0), report(1)], 4, CID, L)
    with pytest.raises(IncompleteCheckpoint, match=r"ranks \[0\] reported twice"):
        check_shard_reports([report(0), report(0), report(1)], 2, CID, L)
    with pytest.raises(IncompleteCheckpoint, match="rank 1 reported key 'elsewhere'"):
        check_shard_reports([report(0), ShardReport(1, "elsewhere", SHA, 1)], 2, CID, L)


def test_shard_indexes_must_stay_inside_the_checkpoint_and_include_the_dcp_metadata():
    meta = ObjectInfo(L.data_key(CID, ".metadata"), 1, SHA)
    data0 = ObjectInfo(L.data_key(CID, "__0_0.distcp"), 1, SHA)
    assert check_shard_indexes([ShardIndex(CID, 0, (meta, data0))], CID, L) == (meta, data0)
    with pytest.raises(IncompleteCheckpoint, match="no rank wrote the DCP metadata"):
        check_shard_indexes([ShardIndex(CID, 0, (data0,))], CID, L)
    with pytest.raises(IncompleteCheckpoint, match="outside"):
        check_shard_indexes([ShardIndex(CID, 0, (meta, ObjectInfo("jobs/other/x", 1, SHA)))], CID, L)
    with pytest.raises(IncompleteCheckpoint, match="outside"):  # nobody may write the manifest but commit
        check_shard_indexes([ShardIndex(CID, 0, (meta, ObjectInfo(L.manifest_key(CID), 1, SHA)))], CID, L)
    with pytest.raises(IncompleteCheckpoint, match="reported by ranks 0 and 1"):
        check_shard_indexes([ShardIndex(CID, 0, (meta, data0)), ShardIndex(CID, 1, (data0,))], CID, L)


def test_mismatch_names_size_then_digest():
    a = ObjectInfo("k", 5, SHA)
    assert mismatch(a, a) is None
    assert "is 6 bytes, reported 5" in mismatch(a, ObjectInfo("k", 6, SHA))
    assert "SHA-256 " + "cd" * 32 in mismatch(a, ObjectInfo("k", 5, "cd" * 32))


def test_layout_maps_keys_back_to_their_checkpoint():
    assert L.checkpoint_of(L.data_key(CID, "__0_0.distcp")) == CID
    assert L.checkpoint_of(L.manifest_key(CID)) == CID
    assert L.checkpoint_of("jobs/j10/" + CID + "/x") is None
    assert Layout("").checkpoint_of(CID + "/MANIFEST.json") == CID


def test_digest_of_one_part_is_plain_sha256_and_of_many_the_s3_composite():
    small = digest.Chunking(5 * digest.MIB, 5 * digest.MIB)
    data = bytes(range(256)) * (45 * 1024)  # 11.25 MiB
    assert digest.object_digest(data[:100], small) == hashlib.sha256(data[:100]).hexdigest()
    parts = [hashlib.sha256(data[i:i + 5 * digest.MIB]).digest() for i in range(0, len(data), 5 * digest.MIB)]
    assert digest.object_digest(data, small) == hashlib.sha256(b"".join(parts)).hexdigest() + "-3"
    assert digest.from_s3_checksum(digest.to_s3_checksum(parts[0]) + "-3") == parts[0].hex() + "-3"


def test_chunking_rejects_parts_s3_would_refuse():
    with pytest.raises(ValueError, match="below S3's minimum part size"):
        digest.Chunking(part_size_bytes=1024)


PURE = ["manifest.py", "policy.py", "digest.py", "store.py", "errors.py"]
ALLOWED = {"__future__", "dataclasses", "enum", "typing", "re", "json", "hashlib", "base64", "collections.abc"}


@pytest.mark.parametrize("name", PURE)
def test_the_checkpoint_logic_modules_stay_pure(name):
    path = pathlib.Path(__file__).resolve().parents[3] / "checkpoint" / name
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert {m for m in imported if m not in ALLOWED and not m.startswith("ftsup.checkpoint.")} == set()


def test_checkpoint_locations_parse_and_bad_ones_are_named():
    from ftsup.checkpoint.location import Location, parse_location

    assert parse_location("s3://bkt/jobs/a/") == Location("s3", "bkt", "jobs/a")
    assert parse_location("file:///var/ckpt") == Location("file", "/var/ckpt", "")
    assert parse_location("/var/ckpt") == Location("file", "/var/ckpt", "")
    with pytest.raises(ValueError, match="'gs://b/x': scheme 'gs'"):
        parse_location("gs://b/x")
    with pytest.raises(ValueError, match="'s3:///x' has no bucket"):
        parse_location("s3:///x")
