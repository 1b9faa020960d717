"""One rank of an FSDP2 (`fully_shard`) step for the local-gradient digest test: real gloo, 2
processes. Writes `--out/rank-R.json`: the `GradDigester` digest of this rank's gradients (DTensor
shards), the digest of the same local shards taken by hand (`to_local()`), the digest after one bit
of this rank's shard is flipped, and the digest from a second identical step.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ftsup.trainer.digest import GradDigester, tensors_digest
from tests.support import gloo_exit


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def step(model: torch.nn.Module, rank: int) -> None:
    model.zero_grad(set_to_none=True)
    batch = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    model(batch).pow(2).mean().backward()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world)
    model = build()
    digester = GradDigester(model)
    step(model, args.rank)
    grads = [(n, q.grad) for n, q in model.named_parameters()]
    assert all(isinstance(g, DTensor) for _, g in grads), [type(g) for _, g in grads]
    digester.take_grads(model)
    taken = digester()
    by_hand = tensors_digest((n, g.to_local()) for n, g in grads)
    local = grads[0][1].to_local()
    with torch.no_grad():
        local.view(torch.int32).view(-1)[0] ^= 1 << 7  # one bit of this rank's shard
    digester.take_grads(model)
    flipped = digester()
    step(model, args.rank)
    digester.take_grads(model)
    again = digester()
    result = {"taken": taken, "by_hand": by_hand, "flipped": flipped, "again": again,
              "local_numel": [g.to_local().numel() for _, g in grads],
              "global_numel": [g.numel() for _, g in grads]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{args.rank}.json").write_text(json.dumps(result))
    gloo_exit.leave()


if __name__ == "__main__":
    main()
