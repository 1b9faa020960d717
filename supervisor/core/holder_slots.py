"""Who may hold each rank's RAM snapshot in one generation, as arrays (issue 14).

A step's holdings are kept per rank in two slots, its owner's copy and its buddy's
(step_holdings.py): admission lets nobody else hold a rank, so a step of a 100,000-rank generation
is two boolean arrays instead of a dict of 100,000 holder sets, and a link shard's fold of forty
nodes' holdings is held with a few array operations instead of a Python pass per entry. This table
says, per position, which rank it is and which nodes own the two slots; it is built once per
generation (MemberIndex.holder_slots) and only read after that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from ftsup.supervisor.core.events import RankAssignment

NO_NODE = -1  # a slot nobody holds (a rank with no buddy: a world of one node)


@dataclass(frozen=True, slots=True, eq=False)
class HolderSlots:
    ranks: npt.NDArray[np.int64]  # position -> rank, ascending
    dense: bool  # the ranks are 0..n-1: a rank is its own position
    node_ids: tuple[str, ...]  # node number -> node id
    numbers: Mapping[str, int]  # node id -> node number
    owner_of: npt.NDArray[np.int32]  # position -> the owner's node number
    buddy_of: npt.NDArray[np.int32]  # position -> the buddy's node number (NO_NODE: none)
    owners: list[int]  # owner_of and buddy_of as lists, for one message's few entries
    buddies: list[int]
    sparse_positions: Mapping[int, int]  # rank -> position, when the ranks are not dense
    # Each node and rank listed once (every generation the planner makes): a step is held twice
    # when every slot with a holder is held. Otherwise the members' own rule decides (soft.py).
    exact: bool
    required: int  # the (rank, holder) pairs a commit needs, counted member by member

    @property
    def size(self) -> int:
        return len(self.ranks)

    def position(self, rank: int) -> int:
        """The position of one rank of this generation."""
        return rank if self.dense else self.sparse_positions[rank]

    def distinct(self, positions: npt.NDArray[np.integer]) -> bool:
        """Whether `positions` (each a position of this table) are distinct: a mark per position
        (a fold's few thousand ranks against the generation's size), not a sort or a hash."""
        marks = np.zeros(self.size, dtype=np.bool_)
        marks[positions] = True
        return int(np.count_nonzero(marks)) == len(positions)

    def holders(self, position: int, owner: bool, buddy: bool) -> frozenset[str]:
        """The node ids of the slots held at `position`."""
        held = []
        if owner:
            held.append(self.node_ids[self.owner_of[position]])
        if buddy and self.buddy_of[position] != NO_NODE:
            held.append(self.node_ids[self.buddy_of[position]])
        return frozenset(held)


def build(members: Sequence[RankAssignment], may_hold: Mapping[int, tuple[str, str]] | None,
          exact: bool) -> HolderSlots:
    """The table of `members`. `exact`: each node and rank is listed once, and the table is built
    member by member; otherwise from `may_hold` (rank -> (owner, buddy), admission's first-listed
    rule), which must then be given."""
    numbers: dict[str, int] = {}
    for member in members:
        numbers.setdefault(member.node_id, len(numbers))
    for member in members:
        if member.buddy_node_id:
            numbers.setdefault(member.buddy_node_id, len(numbers))
    if exact:
        per_member = list(map(attrgetter("ranks"), members))
        lengths = list(map(len, per_member))
        ranks = np.fromiter((rank for its in per_member for rank in its), dtype=np.int64, count=sum(lengths))
        owners = np.repeat(np.fromiter((numbers[m.node_id] for m in members), np.int32, len(members)), lengths)
        buddies = np.repeat(np.fromiter((numbers.get(m.buddy_node_id, NO_NODE) for m in members), np.int32,
                                        len(members)), lengths)
    else:
        assert may_hold is not None
        ranks = np.fromiter(may_hold, dtype=np.int64, count=len(may_hold))
        owners = np.fromiter((numbers[o] for o, _ in may_hold.values()), np.int32, len(may_hold))
        buddies = np.fromiter((numbers.get(b, NO_NODE) for _, b in may_hold.values()), np.int32, len(may_hold))
    order = np.argsort(ranks, kind="stable")
    ranks, owners, buddies = ranks[order], owners[order], buddies[order]
    buddies[buddies == owners] = NO_NODE  # (a node its own buddy holds one copy: one slot)
    required = sum(len(m.ranks) * len({m.node_id, m.buddy_node_id} - {""}) for m in members)
    dense = bool(len(ranks) == 0 or (ranks[0] == 0 and ranks[-1] == len(ranks) - 1))
    sparse = {} if dense else dict(zip(ranks.tolist(), range(len(ranks))))
    return HolderSlots(ranks, dense, tuple(numbers), numbers, owners, buddies, owners.tolist(), buddies.tolist(),
                       sparse, exact, required)
