"""One step's RAM snapshot copies, held as arrays over the generation's holder slots (issue 14).

Admission lets a rank be held only by its owner and by its owner's buddy, so a step's holdings are
two flags per rank (holder_slots.py) and the SHA-256 the rank's first holder reported. Entries are
held in bulk: a node's holdings message, or a link shard's fold of forty nodes' messages, is a few
array operations, where the dict of holder sets it replaces cost a Python pass per entry (the
leader's most frequent input at 12,500 nodes with a snapshot every step). Holding is split in two:
`weigh` says what entries would change without changing anything (a fold that would complete the
step is held part by part instead, so the commit lands where it would one by one), `take` does it.

Read as a Mapping rank -> the set of its holders, as the dict it replaces was.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ftsup.supervisor.core.holder_slots import NO_NODE, HolderSlots
from ftsup.supervisor.core.inputs import HoldingsFold


@dataclass(frozen=True, slots=True)
class Located:
    """A fold's entries against the generation's holder slots: each one's position, its holder's
    node number and the SHA-256 it names, in the fold's order."""

    positions: npt.NDArray[np.intp]
    holders: npt.NDArray[np.int32]
    sha256: npt.NDArray[np.object_]


def locate(slots: HolderSlots, fold: HoldingsFold) -> Located | None:
    """Places every entry of `fold` when each names a rank of the generation whose owner's or
    buddy's slot its node holds, and no node names a rank twice: what admission asks of each
    entry (holdable ranks, each once), asked of all at once. None: some entry fails it (ask the
    parts one by one, which name it)."""
    numbers = list(map(slots.numbers.get, fold.node_ids))
    if None in numbers or not len(fold.ranks):
        return None
    ranks = fold.ranks
    if slots.dense:
        if ranks.min() < 0 or ranks.max() >= slots.size:
            return None
        positions = ranks.astype(np.intp, copy=False)
    else:
        positions = np.minimum(np.searchsorted(slots.ranks, ranks), slots.size - 1).astype(np.intp, copy=False)
        if not np.array_equal(slots.ranks[positions], ranks):
            return None
    holders = np.repeat(np.array(numbers, dtype=np.int32), fold.counts)
    as_owner = slots.owner_of[positions] == holders
    if not (as_owner | (slots.buddy_of[positions] == holders)).all():
        return None
    # A node naming a rank twice (each node is one part): a (holder, position) pair twice, that is
    # a position twice among the owners' entries or among the buddies' (its holder is the slot's).
    if not (slots.distinct(positions[as_owner]) and slots.distinct(positions[~as_owner])):
        return None
    return Located(positions, holders, np.array(fold.sha256, dtype=object))


@dataclass(frozen=True, slots=True)
class Weighed:
    """What holding some entries would do: the SHA-256s they set first (at `first_at`), the owner
    and buddy slots they add, and whether one named other bytes than its rank's first copy."""

    first_at: npt.NDArray[np.intp]
    first_sha256: npt.NDArray[np.object_]
    owners_added: npt.NDArray[np.intp]
    buddies_added: npt.NDArray[np.intp]
    mismatched: bool

    @property
    def added(self) -> int:
        return len(self.owners_added) + len(self.buddies_added)


