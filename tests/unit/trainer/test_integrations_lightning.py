"""ftsup.trainer.integrations.lightning: the cluster environment's ranks, and the snapshot/restore
round trip through a real (tiny, CPU, single-process) Lightning fit over a fake agent link."""

import lightning as L
import pytest
import torch

from ftsup.trainer.integrations import lightning as ftsup_lightning
from ftsup.trainer.schedule import Schedule, config_from_mapping
from tests.unit.trainer.test_trainer_session import FakeClient, make_session

NODE_2 = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
          "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
SINGLE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_the_environment_gives_each_nodes_ranks_their_global_rank():
    env = ftsup_lightning.FtsupEnvironment(NODE_2)
    assert (env.global_rank(), env.local_rank(), env.node_rank(), env.world_size()) == (5, 1, 1, 8)
    assert (env.main_address, env.main_port, env.creates_processes_externally) == ("10.0.0.1", 29500, True)
    assert (env.num_nodes, env.local_world_size) == (2, 4)
    env.set_global_rank(5)
    env.set_world_size(8)
    env.validate_settings(num_devices=4, num_nodes=2)


def test_the_environment_refuses_a_trainer_shaped_otherwise_than_the_agents_world():
    env = ftsup_lightning.FtsupEnvironment(NODE_2)
    with pytest.raises(ValueError, match="devices=1, num_nodes=1.*LOCAL_WORLD_SIZE=4 on 2 node"):
        env.validate_settings(num_devices=1, num_nodes=1)
    with pytest.raises(ValueError, match="global rank 1, the agent assigned RANK=5"):
        env.set_global_rank(1)


@pytest.mark.parametrize(("change", "message"), [
    ({"RANK": "x"}, "RANK='x' is not an integer"),
    ({"RANK": "8"}, "RANK=8 must be below WORLD_SIZE=8"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    ({"WORLD_SIZE": "6"}, "not laid out node by node"),
])
def test_the_environment_rejects_bad_variables_naming_them(change, message):
    with pytest.raises(ValueError, match=message):
        ftsup_lightning.FtsupEnvironment(NODE_2 | change)


def test_ckpt_path_names_the_agents_snapshot_only_when_the_rank_resumes():
    assert ftsup_lightning.ckpt_path({"FTSUP_RESTORE_STEP": ""}) is None
    assert ftsup_lightning.ckpt_path({"FTSUP_RESTORE_STEP": "4"}) == ftsup_lightning.RESTORE_PATH
    assert ftsup_lightning.ckpt_path(make_session(FTSUP_RESTORE_STEP="4")) == ftsup_lightning.RESTORE_PATH


def test_the_checkpoint_io_refuses_the_agent_path_on_a_fresh_start():
    io = ftsup_lightning.FtsupCheckpointIO(make_session())
    with pytest.raises(RuntimeError, match="fresh start"):
        io.load_checkpoint(ftsup_lightning.RESTORE_PATH)


class Tiny(L.LightningModule):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def fit(module: Tiny, session, steps: int) -> L.Trainer:
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        **ftsup_lightning.trainer_kwargs(session, environ=SINGLE))
    data = torch.utils.data.DataLoader(torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), batch_size=2)
    trainer.fit(module, data, ckpt_path=ftsup_lightning.ckpt_path(session))
    return trainer


def test_a_snapshot_taken_in_fit_restores_through_lightnings_own_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    client = FakeClient()
    source = Tiny(seed=0)
    session = make_session(client, **{k: SINGLE[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")})
    session.schedule = Schedule(config_from_mapping({"FTSUP_SNAPSHOT_EVERY_STEPS": "1"}))  # the callback follows it
    fit(source, session, 3)
    held = [c[1] for c in client.calls if c[0] == "PutSnapshot"]
    assert [h.step for h in held] == [1, 2, 3]
    client.restore_blob = held[-1]

    target = Tiny(seed=1)
    resumed = make_session(client, FTSUP_RESTORE_STEP="3", FTSUP_GENERATION="4",
                           **{k: SINGLE[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")})
    trainer = fit(target, resumed, 3)  # restored at max_steps: Lightning's resume, then nothing to train
    assert torch.equal(target.layer.weight, source.layer.weight)
    assert trainer.global_step == 3
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 3
