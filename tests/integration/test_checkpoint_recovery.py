"""The third rung of the recovery ladder with real processes: object-store checkpoints.

Supervisor, agents and gloo trainers checkpoint every few steps, to a local directory and to a
real S3 server (SeaweedFS, the session's `s3_server`). A rank's node and its buddy's node are
killed at once after a checkpoint committed: that rank's every RAM copy is gone, so the whole
job restarts at the committed checkpoint's step, that rank loading it from the store, and must
still end with exactly the parameters of the uninterrupted run.
"""

from __future__ import annotations

import json
import pathlib
import sys
import uuid
from collections.abc import Callable

import pytest

from ftsup.harness.cluster import ClusterSpec, LocalCluster, wait_until
from ftsup.harness.demo import trainer_argv
from ftsup.v1 import events_pb2, operator_pb2
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.integration

STEPS = 12
EVERY = 4
KEEP = 2


def spec(location: str = "", extra: tuple[str, ...] = ()) -> ClusterSpec:
    args = ("--checkpoint-location", location, "--checkpoint-every-steps", str(EVERY),
            "--checkpoint-keep", str(KEEP), *extra) if location else ()
    return ClusterSpec(
        nodes=3, spares=2, ranks_per_node=1,
        trainer_argv=trainer_argv(sys.executable, STEPS, seed=5),
        heartbeat_interval_s=0.5, reconnect_grace_s=1.0, warm_trainers=1,
        supervisor_args=args,
    )


def of_kind(records: list[events_pb2.Record], kind: str) -> list:
    return [getattr(r.event, kind) for r in records if r.event.WhichOneof("kind") == kind]


def wait_completed(cluster: LocalCluster) -> operator_pb2.GetStatusResponse:
    return cluster.wait_for(
        lambda: (s := cluster.status()).phase == operator_pb2.JOB_PHASE_COMPLETED and s, 240, "the job to complete"
    )


@pytest.fixture(scope="module")
def reference_digest(tmp_path_factory: pytest.TempPathFactory) -> str:
    with LocalCluster(spec(), tmp_path_factory.mktemp("reference")) as cluster:
        cluster.start()
        return wait_completed(cluster).final_digest


def run_and_check(workdir: pathlib.Path, reference: str, location: str, extra: tuple[str, ...], prefix: str,
                  read: Callable[[str], bytes], manifests: Callable[[], list[str]]) -> None:
    with LocalCluster(spec(location, extra), workdir) as cluster:
        cluster.start()
        first = cluster.wait_for(lambda: of_kind(cluster.events(), "checkpoint_committed"), 180,
                                 "a committed checkpoint")[0]
        cluster.kill_node("node-2")  # rank 1's node
        cluster.kill_node("node-3")  # its buddy, which holds rank 1's other RAM copy
        status = wait_completed(cluster)
        # The last step's checkpoint may still be committing when the job completes: its outcome
        # (and the retention after it) comes as its own record. Read the log once nothing is in flight.
        listed = cluster.wait_for(
            lambda: (c := cluster._stub().ListCheckpoints(operator_pb2.ListCheckpointsRequest(), timeout=10))
            and not c.pending_checkpoint_id and c, 60, "no checkpoint in flight")
        records = cluster.events()
    assert status.final_digest == reference
    started = of_kind(records, "checkpoint_started")
    committed = of_kind(records, "checkpoint_committed")
    assert first.step == EVERY and first.checkpoint_id == "step-0000000004-g1"
    assert [c.step % EVERY for c in committed] == [0] * len(committed)
    assert all(s.shards == 3 and s.location == location for s in started)
    generations = of_kind(records, "generation_started")
    assert len(generations) >= 2
    restored = generations[1]
    assert {m.node_id for m in restored.members} == {"node-1", "spare-1", "spare-2"}
    assert restored.restore_step in {c.step for c in committed if c.checkpoint_id.endswith("-g1")}
    # Rank 1's every RAM copy died with node-2 and node-3: it restores from the object store. The
    # others restore at the same step from RAM when a copy of that step survived, else from the store.
    by_rank = {r.rank: r.kind for r in restored.restores}
    assert by_rank[1] == events_pb2.RESTORE_KIND_CHECKPOINT, restored.restores
    assert "from the object-store checkpoint" in restored.reason
    # `supervisorctl checkpoints` answers from the state: the newest commit and the cadence.
    assert (listed.checkpoint_id, listed.checkpoint_step) == (committed[-1].checkpoint_id, committed[-1].step)
    assert listed.checkpoint_manifest == committed[-1].manifest_key and "every 4 steps" in listed.cadence
    # Retention kept the newest KEEP commits, each with its manifest naming every rank's shard index.
    # Retention runs after each commit's record, off the supervisor's loop: wait for it, then assert.
    kept = sorted(c.manifest_key for c in committed[-KEEP:])
    wait_until(lambda: sorted(manifests()) == kept, 30, f"retention to keep only {kept}")
    assert sorted(manifests()) == kept
    for c in committed[-KEEP:]:
        assert c.manifest_key == f"{prefix}{c.checkpoint_id}/MANIFEST.json"
        manifest = json.loads(read(c.manifest_key))
        assert manifest["step"] == c.step
        assert sorted(s["rank"] for s in manifest["shards"]) == [0, 1, 2]


def test_losing_a_rank_and_its_buddy_restores_from_a_directory_checkpoint_bit_identical(
    tmp_path: pathlib.Path, reference_digest: str
) -> None:
    store = tmp_path / "checkpoints"
    run_and_check(tmp_path / "run", reference_digest, str(store), (), "",
                  lambda key: (store / key).read_bytes(),
                  lambda: [str(p.relative_to(store)) for p in store.glob("*/MANIFEST.json")])


def test_losing_a_rank_and_its_buddy_restores_from_an_s3_checkpoint_bit_identical(
    tmp_path: pathlib.Path, reference_digest: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env().items():  # credentials reach the processes only by environment
        monkeypatch.setenv(name, value)
    prefix = f"recovery-{uuid.uuid4().hex[:8]}"
    client = s3_server.client()

    def manifests() -> list[str]:
        listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix=f"{prefix}/")
        return [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith("/MANIFEST.json")]

    run_and_check(tmp_path / "run", reference_digest, f"s3://{s3_server.bucket}/{prefix}",
                  ("--checkpoint-endpoint", s3_server.endpoint_url), f"{prefix}/",
                  lambda key: client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read(), manifests)
