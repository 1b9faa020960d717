"""The training script of `ftsup bench peers`: the example GPT, one flavour per tool it runs under.

Same model, data, batch and optimizer as trainer/examples/gpt.py (its argument defaults are
reused) for every tool; what differs is only what each tool's documentation asks a script to do:

- `plain`: DDP, nothing else (the overhead baseline).
- `disk`: DDP + rank 0 `torch.save`s a checkpoint every `--checkpoint-every` steps, every rank
  loads it on (re)start: the recipe torchrun's `--max-restarts` and `ftsup run` (Level 0) rely on.
- `dlrover`: DDP + DLRover Flash Checkpoint (`DdpCheckpointer`): a memory save every step, a disk
  save every `--checkpoint-every` steps, `load_checkpoint()` on (re)start (memory first).
- `nvrx`: `disk` + NVIDIA Resiliency Extension rank heartbeats (`RankMonitorClient`) under
  `ft_launcher`.
- `nvrx-inprocess`: `disk` inside NVRx's in-process restart wrapper (`inprocess.Wrapper`, the
  recipe of its `optimal_example.py`): model, optimizer and a TCPStore made once per process, the
  wrapped function restarted in the same process after a fault, with a fresh gloo group on a
  per-restart `PrefixStore`, reloading the disk checkpoint. `--active-world` ranks train, the rest
  wait as NVRx reserve ranks and are activated when an active rank is lost.
- `torchft`: one replica group per process: torchft's `Manager` (Lighthouse quorum, live
  recovery of a joining group from a healthy one), its DDP and optimizer wrappers.

Peer libraries are imported only by their flavour: this file runs in the peers' venv
(`--peers-python`). Rank 0 (of replica group 0 for torchft) appends `step N world W t T` to
`--dir/progress-<attempt>.log` after every step (W: the ranks or replica groups that took part,
T: wall time); every rank writes its pid to `--dir/pids/rank-<rank>` for the kill.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ftsup.trainer.core import data
from ftsup.trainer.examples.gpt import GPT
from ftsup.trainer.examples.gpt import parse_args as gpt_args

FLAVOURS = ("plain", "disk", "dlrover", "nvrx", "nvrx-inprocess", "torchft")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/_peer_trainer.py")
    p.add_argument("--flavour", choices=FLAVOURS, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--dir", type=pathlib.Path, required=True)
    p.add_argument("--active-world", type=int, default=None,
                   help="nvrx-inprocess: ranks that train; the others are NVRx reserve ranks (default: all)")
    p.add_argument("--gloo-timeout-s", type=float, default=10.0,
                   help="nvrx-inprocess: the gloo group's timeout (default 10, NVRx's examples on CPU)")
    ours = p.parse_args(argv)
    args = gpt_args(["--steps", str(ours.steps), "--seed", str(ours.seed)])  # the example's defaults
    torch.set_num_threads(1)
    if ours.flavour == "torchft":
        return _run_torchft(ours, args)
    if ours.flavour == "nvrx-inprocess":
        return _run_nvrx_inprocess(ours, args)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    _write_pid(ours.dir, rank)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tokens = torch.tensor(data.encode(data.generate_corpus(args.seed)), dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(data.VOCAB_SIZE, args.seq_len, args.layers, args.d_model, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    saver = _Saver.create(ours, model, optimizer, rank)
    done = saver.load()
    heartbeat = _nvrx_heartbeat() if ours.flavour == "nvrx" else None
    ddp = DistributedDataParallel(model)
    progress = open(ours.dir / f"progress-{attempt}.log", "a") if rank == 0 else None  # noqa: SIM115
    for step in range(done + 1, ours.steps + 1):
        loss = _train_step(ddp, optimizer, tokens, args, step, rank, world)
        saver.save(step)
        if heartbeat is not None:
            heartbeat.send_heartbeat()
        if progress is not None:
            progress.write(f"step {step} world {world} t {time.time():.4f} loss {loss:.4f}\n")
            progress.flush()
    if progress is not None:
        progress.close()
    saver.close()
    if heartbeat is not None:
        heartbeat.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


def _start_barrier(directory: pathlib.Path, me: int, count: int, timeout_s: float = 300.0) -> None:
    """Waits until every replica group's first attempt reached this point (a file each): without it
    the first group up trains alone for many steps while the others still import torch."""
    (directory / "ready").mkdir(exist_ok=True)
    (directory / "ready" / str(me)).touch()
    deadline = time.monotonic() + timeout_s
    while len(list((directory / "ready").iterdir())) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"replica groups not all started after {timeout_s} s")
        time.sleep(0.05)


def _write_pid(directory: pathlib.Path, rank: int) -> None:
    (directory / "pids").mkdir(parents=True, exist_ok=True)
    (directory / "pids" / f"rank-{rank}").write_text(str(os.getpid()))


def _train_step(model: Any, optimizer: Any, tokens: torch.Tensor, args: argparse.Namespace, step: int,
                rank: int, world: int) -> float:
    window = torch.arange(args.seq_len + 1)
    offsets = data.batch_offsets(args.seed, step, rank % world, args.batch_size, args.seq_len, len(tokens))
    batch = tokens[torch.tensor(offsets)[:, None] + window]
    optimizer.zero_grad(set_to_none=True)
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    return float(loss.item())


class _Saver:
    """The flavour's checkpoint: none, torch.save to disk, or DLRover Flash Checkpoint."""

    def __init__(self, ours: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 rank: int) -> None:
        self.ours, self.model, self.optimizer, self.rank = ours, model, optimizer, rank
        self.path = ours.dir / "checkpoint.pt"

    @staticmethod
    def create(ours: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               rank: int) -> _Saver:
        if ours.flavour == "dlrover":
            return _FlashSaver(ours, model, optimizer, rank)
        return _Saver(ours, model, optimizer, rank)

    def load(self) -> int:
        if self.ours.flavour == "plain" or not self.path.exists():
            return 0
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return int(state["step"])

    def save(self, step: int) -> None:
        if self.ours.flavour == "plain" or self.rank != 0 or step % self.ours.checkpoint_every:
            return
        partial = self.path.with_suffix(".tmp")
        torch.save({"step": step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                   partial)
        os.replace(partial, self.path)

    def close(self) -> None:
        pass


class _FlashSaver(_Saver):
    """DLRover Flash Checkpoint as its DDP example uses it: memory every step, disk every K."""

    def __init__(self, ours: argparse.Namespace, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 rank: int) -> None:
        super().__init__(ours, model, optimizer, rank)
        from dlrover.trainer.torch.flash_checkpoint.ddp import (
            DdpCheckpointer,
            StorageType,
        )

        self.storage = StorageType
        self.checkpointer = DdpCheckpointer(str(ours.dir / "flash"))

    def load(self) -> int:
        state = self.checkpointer.load_checkpoint()
        if not state:
            return 0
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return int(state["step"])

    def save(self, step: int) -> None:
        state = {"step": step, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        path = str(self.ours.dir / "flash" / f"checkpoint-{step}.pt")
        kind = self.storage.DISK if step % self.ours.checkpoint_every == 0 else self.storage.MEMORY
        self.checkpointer.save_checkpoint(step, state, path, storage_type=kind)

    def close(self) -> None:
        self.checkpointer.close()


def _nvrx_heartbeat() -> Any:
    from nvidia_resiliency_ext import fault_tolerance

    client = fault_tolerance.RankMonitorClient()
    client.init_workload_monitoring()
    return client


def _run_nvrx_inprocess(ours: argparse.Namespace, args: argparse.Namespace) -> int:
    """NVRx's in-process restart as its optimal_example.py sets it up: what is costly to make is made
    once per process (model, optimizer, corpus, the job's TCPStore); the wrapped function makes a
    gloo group on a `PrefixStore` of the restart iteration and reloads the disk checkpoint, so that a
    fault anywhere restarts it on every healthy rank without a new process. The wrapper's own
    TCPStore (hosted by rank 0) and per-rank monitor daemons find the faults; its rank assignment
    drops terminated ranks, shifts the others down and activates at most `--active-world` of them
    (the rest are reserves, as NVRx's usage guide composes `MaxActiveWorldSize` after `ShiftRanks`).
    The environment (RANK, WORLD_SIZE, MASTER_ADDR, the two store ports) comes from the bench, which
    starts one process per rank as a batch scheduler would: a launcher that kills or restarts every
    worker when one dies would defeat an in-process restart (NVRx's known issues)."""
    import copy
    import logging
    from datetime import timedelta

    from nvidia_resiliency_ext import inprocess

    # As NVRx's examples: the wrapper logs through the root logger's handler (restarts at INFO).
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)

    initial_rank, initial_world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _write_pid(ours.dir, initial_rank)
    tokens = torch.tensor(data.encode(data.generate_corpus(args.seed)), dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(data.VOCAB_SIZE, args.seq_len, args.layers, args.d_model, args.heads)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # A restart before the first checkpoint starts again from the initial weights, not from where
    # the interrupted attempt left the (reused) model.
    initial = copy.deepcopy({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    base_store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["BENCH_STORE_PORT"]),
                               world_size=initial_world, is_master=initial_rank == 0, multi_tenant=True,
                               wait_for_workers=True, use_libuv=True)

    def train(call_wrapper: Any = None) -> None:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by the wrapper
        attempt = call_wrapper.iteration
        store = dist.PrefixStore(str(attempt), base_store)
        # NVRx's CPU setting (its examples: 10 s): gloo cannot abort a pending collective, so a rank
        # blocked in one when the fault lands waits this long before the restart can start.
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=ours.gloo_timeout_s))
        saver = _Saver(ours, model, optimizer, rank)
        done = saver.load()
        if not done:
            model.load_state_dict(initial["model"])
            optimizer.load_state_dict(initial["optimizer"])
        ddp = DistributedDataParallel(model)
        progress = open(ours.dir / f"progress-{attempt}.log", "a") if rank == 0 else None  # noqa: SIM115
        try:
            for step in range(done + 1, ours.steps + 1):
                loss = _train_step(ddp, optimizer, tokens, args, step, rank, world)
                with call_wrapper.atomic():  # no checkpoint write while a restart tears the group down
                    saver.save(step)
                if progress is not None:
                    progress.write(f"step {step} world {world} t {time.time():.4f} loss {loss:.4f}\n")
                    progress.flush()
        finally:
            if progress is not None:
                progress.close()
        dist.destroy_process_group()

    # The wrapper finds its CallWrapper argument by annotation; this module's annotations are
    # strings (`from __future__ import annotations`), which it cannot match.
    train.__annotations__ = {"call_wrapper": inprocess.CallWrapper}
    active = ours.active_world or initial_world
    wrapped = inprocess.Wrapper(
        store_kwargs={"port": int(os.environ["BENCH_WRAPPER_PORT"])},
        # NVRx's examples pass CudaHealthCheck: without CUDA initialised it checks nothing.
        health_check=inprocess.health_check.CudaHealthCheck(),
        rank_assignment=inprocess.Compose(inprocess.rank_assignment.MaxActiveWorldSize(active),
                                          inprocess.rank_assignment.ShiftRanks()),
        monitor_process_logfile=str((ours.dir / "nvrx-monitor-{rank}.log").resolve()),
    )(train)
    wrapped()
    return 0