class StepHoldings(Mapping[int, frozenset[str]]):
    """One step's holdings: per position of the generation's ranks, whether its owner's and its
    buddy's copies are held, and the SHA-256 first reported for it. `pairs` counts the (rank,
    holder) pairs held, so the commit check answers "not yet" without a pass while fewer are held
    than a commit needs (after a step's vote every holdings input asks it)."""

    __slots__ = ("slots", "owners_held", "buddies_held", "owner_held", "buddy_held", "sha256", "pairs")

    def __init__(self, slots: HolderSlots) -> None:
        self.slots = slots
        # The flags are bytes, read and set one at a time for one message's entries, and seen as
        # boolean arrays (views of the same bytes) for a fold's.
        self.owners_held = bytearray(slots.size)
        self.buddies_held = bytearray(slots.size)
        self.owner_held: npt.NDArray[np.bool_] = np.frombuffer(self.owners_held, dtype=np.bool_)
        self.buddy_held: npt.NDArray[np.bool_] = np.frombuffer(self.buddies_held, dtype=np.bool_)
        self.sha256: npt.NDArray[np.object_] = np.empty(slots.size, dtype=object)  # None: not reported
        self.pairs = 0

    @classmethod
    def whole(cls, slots: HolderSlots, sha256: str) -> StepHoldings:
        """Every slot held, each rank with `sha256` (a simulated fleet's committed step)."""
        held = cls(slots)
        held.owner_held[:] = True
        held.buddy_held[:] = slots.buddy_of != NO_NODE
        held.sha256[:] = sha256
        held.pairs = int(held.owner_held.sum() + held.buddy_held.sum())
        return held

    @property
    def required(self) -> int:
        return self.slots.required

    def hold(self, positions: Iterable[int], holder: int, sha256: Iterable[str]) -> bool:
        """Holds one holder's entries (their ranks' positions, the SHA-256 each names) in their
        order, one at a time (a message's few entries: cheaper than arrays); True when one named
        other bytes than its rank's first report, which is then not held. What `weigh` and
        `take` do with the same entries."""
        digests = self.sha256
        owners, buddies = self.slots.owners, self.slots.buddies
        owners_held, buddies_held = self.owners_held, self.buddies_held
        mismatched = False
        for position, sha in zip(positions, sha256):
            first = digests[position]
            if first is None:
                digests[position] = sha
            elif first != sha:
                mismatched = True
                continue
            if owners[position] == holder:
                if not owners_held[position]:
                    owners_held[position] = 1
                    self.pairs += 1
            elif buddies[position] == holder and not buddies_held[position]:
                buddies_held[position] = 1
                self.pairs += 1
        return mismatched

    def weigh(self, located: Located) -> Weighed:
        """What holding these entries in their order would do. An entry naming other bytes than
        its rank's first report (this step's, or an earlier entry's here) is not held. Changes
        nothing. Each (rank, holder) pair at most once among the entries (`locate` says so)."""
        positions, holders, sha256 = located.positions, located.holders, located.sha256
        first = self.sha256[positions]
        unset = np.flatnonzero(first == None)  # noqa: E711  (elementwise: a rank nobody reported yet)
        first_at = positions[unset]
        first_sha256 = sha256[unset]
        if len(unset):
            # A rank first reported here takes the SHA-256 of its first entry here.
            at, earliest = np.unique(first_at, return_index=True)
            first_at, first_sha256 = at, first_sha256[earliest]
            first[unset] = first_sha256[np.searchsorted(at, positions[unset])]
        matched = np.equal(first, sha256)
        slots = self.slots
        as_owner = slots.owner_of[positions] == holders
        as_buddy = ~as_owner & (slots.buddy_of[positions] == holders)
        owners = positions[matched & as_owner]
        buddies = positions[matched & as_buddy]
        return Weighed(first_at, first_sha256, owners[~self.owner_held[owners]], buddies[~self.buddy_held[buddies]],
                       not bool(matched.all()))

    def take(self, weighed: Weighed) -> None:
        """Holds what `weigh` said (and nothing else may have changed this step since)."""
        self.sha256[weighed.first_at] = weighed.first_sha256
        self.owner_held[weighed.owners_added] = True
        self.buddy_held[weighed.buddies_added] = True
        self.pairs += weighed.added

    def is_whole(self) -> bool:
        """Every rank's owner and buddy (where it has one) hold it: the generation's exact slots
        (HolderSlots.exact) need nothing else for a commit."""
        if self.pairs < self.slots.required:
            return False
        return bool(self.owner_held.all() and (self.buddy_held | (self.slots.buddy_of == NO_NODE)).all())

    # -- read as rank -> holders ------------------------------------------------------------------
    def __getitem__(self, rank: int) -> frozenset[str]:
        position = self._position(rank)
        if position is None or not (self.owner_held[position] or self.buddy_held[position]):
            raise KeyError(rank)
        return self.slots.holders(position, bool(self.owner_held[position]), bool(self.buddy_held[position]))

    def __iter__(self) -> Iterator[int]:
        return iter(self.slots.ranks[self.owner_held | self.buddy_held].tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.owner_held | self.buddy_held))

    def __eq__(self, other: object) -> bool:
        """Two StepHoldings are equal when the same slots are held with the same first SHA-256s
        (the digests are state too: a later copy is checked against them); anything else is
        compared as a Mapping rank -> holders."""
        if not isinstance(other, StepHoldings):
            return super().__eq__(other)
        mine, theirs = self.slots, other.slots
        return (self.pairs == other.pairs and np.array_equal(mine.ranks, theirs.ranks)
                and [mine.node_ids[i] for i in mine.owner_of] == [theirs.node_ids[i] for i in theirs.owner_of]
                and dict(self) == dict(other) and bool(np.all(self.sha256 == other.sha256)))

    __hash__ = None  # type: ignore[assignment]  # (mutable)

    def __repr__(self) -> str:
        return f"StepHoldings({dict(self)!r}, pairs={self.pairs})"

    def _position(self, rank: int) -> int | None:
        ranks = self.slots.ranks
        position = int(np.searchsorted(ranks, rank))
        return position if position < len(ranks) and ranks[position] == rank else None
