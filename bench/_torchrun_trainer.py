"""The torchrun baseline of `ftsup bench recovery`: the example GPT with a plain disk checkpoint.

Same model, data, batch and gradient averaging as trainer/examples/gpt.py (its argument defaults
are reused), without ftsup: rank 0 `torch.save`s model + optimizer + step to a file every
`--checkpoint-every` steps (written to a temporary name, then renamed), and every rank of a
(re)started attempt `torch.load`s it. This is the recipe torchrun's `--max-restarts` relies on.
Rank 0 appends `step N` to `--dir/progress-<attempt>.log` after every step; each rank writes
its pid to `--dir/pids/rank-<rank>` so the bench can kill one.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ftsup.trainer.core import data
from ftsup.trainer.ddp import DeterministicGradSync
from ftsup.trainer.examples.gpt import GPT
from ftsup.trainer.examples.gpt import parse_args as gpt_args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/_torchrun_trainer.py")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--dir", type=pathlib.Path, required=True)
    ours = p.parse_args(argv)
    args = gpt_args(["--steps", str(ours.steps), "--seed", str(ours.seed)])  # the example's defaults
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    (ours.dir / "pids").mkdir(parents=True, exist_ok=True)
    (ours.dir / "pids" / f"rank-{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    tokens = torch.tensor(data.encode(data.generate_corpus(args.seed)), dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(data.VOCAB_SIZE, args.seq_len, args.layers, args.d_model, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpoint = ours.dir / "checkpoint.pt"
    done = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        done = int(state["step"])
    ddp = DistributedDataParallel(model)
    grad_sync = DeterministicGradSync.attach(ddp, layout_independent=True)
    window = torch.arange(args.seq_len + 1)
    progress = open(ours.dir / f"progress-{attempt}.log", "a") if rank == 0 else None  # noqa: SIM115

    for step in range(done + 1, ours.steps + 1):
        grad_sync.reset()
        offsets = data.batch_offsets(args.seed, step, rank, args.batch_size, args.seq_len, len(tokens))
        batch = tokens[torch.tensor(offsets)[:, None] + window]
        logits = ddp(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0:
            if step % ours.checkpoint_every == 0:
                partial = checkpoint.with_suffix(".tmp")
                torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
                os.replace(partial, checkpoint)
            assert progress is not None
            progress.write(f"step {step} loss {loss.item():.4f}\n")
            progress.flush()
    if progress is not None:
        progress.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
