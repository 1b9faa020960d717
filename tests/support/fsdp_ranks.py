"""One rank of an FSDP2 (`fully_shard`) training job under `Session`, for the state tests.

Run as `python -m tests.support.fsdp_ranks --rank R --world W ...` with the FTSUP_* launch
variables set: real gloo process group, real gRPC link to the test's agent. The state is a model
sharded over every rank, AdamW, an LR scheduler and a StatefulDataLoader over a DistributedSampler
(the data position), snapshotted every step and restored through `Session.restore(state)`.
Writes to --out: `batches-<gen>-<rank>.json` (the sample ids of every step) and, at --dump-at and
right after a restore, `full-<gen>-<step>.pt` (rank 0: the gathered model and optimizer state, for
comparing runs of different world sizes bit for bit). `--device cuda` puts the model and batches
on `cuda:LOCAL_RANK` and uses NCCL (tests/integration/test_cuda_paths.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DistributedSampler, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ftsup.trainer.digest import Digester
from ftsup.trainer.replicas import replica_group
from ftsup.trainer.session import Session
from tests.support import gloo_exit

SAMPLES = 256


def build(rank: int, world: int, device: torch.device | None = None) -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(device or torch.device("cpu"))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    gen = torch.Generator().manual_seed(7)
    data = TensorDataset(torch.randn(SAMPLES, 16, generator=gen), torch.randn(SAMPLES, 4, generator=gen),
                         torch.arange(SAMPLES))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=3)
    loader = StatefulDataLoader(data, batch_size=4, sampler=sampler)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "data": loader}


def dump_full(state: dict[str, object], path: pathlib.Path) -> None:
    """Collective: the whole model and optimizer state, gathered on rank 0."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model, optimizer = state["model"], state["optimizer"]
    full = {"model": get_model_state_dict(model, options=options),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=options),
            "scheduler": state["scheduler"].state_dict()}
    if dist.get_rank() == 0:
        torch.save(full, path)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--dump-at", type=int, default=-1)
    p.add_argument("--checkpoint-at", type=int, default=-1)
    p.add_argument("--lose-rank-after", type=int, default=-1, help="--lose-rank dies once this step's snapshot is held")
    p.add_argument("--lose-rank", type=int, default=1)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=60))
    state = build(args.rank, args.world, device)
    session = Session.from_env()
    generation = session.generation
    start = session.restore(state)
    if start:
        dump_full(state, args.out / f"full-{generation}-{start}.pt")
    model, optimizer, scheduler = state["model"], state["optimizer"], state["scheduler"]
    digester = Digester.of(model)
    group = replica_group(model, args.rank, args.world).id
    batches: dict[int, list[int]] = {}
    log = args.out / f"batches-{generation}-{args.rank}.json"
    batches_iter = iter(state["data"])
    step = start
    for step in range(start + 1, args.steps + 1):
        x, y, ids = next(batches_iter)
        x, y = x.to(device), y.to(device)
        batches[step] = ids.tolist()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        session.snapshot(step, state)
        session.report_step(step, 0.0, 0.0, float(loss), digester(), replica_group=group)
        if step == args.dump_at:
            dump_full(state, args.out / f"full-{generation}-{step}.pt")
        if step == args.checkpoint_at:
            session.save_checkpoint(step, state)
        if step == args.lose_rank_after:
            session.wait_for_snapshots()
            log.write_text(json.dumps(batches))
            if args.rank == args.lose_rank:
                os._exit(17)  # the lost rank: no clean-up, no goodbye
    session.finish(step, digester())
    session.close()
    log.write_text(json.dumps(batches))
    gloo_exit.leave()


if __name__ == "__main__":
    main()
