"""Example: a Hugging Face `Trainer` job under ftsup, the one-line integration (`hf.attach`).

A 2-layer GPT-2 built from a config (no download) on synthetic token sequences, trained with HF's
own loop (DDP on gloo/NCCL through accelerate, linear LR schedule with warm-up, dropout on). Run by
the agent as every rank: `python -m ftsup.trainer.examples.hf_tiny --steps N --output-dir DIR`;
`--offline` runs it torchrun-style without an agent (the reference run). Rank 0 prints
`step N loss X` per step and `final loss X digest D` at the end. `--step-delay-s` slows each step
(so a test can kill a node mid-run).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from ftsup.trainer import offline
from ftsup.trainer.digest import param_digest
from ftsup.trainer.integrations import hf

VOCAB = 64


class SyntheticTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """`size` random token sequences, a pure function of `seed`."""

    def __init__(self, size: int, length: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, VOCAB, (size, length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class PrintSteps(TrainerCallback):
    """Rank 0 prints each step's loss (the harness follows a job's progress in these lines)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.last_loss = float("nan")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.last_loss = float(logs["loss"])
            if state.is_world_process_zero:
                print(f"step {state.global_step} loss {self.last_loss:.6f}", file=sys.stderr, flush=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)  # fault-injection aid: leaves a test time to kill a node mid-run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ftsup.trainer.examples.hf_tiny", description=__doc__)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--output-dir", required=True, help="HF's output directory (nothing is saved there)")
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
    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=2, logging_steps=1, save_strategy="no",
        report_to=[], seed=args.seed, use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0,
        disable_tqdm=True,
    )
    printer = PrintSteps(args.step_delay_s)
    trainer = Trainer(model=model, args=training, train_dataset=SyntheticTokens(args.samples, 16, args.seed),
                      callbacks=[printer])
    hf.attach(trainer, session=offline.offline_session(os.environ) if args.offline else None)  # the one line
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"final loss {printer.last_loss:.6f} digest {param_digest(hf.model_of(trainer))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
