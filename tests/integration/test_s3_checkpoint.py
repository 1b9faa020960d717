"""Sharded checkpoints on a real S3-compatible server (SeaweedFS over HTTP on loopback).

The ObjectStore contract on S3Store; DCP save/load bit-exact with 4 gloo ranks and a reshard to
2; the commit protocol (manifest last, never overwritten, readers trust only manifests); retention;
and S3 faults injected by a proxy in front of the server: 5xx, slow answers and connections
dropped mid-upload are retried and still commit; persistent faults commit nothing and abort.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from ftsup.checkpoint import catalog, flows
from ftsup.checkpoint.errors import CheckpointNotCommitted, ManifestExists, ReshardRefused
from ftsup.checkpoint.manifest import Layout, Topology, Versions, checkpoint_id_for
from ftsup.checkpoint.policy import RestoreMode
from ftsup.checkpoint.retry import Retrier
from ftsup.checkpoint.s3 import S3Config, S3Store
from ftsup.common import checkpoint_ids
from ftsup.common.backoff import Backoff
from ftsup.harness import orphan_guard
from ftsup.harness.cluster import wait_until
from tests.support import dcp_ranks
from tests.support.objectstore_contract import SMALL_CHUNKING, ObjectStoreContract
from tests.support.s3_fault_proxy import Fault, FaultProxy, FaultRule
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.integration

VERSIONS = Versions("data-v1", "tok-v1")
ONE = Topology(world_size=1, dp=1)
FAST = Backoff(initial_s=0.05, max_s=0.2, factor=2.0, jitter=0.5, deadline_s=20.0)
CONDITION_DEADLINE_S = 30.0


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch) -> S3Server:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


def make_store(server: S3Server, endpoint_url: str | None = None, backoff: Backoff = FAST,
               read_timeout_s: float = 10.0) -> S3Store:
    config = S3Config(bucket=server.bucket, endpoint_url=endpoint_url or server.endpoint_url, region="us-east-1",
                      chunking=SMALL_CHUNKING, max_concurrency=4, connect_timeout_s=2.0,
                      read_timeout_s=read_timeout_s, backoff=backoff)
    return S3Store(config, retrier=Retrier(backoff))


class TestS3StoreContract(ObjectStoreContract):
    @pytest.fixture
    def store(self, s3_env: S3Server) -> Iterator[S3Store]:
        store = make_store(s3_env)
        yield store
        store.close()

    @pytest.fixture
    def abandon(self, s3_env: S3Server):
        def leave_multipart_upload(key: str) -> None:  # what a writer killed after its first part leaves
            client = s3_env.client()
            upload_id = client.create_multipart_upload(Bucket=s3_env.bucket, Key=key,
                                                       ChecksumAlgorithm="SHA256")["UploadId"]
            client.upload_part(Bucket=s3_env.bucket, Key=key, UploadId=upload_id, PartNumber=1,
                               Body=b"p" * (5 << 20), ChecksumAlgorithm="SHA256")

        return leave_multipart_upload


@pytest.fixture
def layout() -> Layout:
    return Layout(f"jobs/{uuid.uuid4().hex[:10]}")


@pytest.fixture
def proxy(s3_env: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", s3_env.s3_port) as proxy:
        yield proxy


def state(seed: int, big: bool = False) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    sd: dict[str, object] = {"w": torch.randn(256, 129, generator=gen), "step": seed}
    if big:  # 12 MiB: three 5 MiB parts with SMALL_CHUNKING
        sd["big"] = torch.randn(3 * 1024 * 1024, generator=gen)
    return sd


def zeros_like(sd: dict[str, object]) -> dict[str, object]:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else -1 for k, v in sd.items()}


def assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def wait_for(condition, what: str) -> None:
    wait_until(condition, CONDITION_DEADLINE_S, what, poll_s=0.02)


# -- DCP with real ranks -------------------------------------------------------------------------
def spawn(world: int, tmp_path: Path, spec: dcp_ranks.StoreSpec, prefix: str, cid: str, mode: str) -> list[dict]:
    out = tmp_path / f"{mode}-{world}"
    out.mkdir()
    init_file = tmp_path / f"init-{mode}-{world}"
    mp.spawn(dcp_ranks.run, args=(world, str(init_file), spec, prefix, cid, mode, str(out)), nprocs=world, join=True)
    return [json.loads((out / f"{r}.json").read_text()) for r in range(world)]


def test_four_ranks_save_to_s3_and_two_ranks_load_it_bit_exact_through_dcp_resharding(s3_env, layout, tmp_path):
    spec = dcp_ranks.StoreSpec("s3", s3_env.bucket, s3_env.endpoint_url, tuple(s3_env.env().items()))
    cid = checkpoint_id_for(11, "dtensor")
    saved = spawn(4, tmp_path, spec, layout.prefix, cid, "save")
    assert {r["objects"] for r in saved} == {5}  # 4 rank objects + DCP metadata

    store = make_store(s3_env)
    manifest = catalog.read_manifest(store, layout, cid)
    assert manifest.topology == dcp_ranks.topology(4)
    assert [s.rank for s in manifest.shards] == [0, 1, 2, 3]

    # (Same-topology loads, mode "direct", are covered in-process below: 4 more rank processes cost
    # ~15 s of CPU on a loaded 2-core machine for no extra coverage of the storage layer.)
    resharded = spawn(2, tmp_path, spec, layout.prefix, cid, "load")
    assert {r["mode"] for r in resharded} == {"reshard"}
    assert "from world 4" in resharded[0]["reason"] and "to world 2" in resharded[0]["reason"]
    for result in resharded:
        eq = result["equal"]
        assert eq["w"] and eq["b"] and eq["plain"] and eq["extra"], result
    assert [r["equal"]["w_local_rows"] for r in resharded] == [[32, 33], [32, 33]]
    store.close()


def test_restore_into_other_data_version_is_refused_before_any_data_is_read(s3_env, layout):
    store = make_store(s3_env)
    cid = checkpoint_id_for(5, "a")
    flows.save(state(5), store, layout, cid, 5, ONE, VERSIONS)
    with pytest.raises(ReshardRefused, match="data version 'data-v1'.*'data-v2'"):
        flows.load(store, layout, cid, zeros_like(state(5)), ONE, Versions("data-v2", "tok-v1"))
    store.close()


# -- commit protocol -----------------------------------------------------------------------------
def test_a_checkpoint_is_invisible_until_its_manifest_and_a_manifest_is_never_overwritten(s3_env, layout):
    store = make_store(s3_env)
    cid = checkpoint_id_for(3, "x")
    import torch.distributed.checkpoint as dcp

    from ftsup.checkpoint.dcp import ObjectStoreWriter

    writer = ObjectStoreWriter(store, layout, cid)
    dcp.save(state(3), storage_writer=writer, no_dist=True)
    report = catalog.write_shard_index(store, layout, writer.shard_index())
    assert catalog.list_committed(store, layout) == ()  # objects written, no manifest: not a checkpoint
    assert catalog.scan(store, layout).incomplete == (cid,)
    with pytest.raises(CheckpointNotCommitted):
        flows.load(store, layout, cid, zeros_like(state(3)), ONE, VERSIONS)

    manifest = catalog.commit(store, layout, cid, 3, [report], ONE, VERSIONS)
    assert [m.checkpoint_id for m in catalog.list_committed(store, layout)] == [cid]
    before = bytes(store.get(layout.manifest_key(cid)))
    # The same shards again (a new leader re-committing after a failover) is that commit; anything
    # else under this id is refused. The manifest is never rewritten either way.
    assert catalog.commit(store, layout, cid, 3, [report], ONE, VERSIONS) == manifest
    with pytest.raises(ManifestExists):
        catalog.commit(store, layout, cid, 4, [report], ONE, VERSIONS)
    assert bytes(store.get(layout.manifest_key(cid))) == before
    assert {o.key for o in manifest.objects} == {layout.data_key(cid, ".metadata"), layout.data_key(cid, "__0_0.distcp")}
    loaded = zeros_like(state(3))
    assert flows.load(store, layout, cid, loaded, ONE, VERSIONS).mode is RestoreMode.DIRECT
    assert_same(loaded, state(3))
    store.close()


def test_commit_refuses_an_object_that_changed_after_it_was_reported(s3_env, layout):
    store = make_store(s3_env)
    cid = checkpoint_id_for(4, "t")
    import torch.distributed.checkpoint as dcp

    from ftsup.checkpoint.dcp import ObjectStoreWriter

    writer = ObjectStoreWriter(store, layout, cid)
    dcp.save(state(4), storage_writer=writer, no_dist=True)
    report = catalog.write_shard_index(store, layout, writer.shard_index())
    store.put(layout.data_key(cid, "__0_0.distcp"), b"tampered")
    with pytest.raises(Exception, match="__0_0.distcp"):
        catalog.commit(store, layout, cid, 4, [report], ONE, VERSIONS)
    assert not store.list(layout.manifest_key(cid))
    store.close()


def test_gc_keeps_the_last_k_commits_and_removes_abandoned_attempts_but_not_newer_ones(s3_env, layout):
    store = make_store(s3_env)
    for step in (1, 2, 3):
        flows.save(state(step), store, layout, checkpoint_id_for(step, "c"), step, ONE, VERSIONS)
    store.put(layout.data_key(checkpoint_id_for(2, "lost"), "__0_0.distcp"), b"half")  # abandoned attempt
    store.put(layout.data_key(checkpoint_id_for(9, "live"), "__0_0.distcp"), b"busy")  # newer: may be in flight
    plan = catalog.gc(store, layout, keep_last=2)
    assert plan.delete_committed == (checkpoint_id_for(1, "c"),)
    assert plan.delete_incomplete == (checkpoint_id_for(2, "lost"),)
    assert [m.step for m in catalog.list_committed(store, layout)] == [2, 3]
    remaining = {layout.checkpoint_of(k) for k in store.list(layout.root())}
    assert remaining == {checkpoint_id_for(2, "c"), checkpoint_id_for(3, "c"), checkpoint_id_for(9, "live")}
    store.close()


# A writer process that uploads one 12 MiB object (three 5 MiB-chunked parts) through `endpoint`.
_WRITER = """
import sys
from tests.support.objectstore_contract import SMALL_CHUNKING
from ftsup.checkpoint.s3 import S3Config, S3Store
endpoint, bucket, key = sys.argv[1:]
store = S3Store(S3Config(bucket=bucket, endpoint_url=endpoint, region="us-east-1", chunking=SMALL_CHUNKING))
store.put(key, bytes(12 << 20))
"""


def test_gc_aborts_the_multipart_upload_of_a_writer_killed_mid_upload_once_it_is_old(s3_env, layout, proxy):
    store = make_store(s3_env)
    committed = checkpoint_id_for(1, "c")
    flows.save(state(1), store, layout, committed, 1, ONE, VERSIONS)
    crashed = checkpoint_id_for(2, "crashed")
    key = layout.data_key(crashed, "__0_0.distcp")
    proxy.add(FaultRule(Fault.DELAY, "PUT", r"partNumber=3", delay_s=30.0))  # the writer dies on its last part
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, proxy.endpoint_url, s3_env.bucket, key],
                              env={**os.environ, **s3_env.env()})
    orphan_guard.watch(writer)  # stopped even if pytest itself is killed
    try:
        wait_for(lambda: {"1", "2"} <= {p.rsplit("partNumber=", 1)[-1].split("&")[0] for _, p, o in proxy.requests
                                        if "partNumber=" in p and o == "200"}
                 and any("partNumber=3" in p for _, p in proxy.arrived), "parts 1-2 stored and part 3 sent")
    finally:
        writer.kill()
        writer.wait(timeout=10)
    [upload] = store.list_uploads(layout.root())
    assert upload.key == key
    parts = s3_env.client().list_parts(Bucket=s3_env.bucket, Key=key, UploadId=upload.upload_id)["Parts"]
    assert len(parts) == 2  # stored, invisible to every object listing, billed until aborted
    assert store.list(layout.directory(crashed)) == ()

    young = catalog.gc(store, layout, keep_last=1)  # default threshold 1 h: it may be a slow live writer
    assert young.aborted_uploads == () and store.list_uploads(layout.root()) == (upload,)
    flying = catalog.gc(store, layout, keep_last=1, in_flight=frozenset({crashed}), now_unix_s=time.time() + 3601)
    assert flying.aborted_uploads == () and "in flight" in flying.uploads[0].reason
    plan = catalog.gc(store, layout, keep_last=1, now_unix_s=time.time() + 3601)
    assert plan.aborted_uploads == (upload,)
    assert store.list_uploads(layout.root()) == ()
    assert [m.checkpoint_id for m in catalog.list_committed(store, layout)] == [committed]
    store.close()


def test_ftsup_checkpoints_gc_aborts_stale_multipart_uploads_and_reports_them_as_json(s3_env, layout, capsys):
    from ftsup.checkpoint.cli import main

    client = s3_env.client()
    for n in (1, 2):
        key = layout.data_key(checkpoint_id_for(n, "crashed"), "__0_0.distcp")
        client.create_multipart_upload(Bucket=s3_env.bucket, Key=key, ChecksumAlgorithm="SHA256")
    client.create_multipart_upload(Bucket=s3_env.bucket, Key=f"{layout.prefix}-neighbour/x", ChecksumAlgorithm="SHA256")
    location = f"s3://{s3_env.bucket}/{layout.prefix}"
    argv = ["gc", location, "--endpoint", s3_env.endpoint_url, "--region", "us-east-1", "--json"]
    assert main(argv) == 0
    young = json.loads(capsys.readouterr().out)
    assert (young["uploads_aborted"], young["uploads_kept"]) == (0, 2)  # seconds old, the default is 1 h
    assert main([*argv, "--multipart-older-than", "0s"]) == 0
    aborted = json.loads(capsys.readouterr().out)
    assert (aborted["uploads_aborted"], aborted["uploads_kept"]) == (2, 0)
    assert client.list_multipart_uploads(Bucket=s3_env.bucket, Prefix=f"{layout.prefix}/").get("Uploads", []) == []
    left = client.list_multipart_uploads(Bucket=s3_env.bucket, Prefix=f"{layout.prefix}-neighbour/")["Uploads"]
    assert len(left) == 1  # another prefix's upload is not this job's to abort
    client.abort_multipart_upload(Bucket=s3_env.bucket, Key=left[0]["Key"], UploadId=left[0]["UploadId"])


# -- injected S3 faults --------------------------------------------------------------------------
def test_transient_5xx_and_a_connection_dropped_mid_upload_are_retried_and_the_checkpoint_commits(
        s3_env, layout, proxy):
    store = make_store(s3_env, proxy.endpoint_url)
    rules = [
        proxy.add(FaultRule(Fault.DROP, "PUT", r"partNumber=2", drop_after_bytes=256 * 1024)),
        proxy.add(FaultRule(Fault.STATUS_503, "PUT", r"partNumber=3")),
        proxy.add(FaultRule(Fault.STATUS_500, "PUT", r"\.metadata$")),
        proxy.add(FaultRule(Fault.STATUS_503, "POST", r"uploadId=")),  # CompleteMultipartUpload
        proxy.add(FaultRule(Fault.STATUS_500, "PUT", r"MANIFEST\.json$")),
    ]
    cid = checkpoint_id_for(7, "faulty")
    sd = state(7, big=True)
    manifest = flows.save(sd, store, layout, cid, 7, ONE, VERSIONS)
    assert [r.hits for r in rules] == [1, 1, 1, 1, 1]
    assert any(outcome == "dropped" for _, _, outcome in proxy.requests)
    assert any(o.sha256.endswith("-3") for o in manifest.objects)  # the big object went in 3 parts
    loaded = zeros_like(sd)
    flows.load(make_store(s3_env), layout, cid, loaded, ONE, VERSIONS)
    assert_same(loaded, sd)
    store.close()


def test_a_slow_answer_past_the_read_timeout_is_retried_and_the_checkpoint_commits(s3_env, layout, proxy):
    store = make_store(s3_env, proxy.endpoint_url, read_timeout_s=1.0)
    rule = proxy.add(FaultRule(Fault.DELAY, "PUT", r"__0_0\.distcp$", delay_s=2.5))
    cid = checkpoint_id_for(8, "slow")
    flows.save(state(8), store, layout, cid, 8, ONE, VERSIONS)
    assert rule.hits == 1
    assert [m.checkpoint_id for m in catalog.list_committed(store, layout)] == [cid]
    store.close()


def test_a_manifest_put_whose_answer_is_lost_is_recognised_as_our_own_commit(s3_env, layout, proxy):
    store = make_store(s3_env, proxy.endpoint_url, read_timeout_s=1.0)
    rule = proxy.add(FaultRule(Fault.DELAY, "PUT", r"MANIFEST\.json$", delay_s=2.5))
    cid = checkpoint_id_for(9, "lostack")
    manifest = flows.save(state(9), store, layout, cid, 9, ONE, VERSIONS)
    assert rule.hits == 1
    assert catalog.read_manifest(store, layout, cid) == manifest
    store.close()


def test_persistent_upload_failures_never_commit_and_the_attempt_is_aborted(s3_env, layout, proxy):
    store = make_store(s3_env, proxy.endpoint_url, backoff=Backoff(0.05, 0.2, 2.0, 0.5, deadline_s=1.5))
    rule = proxy.add(FaultRule(Fault.STATUS_503, "PUT", r"partNumber=2", times=None))
    cid = checkpoint_id_for(10, "doomed")
    with pytest.raises(flows.CheckpointWriteFailed, match="not committed, attempt aborted.*gave up after"):
        flows.save(state(10, big=True), store, layout, cid, 10, ONE, VERSIONS)
    assert rule.hits >= 2
    direct = make_store(s3_env)
    assert catalog.list_committed(direct, layout) == ()
    assert direct.list(layout.directory(cid)) == ()
    store.close()
    direct.close()


def test_a_failing_manifest_write_never_commits(s3_env, layout, proxy):
    store = make_store(s3_env, proxy.endpoint_url, backoff=Backoff(0.05, 0.2, 2.0, 0.5, deadline_s=1.0))
    proxy.add(FaultRule(Fault.STATUS_500, "PUT", r"MANIFEST\.json$", times=None))
    cid = checkpoint_id_for(12, "nomanifest")
    with pytest.raises(flows.CheckpointWriteFailed, match="commit"):
        flows.save(state(12), store, layout, cid, 12, ONE, VERSIONS)
    direct = make_store(s3_env)
    assert catalog.list_committed(direct, layout) == ()
    assert direct.list(layout.directory(cid)) == ()
    store.close()
    direct.close()


def test_a_reader_never_sees_a_checkpoint_whose_upload_is_still_in_progress(s3_env, layout, proxy):
    store = make_store(s3_env, proxy.endpoint_url)
    proxy.add(FaultRule(Fault.DELAY, "PUT", r"partNumber=3", delay_s=2.0))
    cid = checkpoint_id_for(13, "inflight")
    reader = make_store(s3_env)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            flows.save(state(13, big=True), store, layout, cid, 13, ONE, VERSIONS)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    wait_for(lambda: any("partNumber=3" in p for _, p in proxy.arrived) or not thread.is_alive(), "the delayed part")
    assert thread.is_alive(), "the writer finished before the delayed part was observed"
    assert catalog.list_committed(reader, layout) == ()  # parts 1-2 stored, part 3 on its way: not a checkpoint
    with pytest.raises(CheckpointNotCommitted):
        catalog.read_manifest(reader, layout, cid)
    thread.join(timeout=CONDITION_DEADLINE_S)
    assert not errors
    assert [m.checkpoint_id for m in catalog.list_committed(reader, layout)] == [cid]
    store.close()
    reader.close()


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_restore_refuses_a_manifest_and_metadata_replaced_in_the_bucket_before_unpickling(
    s3_env, layout, tmp_path
):
    import dataclasses
    import hashlib
    import pickle

    from ftsup.checkpoint import supervised
    from ftsup.checkpoint.manifest import DCP_METADATA_NAME, decode_manifest, encode_manifest
    from ftsup.checkpoint.verify import UntrustedCheckpoint

    store = make_store(s3_env)
    cid = checkpoint_ids.checkpoint_id_for(4, 1)
    payload = os.urandom(4096)
    report = supervised.save_rank(store, layout, cid, 0, payload, hashlib.sha256(payload).hexdigest())
    _, pin = catalog.commit_pinned(store, layout, cid, 4, [report], supervised.job_topology(1),
                                   supervised.JOB_VERSIONS)
    assert supervised.load_rank(store, layout, cid, 0, 1, manifest_sha256=pin)[0] == payload
    # Someone with the bucket's write key swaps .metadata for a code-running pickle and rewrites the
    # manifest to record its digest, straight through the S3 API (manifests are put-if-absent for
    # ftsup's writers, not for an attacker: delete and re-put).
    marker = tmp_path / "pwned"
    client = s3_env.client()
    meta_key = layout.data_key(cid, DCP_METADATA_NAME)
    evil = pickle.dumps(_RunsCode(marker))
    client.put_object(Bucket=s3_env.bucket, Key=meta_key, Body=evil)
    manifest = decode_manifest(bytes(store.get(layout.manifest_key(cid))))
    objects = tuple(dataclasses.replace(o, size_bytes=len(evil), sha256=hashlib.sha256(evil).hexdigest())
                    if o.key == meta_key else o for o in manifest.objects)
    client.put_object(Bucket=s3_env.bucket, Key=layout.manifest_key(cid),
                      Body=encode_manifest(dataclasses.replace(manifest, objects=objects)))
    with pytest.raises(UntrustedCheckpoint, match=f"the committed record pins {pin}"):
        supervised.load_rank(store, layout, cid, 0, 1, manifest_sha256=pin)
    assert not marker.exists()
    store.close()
