"""A plain torchrun DDP script, as a team would bring it: no ftsup import (level 0).

gloo on CPU, a tiny model; rank 0 saves its own checkpoint every few steps (atomically) and every
rank resumes from it, as under torchrun. It leaves marks for the tests: each rank's pid per restart
(so a test can SIGKILL one), where each start resumed, and a record when the job is done.
`--raise-on-restart N` makes rank 0 raise a ValueError two steps into restart N (a traceback to carry).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--step-s", type=float, default=0.2)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--marks", required=True)
    p.add_argument("--raise-on-restart", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    marks = pathlib.Path(args.marks)
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"pid.rank-{rank}.restart-{restart}").write_text(str(os.getpid()))
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = pathlib.Path(args.ckpt)
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    with open(marks / f"starts.rank-{rank}", "a") as starts:
        starts.write(f"{restart} {start}\n")
    print(f"restart {restart}: resuming at step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        batch = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(8, 4, generator=batch)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and restart == args.raise_on_restart and step == start + 2:
            raise ValueError(f"bad batch at step {step}")
        if rank == 0 and step % args.save_every == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(args.step_s)
    dist.barrier()
    if rank == 0:
        (marks / "done.json").write_text(json.dumps({"step": args.steps, "restart": restart}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
