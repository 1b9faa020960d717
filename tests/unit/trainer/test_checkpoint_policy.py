"""Retention and restore rules (pure)."""

from __future__ import annotations

import random

import pytest

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import ReshardRefused, StoreUnavailable
from ftsup.checkpoint.manifest import Layout, Manifest, Sharding, Topology, Versions, checkpoint_id_for
from ftsup.checkpoint.policy import RestoreMode, plan_gc, plan_restore, plan_stale_uploads
from ftsup.checkpoint.retry import Retrier
from ftsup.checkpoint.store import PendingUpload
from ftsup.common.backoff import Backoff

V = Versions("data-1", "tok-1")


def cid(step: int, tag: str = "a") -> str:
    return checkpoint_id_for(step, tag)


def test_gc_keeps_the_newest_k_by_step_and_deletes_the_rest():
    plan = plan_gc([(cid(3), 3), (cid(1), 1), (cid(2), 2)], [], keep_last=2)
    assert plan.delete_committed == (cid(1),)
    assert plan.kept == (cid(2), cid(3))


def test_gc_deletes_attempts_older_than_the_newest_commit_but_never_newer_or_in_flight_ones():
    attempts = [cid(2, "x"), cid(5, "y"), cid(4, "old-but-flying"), "not-ours"]
    plan = plan_gc([(cid(4), 4)], attempts, keep_last=1, in_flight=frozenset({cid(4, "old-but-flying")}))
    assert plan.delete_incomplete == (cid(2, "x"),)
    assert plan.delete_committed == ()


def test_gc_without_any_commit_deletes_no_attempt():
    assert plan_gc([], [cid(1, "x")], keep_last=1).delete_incomplete == ()


def test_gc_refuses_to_keep_nothing():
    with pytest.raises(ValueError, match="keep_last must be >= 1.*got 0"):
        plan_gc([], [], keep_last=0)


NOW = 1_800_000_000.0
JOB = Layout("jobs/gpt")


def upload(key: str, age_s: float) -> PendingUpload:
    return PendingUpload(key, f"id-{key}", NOW - age_s)


def test_stale_uploads_are_old_inside_a_checkpoint_directory_and_not_in_flight():
    uploads = [
        upload(f"jobs/gpt/{cid(2, 'crashed')}/__1_0.distcp", 7200),  # a crashed writer's: abort
        upload(f"jobs/gpt/{cid(9, 'live')}/__0_0.distcp", 30),  # young: may be uploading now
        upload(f"jobs/gpt/{cid(8, 'flying')}/__2_0.distcp", 7200),  # old but its checkpoint is in flight
        upload("jobs/gpt/notes.bin", 7200),  # under the prefix, in no checkpoint directory
        upload("jobs/gpt/images/cat.png", 7200),  # another application's key sharing the prefix
        upload(f"jobs/gpt/{cid(3, 'edge')}/x", 3600),  # exactly the threshold: old enough
        upload(f"jobs/gpt/{cid(4, 'skew')}/x", -120),  # "started" in the future (clock skew): young
    ]
    verdicts = plan_stale_uploads(uploads, JOB, 3600, NOW, in_flight=frozenset({cid(8, "flying")}))
    assert [v.upload for v in verdicts] == uploads
    assert [v.is_stale for v in verdicts] == [True, False, False, False, False, True, False]
    reasons = [v.reason for v in verdicts]
    assert "started 7200s ago (>= 3600s)" in reasons[0]
    assert "younger than 3600s" in reasons[1]
    assert "in flight" in reasons[2] and cid(8, "flying") in reasons[2]
    assert "not inside a checkpoint directory" in reasons[3] and "not inside a checkpoint directory" in reasons[4]


def test_an_upload_of_another_prefix_is_never_stale():
    other = upload(f"jobs/other/{cid(1, 'x')}/__0_0.distcp", 10**6)
    assert [v.is_stale for v in plan_stale_uploads([other], JOB, 0, NOW)] == [False]


