"""Rank bodies for multi-process DCP checkpoint tests: real gloo process groups, real stores.

Run with torch.multiprocessing.spawn; each rank writes what it observed to `out_dir/<rank>.json`
so the test process asserts on it. The state is a DTensor sharded on dim 0, a replicated DTensor,
a plain tensor and a non-tensor value, all derived from a fixed seed so any rank count can
rebuild the exact expected values.
"""

from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from ftsup.checkpoint import flows
from ftsup.checkpoint.local import LocalDirStore
from ftsup.checkpoint.manifest import Layout, Sharding, Topology, Versions
from ftsup.checkpoint.s3 import S3Config, S3Store

VERSIONS = Versions("data-v1", "tok-v1")


@dataclass(frozen=True)
class StoreSpec:
    """How a rank process builds its store (picklable across spawn)."""

    kind: str  # "s3" or "local"
    location: str  # bucket or directory
    endpoint_url: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def open(self):
        os.environ.update(dict(self.env))
        if self.kind == "s3":
            return S3Store(S3Config(bucket=self.location, endpoint_url=self.endpoint_url, region="us-east-1"))
        return LocalDirStore(self.location)


def expected_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return {"w": torch.randn(64, 33, generator=gen), "b": torch.randn(17, generator=gen).to(torch.bfloat16),
            "plain": torch.arange(10, dtype=torch.int64)}


def _state(world: int, fill_zero: bool) -> dict[str, object]:
    mesh = init_device_mesh("cpu", (world,))
    full = expected_state()
    if fill_zero:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    return {"w": distribute_tensor(full["w"], mesh, [Shard(0)]), "b": distribute_tensor(full["b"], mesh, [Replicate()]),
            "plain": full["plain"], "extra": {"step": 0 if fill_zero else 11}}


def topology(world: int) -> Topology:
    return Topology(world_size=world, dp=world, rank_map=tuple(f"node-{r}" for r in range(world)),
                    sharding=Sharding.DTENSOR)


def run(rank: int, world: int, init_file: str, spec: StoreSpec, prefix: str, checkpoint_id: str, mode: str,
        out_dir: str) -> None:
    """mode "save": save and commit; mode "load": restore into zeroed state and compare bit-exactly."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        store = spec.open()
        layout = Layout(prefix)
        report: dict[str, object] = {"rank": rank}
        if mode == "save":
            manifest = flows.save(_state(world, False), store, layout, checkpoint_id, 11, topology(world), VERSIONS)
            report["objects"] = len(manifest.objects)
        else:
            state = _state(world, True)
            plan = flows.load(store, layout, checkpoint_id, state, topology(world), VERSIONS)
            expected = expected_state()
            report["mode"] = plan.mode.value
            report["reason"] = plan.reason
            report["equal"] = {
                "w": bool(torch.equal(state["w"].full_tensor(), expected["w"])),
                "w_local_rows": list(state["w"].to_local().shape),
                "b": bool(torch.equal(state["b"].full_tensor(), expected["b"])),
                "plain": bool(torch.equal(state["plain"], expected["plain"])),
                "extra": state["extra"] == {"step": 11},
            }
        pathlib.Path(out_dir, f"{rank}.json").write_text(json.dumps(report))
        dist.barrier()
    finally:
        dist.destroy_process_group()
