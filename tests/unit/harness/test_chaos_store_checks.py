"""The chaos harness's checkpoint invariant in the store: lost and half-visible checkpoints found
from a real (local directory) store and a hand-built log."""

from __future__ import annotations

import pytest
import torch

from ftsup.checkpoint import flows
from ftsup.checkpoint.local import LocalDirStore
from ftsup.checkpoint.manifest import Layout, Topology, Versions, checkpoint_id_for
from ftsup.harness.chaos.store_checks import inspect_store
from ftsup.v1 import events_pb2

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
L = Layout("job")


def committed(seq: int, cid: str, step: int) -> events_pb2.Record:
    return events_pb2.Record(seq=seq, term=1, time_unix_s=float(seq), event=events_pb2.Event(
        checkpoint_committed=events_pb2.CheckpointCommitted(checkpoint_id=cid, step=step)))


@pytest.fixture
def store(tmp_path):
    store = LocalDirStore(tmp_path)
    for step in (1, 2, 3):
        flows.save({"w": torch.full((64,), float(step))}, store, L, checkpoint_id_for(step, "a"), step,
                   Topology(1, 1), Versions("d", "t"))
    yield store
    store.close()


LOG = [committed(i, checkpoint_id_for(i, "a"), i) for i in (1, 2, 3)]


def test_whole_checkpoints_that_the_log_committed_pass(store):
    view = inspect_store(store, L, LOG, keep=3)
    assert (view.problems, view.lost) == ((), 0)
    assert view.manifests == tuple(checkpoint_id_for(i, "a") for i in (1, 2, 3))
    assert view.uploads == ()


def test_a_manifest_naming_a_missing_or_changed_object_is_half_visible(store):
    store.delete([L.data_key(checkpoint_id_for(2, "a"), "__0_0.distcp")])
    store.put(L.data_key(checkpoint_id_for(3, "a"), "__0_0.distcp"), b"other bytes")
    view = inspect_store(store, L, LOG, keep=3)
    assert view.lost == 2
    assert "half-visible: its manifest names job/step-0000000002-a/__0_0.distcp, which is missing" in view.problems[0]
    assert "job/step-0000000003-a/__0_0.distcp is 11 bytes" in view.problems[1]


def test_a_manifest_the_log_never_committed_is_visible_though_not_committed(store):
    view = inspect_store(store, L, LOG[:2], keep=2)
    assert view.lost == 1 and "the log never committed it" in view.problems[0]


def test_a_recent_commit_without_a_manifest_is_lost_but_older_ones_may_be_retained_away(store):
    store.delete([L.manifest_key(checkpoint_id_for(3, "a"))])
    assert inspect_store(store, L, LOG, keep=1).problems == (
        "checkpoint step-0000000003-a (step 3) was committed and is among the newest 1, but the store has no"
        " manifest for it",)
    store.delete([L.manifest_key(checkpoint_id_for(1, "a"))])  # retention with keep 2 removes step 1 first
    assert inspect_store(store, L, LOG[:2], keep=1).problems == ()
