"""The few small agreements a Session needs from the job's default process group.

Owns one rule: a value that must be the same on every rank (the next checkpoint step, the
snapshot cadence) is agreed by one all-reduce of one int64, on the device the backend needs, and
only at the steps where it matters, never as an extra collective on every step. Outside a process
group (one rank, plain python) the value is its own agreement.
"""

from __future__ import annotations

import torch


def agree_on_min(value: int) -> int:
    """The smallest `value` over the default process group (the value itself outside one)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())
