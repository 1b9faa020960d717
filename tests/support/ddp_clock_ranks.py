"""One rank of a DDP job without the bit-exact comm hook (`trainer.ddp.ComputeClock`), for the
local-gradient tests: real gloo, 2 processes. Rank 1 sleeps `--slow-s` inside its forward each
step (a straggler). Writes `--out/rank-R.json`: per step the compute time ComputeClock measured
and the whole step's time (which includes waiting on the all-reduce), the local-gradient digest
the clock collected, the same digest from a plain backward of a copy of the model on the same
batch (no DDP, no communication), and the digest of the averaged gradients.
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ftsup.trainer.ddp import ComputeClock
from ftsup.trainer.digest import GradDigester, tensors_digest
from tests.support import gloo_exit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--slow-s", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", type=pathlib.Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    plain = copy.deepcopy(model)
    ddp = DistributedDataParallel(model)
    clock = ComputeClock.attach(ddp, GradDigester(model))
    plain_grads = GradDigester(plain)
    steps = []
    for step in range(1, args.steps + 1):
        batch = torch.randn(16, 32, generator=torch.Generator().manual_seed(step * 10 + args.rank))
        plain.load_state_dict(model.state_dict())
        plain.zero_grad(set_to_none=True)
        plain(batch).pow(2).mean().backward()
        plain_grads.take_grads(plain)
        model.zero_grad(set_to_none=True)
        clock.reset()
        started = time.monotonic()
        out = ddp(batch)
        if args.rank == 1:
            time.sleep(args.slow_s)  # a slow GPU: inside this rank's compute
        out.pow(2).mean().backward()  # returns after DDP's all-reduce: the step includes the wait
        ended = time.monotonic()
        assert clock.last_ready_s is not None
        steps.append({"compute_s": clock.last_ready_s - started, "step_s": ended - started,
                      "local_digest": clock.grad_digester(), "plain_digest": plain_grads(),
                      "averaged_digest": tensors_digest((n, q.grad) for n, q in model.named_parameters())})
        with torch.no_grad():
            for q in model.parameters():
                q.add_(q.grad, alpha=-0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{args.rank}.json").write_text(json.dumps(steps))
    gloo_exit.leave()


if __name__ == "__main__":
    main()
