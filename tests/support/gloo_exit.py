"""The way out of a gloo test rank: a barrier, then the process group destroyed.

Rank 0 hosts the TCPStore and one end of every gloo pair. Destroying the group while a peer is
still inside a collective (or still connected mid-teardown) can end rank 0 in std::terminate
("terminate called without an active exception", exit -6; seen once in CI on the FSDP2
gradient-digest ranks). With the barrier every rank has finished its collectives first.
"""

from __future__ import annotations

import torch.distributed as dist


def leave() -> None:
    dist.barrier()
    dist.destroy_process_group()