def test_stale_uploads_refuse_a_negative_age():
    with pytest.raises(ValueError, match="older_than_s must be >= 0, got -1"):
        plan_stale_uploads([], JOB, -1, NOW)


def saved(topology: Topology, versions: Versions = V) -> Manifest:
    return Manifest(cid(1), 1, topology, versions, digest.Chunking(), (), (), "n", "t")


def test_same_topology_restores_directly():
    t = Topology(4, 4)
    assert plan_restore(saved(t), t, V).mode is RestoreMode.DIRECT


def test_another_world_size_reshards_through_dcp_and_says_so():
    plan = plan_restore(saved(Topology(4, 4)), Topology(2, 2), V)
    assert plan.mode is RestoreMode.RESHARD
    assert plan.reason == "resharding through DCP from world 4 (dp 4, tp 1, pp 1, dtensor) to world 2 (dp 2, tp 1, pp 1, dtensor)"


def test_manual_sharding_reshards_only_along_dp():
    manual = Sharding.MANUAL
    assert plan_restore(saved(Topology(8, 4, 2, sharding=manual)), Topology(4, 2, 2, sharding=manual), V).mode is RestoreMode.RESHARD
    with pytest.raises(ReshardRefused, match="manually sharded for tp 2 pp 1; the job runs tp 4 pp 1"):
        plan_restore(saved(Topology(8, 4, 2, sharding=manual)), Topology(8, 2, 4, sharding=manual), V)


@pytest.mark.parametrize("versions, message", [
    (Versions("data-2", "tok-1"), "data version 'data-1', this job uses 'data-2'"),
    (Versions("data-1", "tok-9"), "tokenizer 'tok-1', this job uses 'tok-9'"),
])
def test_other_data_or_tokenizer_versions_are_refused_saying_which(versions, message):
    with pytest.raises(ReshardRefused, match=message):
        plan_restore(saved(Topology(1, 1)), Topology(1, 1), versions)


def test_a_layout_change_between_kinds_is_refused():
    with pytest.raises(ReshardRefused, match="holds replicated state, the job expects dtensor"):
        plan_restore(saved(Topology(2, 2, sharding=Sharding.REPLICATED)), Topology(2, 2), V)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_retrier_retries_retryable_errors_on_the_backoff_schedule_then_succeeds():
    clock = FakeClock()
    retrier = Retrier(Backoff(0.1, 1.0, 2.0, 0.0, deadline_s=10.0), random.Random(1), clock.sleep, clock.monotonic)
    outcomes = iter([ConnectionError("reset"), ConnectionError("reset"), "ok"])

    def op():
        value = next(outcomes)
        if isinstance(value, Exception):
            raise value
        return value

    assert retrier.call("put k", op, lambda e: isinstance(e, ConnectionError)) == "ok"
    assert clock.sleeps == [0.1, 0.2]


def test_retrier_gives_up_at_the_deadline_naming_the_operation_and_attempts():
    clock = FakeClock()
    retrier = Retrier(Backoff(0.5, 0.5, 2.0, 0.0, deadline_s=1.2), random.Random(1), clock.sleep, clock.monotonic)

    def op():
        clock.now += 0.1  # each attempt takes time too, and it counts: 0.1 + 0.5 + 0.1, then +0.5 > 1.2
        raise ConnectionError("503")

    with pytest.raises(StoreUnavailable, match=r"put k: gave up after 2 attempts in 0\.7s \(deadline 1\.2s\): 503"):
        retrier.call("put k", op, lambda e: True)


def test_retrier_does_not_retry_fatal_errors():
    calls = []

    def op():
        calls.append(1)
        raise PermissionError("403")

    with pytest.raises(PermissionError):
        Retrier(sleep=lambda s: None).call("put k", op, lambda e: isinstance(e, ConnectionError))
    assert calls == [1]
