"""Session.save_checkpoint / restore from the object store (a local directory), one rank, over a
fake agent link: the shard report's contents, the commit they allow, a bit-identical restore, and
a failed write reported rather than raised."""

from __future__ import annotations

import pathlib

import torch

from ftsup.checkpoint import catalog, supervised
from ftsup.checkpoint.manifest import ShardReport
from ftsup.checkpoint.supervised import CheckpointEnv
from ftsup.trainer.session import LaunchEnv, Session

ENV = {
    "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
    "FTSUP_GENERATION": "2", "FTSUP_NODE_ID": "node-a", "FTSUP_AGENT_ADDRESS": "unix:/nowhere",
}


class FakeClient:
    address = "unix:/fake"

    def __init__(self) -> None:
        self.shards: list = []
        self.restores = 0

    def get_restore(self, rank, generation):
        self.restores += 1
        return None  # the agent's answer for RESTORE_KIND_CHECKPOINT: no chunk at all

    def report_step(self, report):
        pass

    def report_checkpoint_shard(self, shard):
        self.shards.append(shard)

    def report_finished(self, finished):
        pass

    def close(self):
        pass


def _session(env: dict[str, str], client: FakeClient) -> Session:
    merged = ENV | env
    return Session(LaunchEnv.from_mapping(merged), client, checkpoints=CheckpointEnv.from_mapping(merged))


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_saved_and_committed_checkpoint_restores_bit_identical(tmp_path: pathlib.Path) -> None:
    location = {"FTSUP_CHECKPOINT_LOCATION": str(tmp_path), "FTSUP_CHECKPOINT_EVERY_STEPS": "4"}
    client = FakeClient()
    session = _session(location, client)
    assert [s for s in range(1, 10) if session.checkpoint_due(s)] == [4, 8]
    model, optimizer = _model()
    session.save_checkpoint(4, model, optimizer)
    session.close()
    [shard] = client.shards
    assert (shard.checkpoint_id, shard.step, shard.rank, shard.generation, shard.error) == (
        "step-0000000004-g2", 4, 0, 2, "")
    store, layout = CheckpointEnv.from_mapping(location).open()
    catalog.commit(store, layout, shard.checkpoint_id, 4, [ShardReport(0, shard.key, shard.sha256, shard.size_bytes)],
                   supervised.job_topology(1), supervised.JOB_VERSIONS)

    restored_model = torch.nn.Linear(4, 3)
    restored_optimizer = torch.optim.AdamW(restored_model.parameters(), lr=0.1)
    client = FakeClient()
    session = _session(location | {"FTSUP_RESTORE_STEP": "4", "FTSUP_RESTORE_CHECKPOINT": shard.checkpoint_id}, client)
    assert session.restore(restored_model, restored_optimizer) == 4
    assert client.restores == 1  # RAM first: the agent said it holds nothing
    for a, b in zip(model.state_dict().values(), restored_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert restored_optimizer.state_dict()["state"][0]["exp_avg"].equal(optimizer.state_dict()["state"][0]["exp_avg"])
    session.close()


def test_a_failed_write_is_reported_not_raised(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    client = FakeClient()
    session = _session({"FTSUP_CHECKPOINT_LOCATION": str(blocker), "FTSUP_CHECKPOINT_EVERY_STEPS": "1"}, client)
    model, optimizer = _model()
    session.save_checkpoint(1, model, optimizer)
    session.close()
    [shard] = client.shards
    assert shard.error and shard.checkpoint_id == "step-0000000001-g2"


def test_checkpoints_are_off_without_a_location() -> None:
    session = _session({"FTSUP_CHECKPOINT_EVERY_STEPS": "2"}, FakeClient())
    assert not session.checkpoint_due(2)
    session.close()
