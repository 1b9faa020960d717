"""One training step replayed for an SDC recompute check, inside the job's own trainer process.

The verifier's agent starts the job's trainer command with FTSUP_SDC_REPLAY naming a request file
(agent/sdc_check.py): the rank, the step S, the ranks to replay and the snapshot of step S - 1 it
fetched. The training script builds its model and optimizer as usual, loads the snapshot and
hands a `loss_of(rank)` (the rank's batch of step S through the model: deterministic data makes
it a pure function of seed, step and rank) to `replay_step`, which recomputes every asked rank's
local gradients and their digest exactly as the gradient-sync hook digests them live. When every
rank of the world is asked, it also averages them in rank order (trainer.ddp's bit-exact sum)
and takes the optimizer step, giving the parameter digest after S. Results go to a JSON file.
All replayed ranks start from the same RNG state (the snapshot's): exact for scripts that seed
every rank alike, as the example does.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ftsup.trainer import snapshot as snap
from ftsup.trainer.digest import Digester, GradDigester

REPLAY_ENV = "FTSUP_SDC_REPLAY"


class ReplayError(RuntimeError):
    """The request cannot be replayed (bad request, wrong snapshot); the message says why."""


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    check_id: str
    step: int  # the step replayed; the snapshot holds step - 1
    rank: int  # whose snapshot
    world_size: int
    ranks: tuple[int, ...]  # whose local gradients to recompute
    snapshot_path: str
    sha256: str
    out_path: str

    @property
    def is_full(self) -> bool:
        """Every rank of the world: the whole step, parameter update included."""
        return sorted(self.ranks) == list(range(self.world_size))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReplayRequest | None:
        """The request this process was started for, or None for a normal training run."""
        path = (os.environ if environ is None else environ).get(REPLAY_ENV, "")
        if not path:
            return None
        try:
            raw = json.loads(pathlib.Path(path).read_text())
            request = cls(str(raw["check_id"]), int(raw["step"]), int(raw["rank"]), int(raw["world_size"]),
                          tuple(int(r) for r in raw["ranks"]), str(raw["snapshot_path"]), str(raw["sha256"]),
                          str(raw["out_path"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ReplayError(f"cannot read the replay request {path}: {exc}") from exc
        if request.step < 1 or not request.ranks or not all(0 <= r < request.world_size for r in request.ranks):
            raise ReplayError(f"replay request {path} is not replayable: {request}")
        return request

    def load(self) -> dict[str, Any]:
        """The decoded snapshot of step - 1 (its SHA-256 checked)."""
        state = snap.decode(pathlib.Path(self.snapshot_path).read_bytes(), self.sha256)
        if state["step"] != self.step - 1:
            raise ReplayError(f"snapshot holds step {state['step']}, the replay of step {self.step} needs {self.step - 1}")
        return state


@dataclass(frozen=True, slots=True)
class ReplayedRank:
    rank: int
    grad_digest: str
    param_digest: str  # after the step; "" unless the whole step was replayed
    loss: float


def replay_step(request: ReplayRequest, state: dict[str, Any], model: torch.nn.Module,
                optimizer: torch.optim.Optimizer, loss_of: Callable[[int], torch.Tensor]) -> list[ReplayedRank]:
    """Recomputes the asked ranks' local gradients of `request.step` from `state` (see module doc)."""
    snap.apply_state(state, model, optimizer)
    grads = GradDigester(model)
    summed: dict[str, torch.Tensor] = {}
    results: list[tuple[int, str, float]] = []
    for rank in sorted(request.ranks):  # rank order: the sum below must add as trainer.ddp does
        snap.restore_rng(state)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(rank)
        loss.backward()
        grads.take_grads(model)
        results.append((rank, grads(), float(loss.item())))
        if request.is_full:
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if param.grad is None:
                        continue
                    if name in summed:
                        summed[name].add_(param.grad)
                    else:
                        summed[name] = param.grad.detach().clone()
    param_digest = ""
    if request.is_full:
        for name, param in model.named_parameters():
            param.grad = summed[name].div_(request.world_size) if name in summed else None
        optimizer.step()
        param_digest = Digester.of(model)()
    return [ReplayedRank(rank, grad, param_digest, loss) for rank, grad, loss in results]


def write_result(request: ReplayRequest, replayed: list[ReplayedRank], started_s: float) -> None:
    """The answer for the agent: written to a temporary name and renamed, so it is whole or absent."""
    out = pathlib.Path(request.out_path)
    body = {
        "check_id": request.check_id, "step": request.step, "rank": request.rank,
        "recomputed": [{"rank": r.rank, "grad_digest": r.grad_digest, "param_digest": r.param_digest, "loss": r.loss}
                       for r in replayed],
        "replay_s": time.monotonic() - started_s,
    }
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(out)
