"""ftsup for Lightning: `L.Trainer(..., **trainer_kwargs())` and `trainer.fit(..., ckpt_path=ckpt_path())`.

Owns three pieces. `FtsupEnvironment`, a cluster environment reading the rank variables the agent
sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so every node's
ranks get their real global rank (Lightning's default environment would take NODE_RANK, which ftsup
does not set, as 0 on every node). `FtsupCallback`, which reports each optimizer step and hands a
snapshot to the agent in `on_train_batch_end`. `FtsupCheckpointIO`, through which Lightning's own
resume (`fit(ckpt_path=...)`) reads the snapshot from the agent's RAM instead of a file, so model,
optimizers, LR schedulers, loop progress (global step, epoch, batch), callbacks' and the datamodule's
state and the precision plugin are restored by Lightning itself, in its order. The snapshot is
Lightning's checkpoint dict (`capture`): model and first optimizer through `Session.snapshot`, the
rest as `extra`. A plain (not `state_dict`-able) train loader restarts its epoch on Lightning's
resume; the callback skips the batches already consumed (`on_train_start`), so the data order is the
uninterrupted run's. Not restored: hyper-parameters (the script builds the module) and the state of
an unsized or stateful-less iterable dataset.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ftsup.trainer.digest import Digester, param_digest
from ftsup.trainer.integrations.state import (
    Protected,
    RestoredParts,
    check_snapshot_every,
    framework_state,
    is_snapshot_step,
    plain,
    restore_parts,
    set_rng_state,
)
from ftsup.trainer.session import Session

__all__ = ["FtsupCallback", "FtsupCheckpointIO", "FtsupEnvironment", "capture", "ckpt_path", "restore",
           "trainer_kwargs"]

RESTORE_PATH = "ftsup://agent-snapshot"  # the ckpt_path that makes FtsupCheckpointIO read the agent's copy
# Checkpoint keys the snapshot leaves out: the model and first optimizer travel natively, and
# hyper-parameters may be any object (the script builds the module anyway).
_NATIVE = frozenset({"state_dict", "optimizer_states"})
_HPARAMS = frozenset({"hyper_parameters", "hparams_name", "hparams_type", "datamodule_hyper_parameters",
                      "datamodule_hparams_name", "datamodule_hparams_type"})


# -- the adapter: the only code that knows how Lightning's state maps onto a snapshot -----------------

def capture(trainer: Trainer) -> Protected:
    """This rank's state as a snapshot takes it: Lightning's own checkpoint dict, split."""
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    optimizers = list(trainer.optimizers)
    if not optimizers:
        raise RuntimeError("ftsup snapshots need an optimizer: the LightningModule configured none")
    extra = {k: v for k, v in checkpoint.items() if k not in _NATIVE and k not in _HPARAMS}
    extra["more_optimizer_states"] = checkpoint.get("optimizer_states", [])[1:]
    return Protected(model=trainer.lightning_module, optimizer=optimizers[0], extra={"lightning": plain(extra)})


def restore(session: Session) -> tuple[dict[str, Any], RestoredParts] | None:
    """Lightning's checkpoint dict rebuilt from the agent's snapshot (and the raw parts), or None on
    a fresh start."""
    parts = restore_parts(session)
    if parts is None:
        return None
    held = parts.extra.get("lightning") if isinstance(parts.extra, dict) else None
    if held is None:
        raise RuntimeError(f"rank {session.rank}: the snapshot of step {parts.step} holds no Lightning state"
                           " (not taken by ftsup's Lightning callback)")
    checkpoint = {k: v for k, v in held.items() if k != "more_optimizer_states"}
    checkpoint["state_dict"] = parts.model_state
    checkpoint["optimizer_states"] = [parts.optimizer_state, *held["more_optimizer_states"]]
    return checkpoint, parts


# -- the cluster environment -------------------------------------------------------------------------

class FtsupEnvironment(ClusterEnvironment):
    """Ranks and the rendezvous address as the agent set them; processes are started by the agent."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._rank = _int(env, "RANK", 0)
        self._world_size = _int(env, "WORLD_SIZE", 1)
        self._local_rank = _int(env, "LOCAL_RANK", 0)
        self._local_world_size = _int(env, "LOCAL_WORLD_SIZE", 1)
        self._address = env.get("MASTER_ADDR", "")
        self._port = _int(env, "MASTER_PORT", 1)
        if not self._address:
            raise ValueError("environment variable MASTER_ADDR is not set")
        if self._rank >= self._world_size or self._local_rank >= self._local_world_size:
            raise ValueError(f"RANK={self._rank} must be below WORLD_SIZE={self._world_size} and LOCAL_RANK="
                             f"{self._local_rank} below LOCAL_WORLD_SIZE={self._local_world_size}")
        if self._world_size % self._local_world_size or (self._rank - self._local_rank) % self._local_world_size:
            raise ValueError(f"RANK={self._rank}, LOCAL_RANK={self._local_rank}, LOCAL_WORLD_SIZE={self._local_world_size},"
                             f" WORLD_SIZE={self._world_size}: ranks are not laid out node by node")

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return self._address

    @property
    def main_port(self) -> int:
        return self._port

    @staticmethod
    def detect() -> bool:
        return bool(os.environ.get("FTSUP_AGENT_ADDRESS")) and all(
            os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))

    @property
    def num_nodes(self) -> int:
        return self._world_size // self._local_world_size

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        if size != self._world_size:
            raise ValueError(f"Lightning computed a world of {size} processes, the agent started {self._world_size}:"
                             f" pass num_nodes={self.num_nodes}, devices={self._local_world_size} (trainer_kwargs() does)")

    def global_rank(self) -> int:
        return self._rank

    def set_global_rank(self, rank: int) -> None:
        if rank != self._rank:
            raise ValueError(f"Lightning computed global rank {rank}, the agent assigned RANK={self._rank}")

    def local_rank(self) -> int:
        return self._local_rank

    def node_rank(self) -> int:
        return (self._rank - self._local_rank) // self._local_world_size

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if num_devices != self._local_world_size or num_nodes != self.num_nodes:
            raise ValueError(f"Trainer(devices={num_devices}, num_nodes={num_nodes}) does not match the agent's"
                             f" LOCAL_WORLD_SIZE={self._local_world_size} on {self.num_nodes} node(s)")


