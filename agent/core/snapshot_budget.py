"""How much RAM the agent's snapshot store may use: derived from the job's own snapshot sizes.

Pure (no I/O, no clock). The store holds, per rank it is responsible for (its own ranks, the
ranks it is a buddy for, ranks it still holds copies of), the retention floor plus the newest
`keep_per_rank` steps, and one more arriving: `keep_per_rank + 2` copies of that rank's snapshot.
So the budget is

    sum over those ranks of (largest snapshot seen of the rank) x (keep_per_rank + 2) x (1 + headroom)

where a rank not seen yet counts as the largest rank seen (a job's ranks hold similar state), and
a snapshot being declared counts at its declared size (state grows after the first step, when
optimizer moments appear: the budget grows with it, within the store's per-rank growth bound).
The budget is capped by a fraction of the machine's RAM (the rest is the trainers') and by the
operator's `--snapshot-memory-mib` when given. Before any size is known it is the cap: unknown
means "no evidence", never "nothing".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

HEADROOM = 0.25  # streams being fetched from a dropped copy, a rank's size creeping up between steps
RAM_FRACTION = 0.5  # of the machine: the other half is the trainers' (model, optimizer, data loaders)


class BudgetBasis(enum.Enum):
    NO_SIZES_YET = "no_sizes_yet"  # nothing held or declared yet: the cap
    DERIVED = "derived"  # the job's snapshot sizes
    RAM_CAP = "ram_cap"  # derived is more than the RAM fraction allows
    FLAG_CAP = "flag_cap"  # derived is more than --snapshot-memory-mib


@dataclass(frozen=True, slots=True)
class SnapshotBudget:
    limit_bytes: int
    basis: BudgetBasis
    derived_bytes: int | None  # None: no sizes known yet
    ranks: int  # ranks the derived figure covers
    reason: str


def snapshot_budget(
    largest_by_rank: Mapping[int, int],
    ranks: Iterable[int],
    *,
    keep_per_rank: int,
    ram_bytes: int,
    flag_bytes: int = 0,
    ram_fraction: float = RAM_FRACTION,
    headroom: float = HEADROOM,
) -> SnapshotBudget:
    """The store's limit from the largest snapshot seen per rank and the ranks it answers for.

    `ranks` are the ranks the store must have room for (own, buddy and held ones); `flag_bytes`
    0 means no explicit limit. Raises ValueError for nonsense arguments, naming them.
    """
    if keep_per_rank < 1 or ram_bytes < 1 or flag_bytes < 0 or not 0 < ram_fraction <= 1 or headroom < 0:
        raise ValueError(f"bad budget arguments: keep_per_rank={keep_per_rank} ram_bytes={ram_bytes} "
                         f"flag_bytes={flag_bytes} ram_fraction={ram_fraction} headroom={headroom}")
    ram_cap = int(ram_bytes * ram_fraction)
    cap, cap_basis = (flag_bytes, BudgetBasis.FLAG_CAP) if 0 < flag_bytes < ram_cap else (ram_cap, BudgetBasis.RAM_CAP)
    cap_text = (f"--snapshot-memory-mib {flag_bytes // (1 << 20)}" if cap_basis is BudgetBasis.FLAG_CAP
                else f"{ram_fraction:g} of RAM")
    covered = set(ranks)
    typical = max(largest_by_rank.values(), default=0)
    if not covered or typical == 0:
        return SnapshotBudget(cap, BudgetBasis.NO_SIZES_YET, None, len(covered),
                              f"no snapshot size known yet: {cap_text} ({cap} bytes)")
    copies = keep_per_rank + 2
    total = sum(largest_by_rank.get(rank, typical) for rank in covered)
    derived = math.ceil(total * copies * (1 + headroom))
    if derived <= cap:
        return SnapshotBudget(derived, BudgetBasis.DERIVED, derived, len(covered),
                              f"{len(covered)} ranks x their largest snapshot (largest {typical} bytes) x "
                              f"{copies} copies + {headroom:.0%} = {derived} bytes, under {cap_text}")
    return SnapshotBudget(cap, cap_basis, derived, len(covered),
                          f"{len(covered)} ranks x {copies} copies would need {derived} bytes: capped at "
                          f"{cap_text} ({cap} bytes)")
