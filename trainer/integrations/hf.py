"""ftsup for Hugging Face `transformers.Trainer`: one line, `ftsup.trainer.integrations.hf.attach(trainer)`.

Owns the callback that reports each optimizer step to the agent, snapshots the rank's state to RAM
(the agent and its buddy) and restores it when the agent says the rank resumes. The state goes
through one adapter pair, `capture`/`restore`, onto today's `Session` surface (model and torch
optimizer natively; LR scheduler, TrainerState counters, AMP scaler and numpy RNG as `extra`).

Restored in `on_train_begin`, once the Trainer has built its optimizer and scheduler: model,
optimizer, LR scheduler, `state.global_step`/`epoch`/`total_flos`/`num_input_tokens_seen`, the AMP
grad scaler, and every RNG. HF's epoch loop does not know it resumed (it learns that only from a
checkpoint directory), so for that `train()` call the callback tells it through the two methods
its own resume uses (`_run_epoch` with the resumed epoch and batches to skip, `_load_rng_state`):
finished epochs are skipped, the resumed epoch skips the batches already consumed exactly as
`train(resume_from_checkpoint=...)` does, and the RNGs are set where HF sets them. Not restored:
`state.log_history`, best-metric bookkeeping, stateful callbacks' state (early stopping), a
DeepSpeed/FSDP engine's sharded state (one rank's full optimizer only), a stateful dataset's cursor.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import time
from typing import Any

import numpy as np
import torch
import transformers
from transformers import (
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from ftsup.trainer.digest import Digester, param_digest
from ftsup.trainer.integrations.state import (
    Protected,
    ResumePosition,
    check_snapshot_every,
    is_snapshot_step,
    plain,
    resume_position,
    rng_state,
    set_rng_state,
)
from ftsup.trainer.session import Session

__all__ = ["FtsupCallback", "attach", "capture", "restore"]

EXTRA_KEY = "hf"
# What `_run_epoch` is called with in the transformers versions this resume was written against (5.x).
_RUN_EPOCH_PARAMS = frozenset({"epoch", "resume_from_checkpoint", "epochs_trained", "steps_trained_in_current_epoch"})
_RESUMED = "ftsup:restored-from-agent"  # stands for the checkpoint directory HF would have resumed from


# -- the adapter: the only code that knows how HF's state maps onto a snapshot -----------------------

def capture(trainer: Trainer) -> Protected:
    """This rank's state after `trainer.state.global_step` optimizer steps, as a snapshot takes it."""
    state = trainer.state
    scheduler = trainer.lr_scheduler
    scaler = getattr(trainer.accelerator, "scaler", None)
    extra = {
        EXTRA_KEY: {
            "global_step": int(state.global_step),
            "epoch": float(state.epoch or 0.0),
            "total_flos": float(state.total_flos),
            "num_input_tokens_seen": int(state.num_input_tokens_seen),
            "lr_scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "numpy_rng": _numpy_rng_state(),
        }
    }
    return Protected(model=model_of(trainer), optimizer=torch_optimizer(trainer.optimizer), extra=plain(extra))


def restore(session: Session, trainer: Trainer) -> int | None:
    """Loads the agent's snapshot into the Trainer's model, optimizer, scheduler and state; returns
    its step, or None on a fresh start. Call once the optimizer and scheduler exist."""
    if session.launch.restore_step is None:
        return None
    step = session.restore(trainer.model, torch_optimizer(trainer.optimizer))
    extra = session.restored_extra
    held = extra.get(EXTRA_KEY) if isinstance(extra, dict) else None
    if held is None:
        raise RuntimeError(f"rank {session.rank}: the snapshot of step {step} holds no Trainer state (not taken by this callback)")
    if held["lr_scheduler"] is not None:
        if trainer.lr_scheduler is None:
            raise RuntimeError(f"the snapshot of step {step} holds an LR scheduler but the Trainer has none")
        trainer.lr_scheduler.load_state_dict(held["lr_scheduler"])
    scaler = getattr(trainer.accelerator, "scaler", None)
    if held["scaler"] is not None and scaler is not None:
        scaler.load_state_dict(held["scaler"])
    state = trainer.state
    state.global_step = step
    state.epoch = held["epoch"]
    state.total_flos = held["total_flos"]
    state.num_input_tokens_seen = held["num_input_tokens_seen"]
    _set_numpy_rng_state(held["numpy_rng"])
    return step


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under accelerate's wrapper (its step hooks and state dict are the real ones)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"the Trainer's optimizer is a {type(inner).__name__}, not a torch.optim.Optimizer")
    return inner


