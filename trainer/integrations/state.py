"""What the framework integrations share: the protected state, checks on it, and resume arithmetic.

Imports torch and the trainer library only (never transformers or lightning). `Protected` is what
an adapter hands to `Session.snapshot`; `plain` checks, when the snapshot is taken rather than
when a restore fails, that a framework's extra state holds only what `torch.load(weights_only=True)`
reads back; `restore_parts` takes a snapshot's pieces out of the agent through `Session.restore`
without live objects to load them into (Lightning restores from a checkpoint dict before its
optimizers exist); `resume_position` is where a restored step sits in a framework's epochs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ftsup.trainer.session import Session

# What torch.load(weights_only=True) reads back besides tensors and containers.
_SCALARS = (bool, int, float, str, bytes, type(None))


@dataclass(frozen=True, slots=True)
class Protected:
    """The state one rank hands to its agent: `Session.snapshot(step, model, optimizer, extra)`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    extra: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RestoredParts:
    """A snapshot's pieces, not yet loaded anywhere."""

    step: int
    model_state: dict[str, Any]
    optimizer_state: dict[str, Any]
    extra: Any
    rng: dict[str, Any]  # the process RNGs as the snapshot left them (set again at the framework's point)


@dataclass(frozen=True, slots=True)
class ResumePosition:
    """Where `global_step` optimizer steps end in a framework that counts epochs of batches."""

    epoch: int  # epochs fully done
    batches: int  # batches (micro-batches) of `epoch` already consumed


def plain(value: Any, path: str = "extra") -> Any:
    """`value` with every mapping turned into a plain dict; raises TypeError (naming the path and
    the type) for anything a weights-only load cannot read, e.g. a pickled object or a numpy array."""
    if isinstance(value, (torch.Tensor, *_SCALARS)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{path} has a key of type {type(key).__name__} ({key!r}); snapshots keep str/int keys")
            out[key] = plain(item, f"{path}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        items = [plain(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}: a snapshot holds only tensors,"
        " numbers, strings, None, dicts, lists and tuples (a weights-only load refuses pickled objects)"
    )


def resume_position(global_step: int, update_steps_per_epoch: int, accumulation: int = 1) -> ResumePosition:
    """Epochs done and batches to skip in the next one after `global_step` optimizer steps, for a
    loop of `update_steps_per_epoch` steps of `accumulation` batches each (the rule HF's own resume uses)."""
    if global_step < 0 or update_steps_per_epoch < 1 or accumulation < 1:
        raise ValueError(
            f"global_step={global_step} must be >= 0, update_steps_per_epoch={update_steps_per_epoch}"
            f" and accumulation={accumulation} >= 1"
        )
    epoch, steps = divmod(global_step, update_steps_per_epoch)
    return ResumePosition(epoch=epoch, batches=steps * accumulation)


def rng_state() -> dict[str, Any]:
    """The process RNGs (torch CPU, CUDA when initialized, python), to set again later."""
    return {
        "torch_cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "python": random.getstate(),
    }


def set_rng_state(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch_cpu"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    random.setstate(rng["python"])


class _FrameworkStateDict:
    """A model or optimizer as its framework saves and loads it: `state_dict()` kept verbatim
    (the optimizer's state keyed by parameter index, as `Optimizer.load_state_dict` and Lightning's
    checkpoint dict expect), instead of torch's distributed state-dict API keyed by parameter name.
    For unsharded models only: a sharded one goes through `Session.snapshot` directly."""

    def __init__(self, obj: Any = None) -> None:
        self.obj = obj
        self.held: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self.obj.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.held = state_dict


def framework_state(protected: Protected) -> dict[str, Any]:
    """The state to hand `Session.snapshot` / `save_checkpoint` when `restore_parts` will read it back."""
    return {"model": _FrameworkStateDict(protected.model), "optimizer": _FrameworkStateDict(protected.optimizer)}


def restore_parts(session: Session) -> RestoredParts | None:
    """The snapshot the agent holds for this rank (taken with `framework_state`) as pieces, or None
    on a fresh start. Sets the process RNGs as `Session.restore` does; `rng` holds them to set again
    at the right point."""
    if session.launch.restore_step is None:
        return None
    model, optimizer = _FrameworkStateDict(), _FrameworkStateDict()
    step = session.restore({"model": model, "optimizer": optimizer})
    if model.held is None or optimizer.held is None:
        raise RuntimeError(f"rank {session.rank}: the restore of step {step} loaded no model or optimizer state")
    return RestoredParts(step=step, model_state=model.held, optimizer_state=optimizer.held,
                         extra=session.restored_extra, rng=rng_state())


def check_snapshot_every(snapshot_every: int | None) -> None:
    """None: the session's cadence; 0: never; k > 0: every k-th global step."""
    if snapshot_every is not None and (isinstance(snapshot_every, bool) or snapshot_every < 0):
        raise ValueError(f"snapshot_every must be None (the session's cadence), 0 (never) or > 0, got {snapshot_every!r}")


def is_snapshot_step(session: Session, step: int, snapshot_every: int | None) -> bool:
    """Does a callback snapshot after `step`? By default (None) the session decides: its cadence
    (FTSUP_SNAPSHOT_EVERY_STEPS, or auto: about FTSUP_SNAPSHOT_INTERVAL_S of training between
    snapshots; docs/state.md), which is collective at snapshot steps, so every rank asks at every
    step. An explicit k keeps the fixed every-k-th-step schedule."""
    if snapshot_every is None:
        return session.snapshot_due(step)
    return snapshot_every > 0 and step % snapshot_every == 0