def _int(env: Mapping[str, str], name: str, low: int) -> int:
    raw = env.get(name, "")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < low:
        raise ValueError(f"environment variable {name}={value} must be >= {low}")
    return value


# -- the resume path ---------------------------------------------------------------------------------

class FtsupCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O, except that `RESTORE_PATH` is read from the agent's snapshot."""

    def __init__(self, session: Session | None) -> None:
        super().__init__()
        self.session = session
        self.restored: RestoredParts | None = None

    def load_checkpoint(self, path: _PATH, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if str(path) != RESTORE_PATH:
            return super().load_checkpoint(path, weights_only=weights_only)
        if self.session is None:
            raise RuntimeError(f"ckpt_path={RESTORE_PATH!r} needs an ftsup session (started by an agent)")
        restored = restore(self.session)
        if restored is None:
            raise RuntimeError(f"ckpt_path={RESTORE_PATH!r} but the agent asked for a fresh start (FTSUP_RESTORE_STEP empty)")
        checkpoint, self.restored = restored
        return checkpoint


class FtsupCallback(Callback):
    """Step reports after each optimizer step, RAM snapshots on the session's cadence (or every
    `snapshot_every` steps); completion at the end of `fit`."""

    def __init__(self, session: Session | None, checkpoint_io: FtsupCheckpointIO, snapshot_every: int | None = None,
                 owns_session: bool = True) -> None:
        check_snapshot_every(snapshot_every)
        self.session = session
        self.checkpoint_io = checkpoint_io
        self.snapshot_every = snapshot_every
        self.skipped_batches = 0
        self._owns_session = owns_session
        self._digest: Digester | None = None
        self._last_step = -1
        self._started = 0.0
        self._waited_s = 0.0

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        restored = self.checkpoint_io.restored
        if restored is not None:
            # Lightning's resume may have drawn random numbers since the snapshot was read: set them
            # as they were after the snapshot's step.
            set_rng_state(restored.rng)
            self.skipped_batches = _skip_consumed_batches(trainer)
            print(f"ftsup: rank {trainer.global_rank} resumed step {trainer.global_step} from its agent"
                  f" (epoch {trainer.current_epoch}, {self.skipped_batches} batches skipped)", file=sys.stderr, flush=True)
        self._digest = Digester.of(pl_module)
        self._last_step = trainer.global_step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._started = time.monotonic()
        if self.session is not None:
            # The previous snapshot must be held before this step's gradients are synchronised.
            self._waited_s = self.session.snapshot_barrier()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if self.session is None or step == self._last_step:
            return  # no session, or a batch that only accumulated gradients
        self._last_step = step
        ended = time.monotonic()
        self.session.report_step(step, ended - self._started, max(0.0, ended - self._started - self._waited_s),
                                 _loss_of(outputs), self._digest() if self._digest is not None else "")
        if self.session.checkpoint_due(step):
            protected = capture(trainer)
            self.session.save_checkpoint(step, framework_state(protected), extra=protected.extra)
        if is_snapshot_step(self.session, step, self.snapshot_every):
            protected = capture(trainer)
            self.session.snapshot(step, framework_state(protected), extra=protected.extra)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.session is None:
            return
        self.session.finish(trainer.global_step, param_digest(pl_module))
        if self._owns_session:
            self.session.close()


def _loss_of(outputs: Any) -> float:
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return float(loss.detach().item()) if isinstance(loss, torch.Tensor) else float("nan")


def _skip_consumed_batches(trainer: Trainer) -> int:
    """Lightning resumes a plain loader at the start of its epoch while counting the batches the
    snapshot had consumed as done: take those batches off the iterator, so the rest of the epoch is
    the uninterrupted run's. A loader with `state_dict` was restored by Lightning itself."""
    fit_loop = trainer.fit_loop
    combined = fit_loop._combined_loader
    fetcher = fit_loop._data_fetcher
    if combined is None or fetcher is None:
        return 0
    if all(callable(getattr(dl, "state_dict", None)) and callable(getattr(dl, "load_state_dict", None))
           for dl in combined.flattened):
        return 0
    # The batch loop's tracker is a _ProcessedTracker at run time; its declared type is the base class.
    consumed: int = fit_loop.epoch_loop.batch_progress.current.processed  # type: ignore[attr-defined]
    iterator = fetcher.iterator
    if consumed == 0:
        return 0
    if iterator is None:
        raise RuntimeError(f"Lightning's data fetcher has no iterator yet: cannot skip the {consumed} batches"
                           " the restored snapshot had consumed")
    for _ in range(consumed):
        next(iterator)
    return consumed


# -- what a script adds ------------------------------------------------------------------------------

def trainer_kwargs(session: Session | None = None, snapshot_every: int | None = None,
                   environ: Mapping[str, str] | None = None,
                   ) -> dict[str, Any]:
    """`L.Trainer(**trainer_kwargs(), ...)`: the cluster environment, the checkpoint I/O, the
    callback, num_nodes and devices from the agent's variables. Outside ftsup (no
    FTSUP_AGENT_ADDRESS and no session) only the cluster environment: the script runs unprotected."""
    env = os.environ if environ is None else environ
    owns = session is None
    if session is None and env.get("FTSUP_AGENT_ADDRESS"):
        session = Session.from_env(env)
    elif session is None:
        print("ftsup: FTSUP_AGENT_ADDRESS is not set (not started by an ftsup agent): training unprotected",
              file=sys.stderr, flush=True)
    cluster = FtsupEnvironment(env)
    io = FtsupCheckpointIO(session)
    plugins: list[Any] = [cluster, io]
    callbacks: list[Any] = [FtsupCallback(session, io, snapshot_every=snapshot_every, owns_session=owns)]
    return {"plugins": plugins, "callbacks": callbacks, "num_nodes": cluster.num_nodes,
            "devices": cluster.local_world_size}


def ckpt_path(session_or_env: Session | Mapping[str, str] | None = None) -> str | None:
    """`trainer.fit(..., ckpt_path=ckpt_path())`: the agent's snapshot when the agent says this rank
    resumes (FTSUP_RESTORE_STEP set), else None (a fresh start)."""
    if isinstance(session_or_env, Session):
        return RESTORE_PATH if session_or_env.launch.restore_step is not None else None
    env = os.environ if session_or_env is None else session_or_env
    return RESTORE_PATH if env.get("FTSUP_RESTORE_STEP", "") != "" else None