def model_of(trainer: Trainer) -> torch.nn.Module:
    """The Trainer's model (a Trainer built without one cannot train, hence cannot be protected)."""
    if trainer.model is None:
        raise ValueError("the Trainer has no model")
    return trainer.model


def _numpy_rng_state() -> list[Any]:
    state = np.random.get_state(legacy=True)
    if isinstance(state, dict):  # legacy=True gives the tuple for the default MT19937 generator
        raise TypeError(f"numpy's global generator is a {state.get('bit_generator')!r}, not MT19937: cannot capture it")
    kind, keys, pos, has_gauss, cached = state
    return [str(kind), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]


def _set_numpy_rng_state(held: list[Any]) -> None:
    kind, keys, pos, has_gauss, cached = held
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


# -- the callback ------------------------------------------------------------------------------------

class FtsupCallback(TrainerCallback):
    """Step reports, RAM snapshots on the session's cadence (or every `snapshot_every` steps), object-store checkpoints when the
    supervisor asks, restore at `on_train_begin`, completion at `on_train_end`. Made by `attach`."""

    def __init__(self, trainer: Trainer, session: Session, snapshot_every: int | None = None,
                 owns_session: bool = True) -> None:
        check_snapshot_every(snapshot_every)
        _check_supported(trainer)
        self.trainer = trainer
        self.session = session
        self.snapshot_every = snapshot_every
        self.restored_step: int | None = None
        self._owns_session = owns_session
        self._resume: _ResumedLoop | None = None
        self._digest: Digester | None = None
        self._started = 0.0
        self._waited_s = 0.0
        self._loss_before: torch.Tensor | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.restored_step = restore(self.session, self.trainer)
        if self.restored_step is not None:
            position = resume_position(self.restored_step, _update_steps_per_epoch(args, state, kwargs.get("train_dataloader")),
                                       args.gradient_accumulation_steps)
            if args.ignore_data_skip:
                position = ResumePosition(position.epoch, 0)
            self._resume = _ResumedLoop(self.trainer, position)
            self._resume.install()
            for name in ("_globalstep_last_logged", "_initial_global_step"):  # logged loss and throughput
                if hasattr(self.trainer, name):
                    setattr(self.trainer, name, self.restored_step)
            print(f"ftsup: rank {self.session.rank} restored step {self.restored_step} from its agent; resuming at epoch"
                  f" {position.epoch} after {position.batches} batches", file=sys.stderr, flush=True)
        self._digest = Digester.of(model_of(self.trainer))

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._started = time.monotonic()
        # The previous step's snapshot must be held (here and at the buddy) before this step's
        # gradients are synchronised: a failure then loses at most one step.
        self._waited_s = self.session.snapshot_barrier()
        accumulated = getattr(self.trainer, "_tr_loss", None)
        self._loss_before = accumulated.detach().clone() if isinstance(accumulated, torch.Tensor) else None

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        step = state.global_step
        ended = time.monotonic()
        self.session.report_step(step, ended - self._started, max(0.0, ended - self._started - self._waited_s),
                                 self._step_loss(), self._digest() if self._digest is not None else "")
        if self.session.checkpoint_due(step):  # collective; the supervisor's cadence or `checkpoint now`
            protected = capture(self.trainer)
            self.session.save_checkpoint(step, protected.model, protected.optimizer, protected.extra)
        if is_snapshot_step(self.session, step, self.snapshot_every):
            protected = capture(self.trainer)
            self.session.snapshot(step, protected.model, protected.optimizer, extra=protected.extra)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._resume is not None:
            self._resume.remove()
            self._resume = None
        self.session.finish(state.global_step, param_digest(model_of(self.trainer)))
        if self._owns_session:
            self.session.close()

    def _step_loss(self) -> float:
        """This step's loss as HF accumulates it for its logs (mean over its micro-batches)."""
        accumulated = getattr(self.trainer, "_tr_loss", None)
        if self._loss_before is None or not isinstance(accumulated, torch.Tensor):
            return math.nan
        return float((accumulated.detach() - self._loss_before).item())