def _run_torchft(ours: argparse.Namespace, args: argparse.Namespace) -> int:
    """torchft's train_ddp.py recipe: a replica group per process, the Lighthouse's quorum each
    step, a (re)joining group healed from a healthy one's state dict."""
    from datetime import timedelta

    from torchft import DistributedDataParallel as FtDDP
    from torchft import Manager, ProcessGroupGloo
    from torchft import Optimizer as FtOptimizer

    group = int(os.environ["REPLICA_GROUP_ID"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    _write_pid(ours.dir, group)
    tokens = torch.tensor(data.encode(data.generate_corpus(args.seed)), dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(data.VOCAB_SIZE, args.seq_len, args.layers, args.d_model, args.heads)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optimizer"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": inner.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"bench_{group}", timeout=timedelta(seconds=10))
    ddp = FtDDP(manager, model)
    optimizer = FtOptimizer(manager, inner)
    groups = int(os.environ["NUM_REPLICA_GROUPS"])
    if attempt == 0:  # the job starts whole, as every other tool's rendezvous makes it
        _start_barrier(ours.dir, group, groups)
    progress = open(ours.dir / f"progress-{attempt}.log", "a") if group == 0 else None  # noqa: SIM115
    while manager.current_step() < ours.steps:
        # The optimizer wrapper's zero_grad starts the quorum; step() commits or discards.
        before = manager.current_step()
        loss = _train_step(ddp, optimizer, tokens, args, before + 1, group, groups)
        if progress is not None and manager.current_step() > before:  # a discarded step is no progress
            progress.write(f"step {manager.current_step()} world {manager.num_participants()} "
                           f"t {time.time():.4f} loss {loss:.4f}\n")
            progress.flush()
    if progress is not None:
        progress.close()
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
