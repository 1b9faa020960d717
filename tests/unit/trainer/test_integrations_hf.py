"""ftsup.trainer.integrations.hf: the adapter's capture/restore round trip on a real (tiny, CPU,
single-process) HF Trainer over a fake agent link, and how HF's epoch loop is told that it resumes."""

import random

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from ftsup.trainer.integrations import hf
from ftsup.trainer.integrations.state import ResumePosition
from tests.unit.trainer.test_trainer_session import FakeClient, make_session


def tiny_trainer(tmp_path, seed: int) -> Trainer:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=16, bos_token_id=0, eos_token_id=0, n_positions=8, n_embd=8, n_layer=1, n_head=1))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=10, use_cpu=True, report_to=[], learning_rate=1e-2,
                             lr_scheduler_type="linear", warmup_steps=2, save_strategy="no")
    trainer = Trainer(model=model, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    trainer.optimizer = trainer.accelerator.prepare(trainer.optimizer)  # wrapped, as inside train()
    return trainer


def train_steps(trainer: Trainer, steps: int) -> None:
    for _ in range(steps):
        ids = torch.randint(0, 16, (2, 8))
        trainer.model(input_ids=ids, labels=ids).loss.backward()
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad()
    trainer.state.global_step += steps
    trainer.state.epoch = 0.75


def test_capture_then_restore_brings_back_model_optimizer_schedule_and_trainer_counters(tmp_path):
    client = FakeClient()
    source = tiny_trainer(tmp_path, seed=0)
    train_steps(source, 3)
    protected = hf.capture(source)
    assert protected.optimizer is source.optimizer.optimizer  # accelerate's wrapper unwrapped
    session = make_session(client)
    session.snapshot(3, protected.model, protected.optimizer, extra=protected.extra)
    session.wait_for_snapshots()
    client.restore_blob = client.calls[-1][1]

    target = tiny_trainer(tmp_path, seed=1)
    assert hf.restore(make_session(client, FTSUP_RESTORE_STEP="3", FTSUP_GENERATION="4"), target) == 3
    for mine, theirs in zip(source.model.parameters(), target.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert target.lr_scheduler.state_dict() == source.lr_scheduler.state_dict()
    assert target.optimizer.param_groups[0]["lr"] == source.optimizer.param_groups[0]["lr"]
    assert (target.state.global_step, target.state.epoch) == (3, 0.75)
    assert hf.restore(make_session(client), tiny_trainer(tmp_path, seed=2)) is None  # a fresh start


class LoopStub:
    """Stands in for HF's Trainer: records what its epoch loop and RNG loader are called with."""

    def __init__(self) -> None:
        self.epochs: list[dict] = []
        self.rng_loads: list[str | None] = []

    def _run_epoch(self, **kwargs):
        self.epochs.append(kwargs)
        return "ran"

    def _load_rng_state(self, checkpoint):
        self.rng_loads.append(checkpoint)


def test_the_resumed_loop_skips_finished_epochs_and_resumes_the_next_at_its_batch():
    trainer = LoopStub()
    loop = hf._ResumedLoop(trainer, ResumePosition(epoch=1, batches=3))
    loop.install()
    plain = {"resume_from_checkpoint": None, "epochs_trained": 0, "steps_trained_in_current_epoch": 0}
    assert trainer._run_epoch(epoch=0, **plain) is None and trainer.epochs == []
    assert trainer._run_epoch(epoch=1, **plain) == "ran"
    assert trainer.epochs[-1] == {"epoch": 1, "resume_from_checkpoint": hf._RESUMED, "epochs_trained": 1,
                                  "steps_trained_in_current_epoch": 3}
    loop.remove()
    assert trainer._run_epoch(epoch=0, **plain) == "ran" and trainer.epochs[-1]["resume_from_checkpoint"] is None


def test_the_resumed_loop_sets_the_restored_rngs_where_hf_would_load_them():
    trainer = LoopStub()
    random.seed(5)
    torch.manual_seed(5)
    loop = hf._ResumedLoop(trainer, ResumePosition(epoch=0, batches=0))
    expected = (random.random(), torch.rand(1))
    loop.install()
    trainer._load_rng_state(hf._RESUMED)  # the RNGs as the restore left them
    assert (random.random(), torch.rand(1)) == expected and trainer.rng_loads == []
    trainer._load_rng_state("/a/real/checkpoint")
    assert trainer.rng_loads == ["/a/real/checkpoint"]


def test_attach_refuses_a_trainer_whose_loop_it_cannot_drive_naming_the_version(tmp_path):
    class OldTrainer:
        pass

    with pytest.raises(RuntimeError, match=r"transformers .* has no _run_epoch"):
        hf.FtsupCallback(OldTrainer(), make_session())  # type: ignore[arg-type]


def test_attach_outside_ftsup_adds_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("FTSUP_AGENT_ADDRESS", raising=False)
    trainer = tiny_trainer(tmp_path, seed=0)
    before = list(trainer.callback_handler.callbacks)
    assert hf.attach(trainer) is None and trainer.callback_handler.callbacks == before
    assert "training unprotected" in capsys.readouterr().err
