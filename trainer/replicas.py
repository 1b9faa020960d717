"""Which ranks must hold the same parameter bits as this one: the replica group the SDC vote uses.

Derived from the device meshes of the model's DTensor parameters. Along a mesh dimension where a
parameter is `Replicate`d, the ranks hold equal copies; along a `Shard` (or `Partial`) dimension
they hold different pieces. A rank's replicas for one parameter are therefore the ranks of its
mesh that share its coordinates on every non-replicated dimension; for the whole model, the ranks
that are replicas for every parameter (an intersection of equivalence relations, itself one, so
all members compute the same group). Plain tensors (DDP) are replicated over the whole world.

FSDP over every rank: each rank alone (nothing to compare). HSDP (replicate, shard): the ranks
with the same shard index. TP x DP: the ranks with the same TP coordinate. The group is named by
its lowest rank, which is what a StepReport carries (`replica_group`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor


@dataclass(frozen=True, slots=True)
class ReplicaGroup:
    ranks: tuple[int, ...]  # sorted, this rank included

    @property
    def id(self) -> int:
        """The lowest rank of the group: the same on every member."""
        return self.ranks[0]


def replica_group(module: torch.nn.Module, rank: int, world_size: int) -> ReplicaGroup:
    """The ranks of `world_size` that hold the same parameters as `rank` under `module`'s layout."""
    return replica_group_of((p for _, p in module.named_parameters()), rank, world_size)


def replica_group_of(tensors: Iterable[torch.Tensor], rank: int, world_size: int) -> ReplicaGroup:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    members = set(range(world_size))
    seen: set[tuple[object, ...]] = set()
    for tensor in tensors:
        if not isinstance(tensor, DTensor):
            continue
        mesh = tensor.device_mesh
        key = (id(mesh), tuple(p.is_replicate() for p in tensor.placements))
        if key in seen:
            continue
        seen.add(key)
        members &= _mesh_replicas(mesh.mesh, mesh.get_coordinate(), [p.is_replicate() for p in tensor.placements],
                                  rank)
    return ReplicaGroup(tuple(sorted(members)))


def _mesh_replicas(grid: torch.Tensor, coordinate: Sequence[int] | None, replicated: list[bool], rank: int) -> set[int]:
    """The ranks of `grid` (the mesh's rank layout) equal to `rank` on every non-replicated dim."""
    if coordinate is None:  # this rank is not in the mesh: nobody in it holds what this rank holds
        return {rank}
    index = tuple(slice(None) if is_rep else c for c, is_rep in zip(coordinate, replicated, strict=True))
    return {int(r) for r in grid[index].flatten().tolist()}
