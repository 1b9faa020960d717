"""Deterministic gradient averaging for DistributedDataParallel (an option), and compute-time measurement.

Owns the invariant "one logical model state": every replica, and every restart of the same
world size, must produce the same gradient bits. DDP's default hook all-reduces each bucket,
and a ring all-reduce (gloo, NCCL) adds an element's contributions in an order that depends on
the element's position in the bucket. DDP lays buckets out in reverse parameter order on the
first iteration and rebuilds them in gradient-ready order after it, so a restarted process's
first step uses another layout than the uninterrupted run's step K+1 -> different float bits.

This hook makes the result independent of bucket layout: it all-gathers every rank's bucket and
adds the copies element-wise in rank order (r0 + r1 + ... then / world_size) on every rank.
Element-wise adds in a fixed order are exact functions of the inputs, whatever the position,
so all replicas and all restarts agree bit for bit. Cost: all-gather moves world_size x the
bucket instead of ~2x; acceptable for the data-parallel sizes this example runs.

The hook also records when the last bucket became ready: the end of this rank's own compute
in the step, before it waits on the synchronisation (what the straggler detector needs), and
hands the rank's local gradients to a `GradDigester` before they are communicated: the digest an
SDC recompute on another node is compared with (docs/sdc.md).

Without the hook (DDP's own all-reduce, in C++, no Python on the gradient path) `ComputeClock`
gives the same two things by section timing: a post-accumulate-grad hook on every parameter
stamps when this rank's backward produced its last local gradient (DDP's reducer waits for the
all-reduce only after that, in its end-of-backward callback) and hands that gradient to the
digester. Restarts are then correct but not bit-exact: the restarted steps' sums may differ from
the uninterrupted run's in their last bits (docs/state.md).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ftsup.trainer.digest import GradDigester


class DeterministicGradSync:
    """A DDP comm hook: layout-independent gradient averaging plus a ready-time stamp.

    `layout_independent=False` wraps DDP's default all-reduce instead (same timing stamp); it
    exists only so tests can show that the default breaks bit-exact restarts at world >= 3.
    """

    def __init__(
        self, group: dist.ProcessGroup | None = None, layout_independent: bool = True,
        grad_digester: GradDigester | None = None,
    ) -> None:
        self._group = group
        self._layout_independent = layout_independent
        self.grad_digester = grad_digester  # takes each bucket's local gradients before the sync
        self._gather: dict[int, list[torch.Tensor]] = {}  # reused receive buffers per bucket
        self.last_ready_s: float | None = None  # time.monotonic() of the latest bucket ready

    @classmethod
    def attach(
        cls, ddp: DistributedDataParallel, layout_independent: bool = True,
        grad_digester: GradDigester | None = None,
    ) -> DeterministicGradSync:
        """Register a new hook on `ddp` (before its first forward) and return it."""
        hook = cls(ddp.process_group, layout_independent, grad_digester)
        ddp.register_comm_hook(None, hook.hook)
        return hook

    def reset(self) -> None:
        """Forget the ready time; call at the start of each step."""
        self.last_ready_s = None

    # DDP checks a hook's __name__ and the `bucket` parameter's annotation, which must be the
    # real class or absent (string annotations fail its check): hence no annotations here.
    def hook(self, state, bucket):
        """The comm hook: average `bucket` across ranks, independent of its layout."""
        self.last_ready_s = time.monotonic()
        if self.grad_digester is not None:
            self.grad_digester.take_bucket(bucket)  # this rank's own gradients, not yet averaged
        if not self._layout_independent:
            return allreduce_hook(self._group, bucket)
        buffer = bucket.buffer()
        world = dist.get_world_size(self._group)
        parts = self._gather.get(bucket.index())
        if parts is None or parts[0].shape != buffer.shape or parts[0].dtype != buffer.dtype:
            parts = [torch.empty_like(buffer) for _ in range(world)]
            self._gather[bucket.index()] = parts
        work = dist.all_gather(parts, buffer, group=self._group, async_op=True)

        def reduce(gathered: torch.futures.Future) -> torch.Tensor:
            # A failed all-gather (a peer died) must fail the step: without this the error is
            # swallowed and every rank trains on alone, silently diverging.
            gathered.wait()
            # Fixed rank order, element-wise: the sum's bits cannot depend on bucket layout.
            buffer.copy_(parts[0])
            for part in parts[1:]:
                buffer.add_(part)
            return buffer.div_(world)

        return work.get_future().then(reduce)


class ComputeClock:
    """Section timing for DDP without a comm hook: when this rank's last local gradient was ready.

    Same surface as `DeterministicGradSync` (`reset()`, `last_ready_s`, `grad_digester`), so a
    training loop reads compute time the same way whichever it uses. The per-parameter hook only
    stores a float (and, with a digester, copies the gradient into the digester's buffer).
    """

    def __init__(self, module: torch.nn.Module, grad_digester: GradDigester | None = None) -> None:
        self.grad_digester = grad_digester
        self.last_ready_s: float | None = None
        self._handles = [p.register_post_accumulate_grad_hook(self._ready)
                         for p in module.parameters() if p.requires_grad]

    @classmethod
    def attach(cls, ddp: DistributedDataParallel, grad_digester: GradDigester | None = None) -> ComputeClock:
        """Hooks every parameter of `ddp`'s module; DDP keeps its own all-reduce."""
        return cls(ddp.module, grad_digester)

    def reset(self) -> None:
        """Forget the ready time; call at the start of each step."""
        self.last_ready_s = None

    def _ready(self, param: torch.Tensor) -> None:
        # Runs inside the autograd engine right after this parameter's .grad was accumulated and
        # before DDP's reducer hook copies it into a bucket: .grad is still this rank's own.
        self.last_ready_s = time.monotonic()
        if self.grad_digester is not None and param.grad is not None:
            self.grad_digester.take(param, param.grad)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