def attach(trainer: Trainer, session: Session | None = None, snapshot_every: int | None = None) -> FtsupCallback | None:
    """Adds ftsup's callback to `trainer`; call it before `trainer.train()`. Without a session and
    outside ftsup (no FTSUP_AGENT_ADDRESS: plain torchrun or python) it adds nothing and says so,
    so one script runs both ways."""
    owns = session is None
    if session is None:
        if not os.environ.get("FTSUP_AGENT_ADDRESS"):
            print("ftsup: FTSUP_AGENT_ADDRESS is not set (not started by an ftsup agent): training unprotected",
                  file=sys.stderr, flush=True)
            return None
        session = Session.from_env()
    callback = FtsupCallback(trainer, session, snapshot_every=snapshot_every, owns_session=owns)
    trainer.add_callback(callback)
    return callback


# -- HF's epoch loop, told that it resumes -----------------------------------------------------------

class _ResumedLoop:
    """For one `train()` call, makes HF's loop continue from `position` as its own resume would:
    `_run_epoch` is called as for `train(resume_from_checkpoint=...)` (finished epochs skipped, the
    batches of the resumed epoch skipped by HF's own `skip_first_batches`), and `_load_rng_state`
    sets the RNGs restored from the snapshot at the moment HF would load them from the checkpoint.
    Instance attributes shadow the methods; `remove` drops them."""

    def __init__(self, trainer: Trainer, position: ResumePosition) -> None:
        self.trainer = trainer
        self.position = position
        self.rng = rng_state()  # as the restore left them
        self.numpy_rng = _numpy_rng_state()
        self._run_epoch = trainer._run_epoch
        self._load_rng_state = trainer._load_rng_state

    def install(self) -> None:
        self.trainer._run_epoch = self.run_epoch  # type: ignore[method-assign, assignment]
        self.trainer._load_rng_state = self.load_rng_state  # type: ignore[method-assign]

    def remove(self) -> None:
        for name in ("_run_epoch", "_load_rng_state"):
            self.trainer.__dict__.pop(name, None)

    def run_epoch(self, **kwargs: Any) -> Any:
        if kwargs["epoch"] < self.position.epoch:
            return None  # finished before the snapshot (HF's resume starts its loop past it)
        kwargs.update(resume_from_checkpoint=_RESUMED, epochs_trained=self.position.epoch,
                      steps_trained_in_current_epoch=self.position.batches)
        return self._run_epoch(**kwargs)

    def load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint != _RESUMED:
            self._load_rng_state(checkpoint)
            return
        set_rng_state(self.rng)
        _set_numpy_rng_state(self.numpy_rng)


def _check_supported(trainer: Trainer) -> None:
    """Fails at attach time, not at the first restore, when this Trainer's loop is not the one the
    resume speaks to."""
    run_epoch = getattr(trainer, "_run_epoch", None)
    if run_epoch is None or not hasattr(trainer, "_load_rng_state") or \
            not set(inspect.signature(run_epoch).parameters) >= _RUN_EPOCH_PARAMS:
        raise RuntimeError(
            f"transformers {transformers.__version__}: this Trainer has no _run_epoch({', '.join(sorted(_RUN_EPOCH_PARAMS))})"
            " and _load_rng_state, which ftsup's resume drives; ftsup[hf] supports transformers >=5.23,<6"
        )


def _update_steps_per_epoch(args: TrainingArguments, state: TrainerState, dataloader: Any) -> int:
    """Optimizer steps per epoch, as HF counts them (an unsized loader: one epoch of max_steps)."""
    try:
        batches = len(dataloader)
    except TypeError:
        return max(int(state.max_steps), 1)
    accumulation = args.gradient_accumulation_steps
    return max(batches // accumulation + int(batches % accumulation > 0), 1)
