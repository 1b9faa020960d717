"""Example: a Lightning job under ftsup (`trainer_kwargs()` into the Trainer, `ckpt_path()` into fit).

The example GPT (trainer/examples/gpt.py, tiny) on synthetic token sequences, Lightning's own loop:
DDP on gloo (NCCL on GPUs), a shuffled DataLoader (Lightning adds the DistributedSampler), AdamW with
a per-step LR schedule. Run by the agent as every rank: `python -m ftsup.trainer.examples.lightning_tiny
--steps N`; `--offline` runs it torchrun-style without an agent (the reference run). Rank 0 prints
`step N loss X` per step and `final loss X digest D` at the end; `--step-delay-s` slows each step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from ftsup.trainer import offline
from ftsup.trainer.digest import param_digest
from ftsup.trainer.examples.gpt import GPT
from ftsup.trainer.integrations import lightning as ftsup_lightning

VOCAB = 64
LENGTH = 16


class TinyGPT(L.LightningModule):
    def __init__(self, steps: int, delay_s: float) -> None:
        super().__init__()
        self.model = GPT(VOCAB, LENGTH, layers=2, d_model=32, heads=2)
        self.steps = steps
        self.delay_s = delay_s
        self.last_loss = float("nan")

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        self.last_loss = float(loss.detach())
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.is_global_zero:
            print(f"step {self.trainer.global_step} loss {self.last_loss:.6f}", file=sys.stderr, flush=True)
        if self.delay_s:
            time.sleep(self.delay_s)  # fault-injection aid: leaves a test time to kill a node mid-run

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3)
        warmup = 2
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / self.steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ftsup.trainer.examples.lightning_tiny", description=__doc__)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=40, help="dataset size (small: the run crosses epochs)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--step-delay-s", type=float, default=0.0)
    p.add_argument("--offline", action="store_true", help="no agent (torchrun-style env): the reference run")
    args = p.parse_args(argv)
    if args.steps < 1 or args.samples < 1 or args.batch_size < 1 or args.step_delay_s < 0:
        p.error("--steps, --samples and --batch-size must be >= 1, --step-delay-s >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # many ranks share few cores; also fixes the reduction order
    L.seed_everything(args.seed, verbose=False)
    data = torch.randint(0, VOCAB, (args.samples, LENGTH + 1), generator=torch.Generator().manual_seed(args.seed))
    # A tensor is a map-style dataset (len and indexing); the stubs ask for a Dataset subclass.
    loader: torch.utils.data.DataLoader[torch.Tensor] = torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, shuffle=True)  # type: ignore[arg-type]
    session = offline.offline_session(os.environ) if args.offline else None
    module = TinyGPT(args.steps, args.step_delay_s)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", strategy="ddp", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        **ftsup_lightning.trainer_kwargs(session))  # the integration, line 1
    trainer.fit(module, loader, ckpt_path=ftsup_lightning.ckpt_path())  # line 2: resume from the agent's RAM
    if trainer.is_global_zero:
        print(f"final loss {module.last_loss:.6f} digest {param_digest(module)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
