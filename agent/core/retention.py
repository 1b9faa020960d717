"""Which snapshot blobs the RAM store may drop.

Pure: given the (rank, step) keys held, the directive's `retain_from_step` and how many steps to
keep per rank, returns the keys to drop. The rule: the supervisor's retain_from_step is a floor
(it has a committed step at or above it), and RAM is bounded by keeping only the newest few steps
per rank above the floor. The floor step itself is the supervisor's committed restore point and
is never dropped: losing it while a newer step is still uncommitted would leave nothing to restore.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

KEEP_STEPS_PER_RANK = 4


def keys_to_drop(
    keys: Iterable[tuple[int, int]], retain_from_step: int, keep_per_rank: int = KEEP_STEPS_PER_RANK
) -> set[tuple[int, int]]:
    """Returns the (rank, step) keys to drop from `keys`."""
    if keep_per_rank < 1:
        raise ValueError(f"keep_per_rank must be >= 1, got {keep_per_rank}")
    drop: set[tuple[int, int]] = set()
    by_rank: dict[int, list[int]] = defaultdict(list)
    for rank, step in keys:
        if step < retain_from_step:
            drop.add((rank, step))
        elif step > retain_from_step:
            by_rank[rank].append(step)
    for rank, steps in by_rank.items():
        for step in sorted(steps, reverse=True)[keep_per_rank:]:
            drop.add((rank, step))
    return drop
