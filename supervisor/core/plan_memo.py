"""The planners' memo: objects of recent plans, kept so that the next plan is built in time
proportional to what changed, owned by the caller (SoftState.plan_memo), never by a module.

At 12,500 nodes a plan that rebuilds every RankAssignment and RankRestore costs ~6-7 ms each, per
failure; sharing the last plan's objects where they are equal (and indexing layouts once) makes
it proportional to the lost nodes. Plans are the same with an empty memo, only slower: the
property tests in tests/unit/supervisor/test_core_fast_paths.py compare both ways against the
reference planners. A fresh SoftState (a new leader) starts with an empty one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from ftsup.supervisor.core.events import RankAssignment, RankRestore, RestoreKind

Shape = tuple[int, int]  # (job nodes, ranks per node)


class Layouts:
    """Layouts the planner returned lately, by identity, each with its node -> block index once
    asked for: the next plan usually starts from one (the committed snapshot's members are the
    generation's). Also each job shape's block ranks, built once."""

    def __init__(self) -> None:
        self._recent: dict[int, tuple[tuple[RankAssignment, ...], Shape, dict[str, int] | None]] = {}
        self._block_ranks: dict[Shape, list[tuple[int, ...]]] = {}
        self.latest: tuple[RankAssignment, ...] = ()
        self.latest_shape: Shape = (0, 0)

    def get(self, members: tuple[RankAssignment, ...], shape: Shape) -> dict[str, int] | None:
        """`members`' node -> block index, if the planner laid it out for `shape` with distinct nodes."""
        hit = self._recent.get(id(members))
        if hit is None or hit[0] is not members or hit[1] != shape:
            return None
        if hit[2] is None:
            index = dict(zip(map(attrgetter("node_id"), members), range(len(members))))
            if len(index) != len(members):
                return None  # a node holds two blocks (only from a malformed last layout)
            self._recent[id(members)] = (members, hit[1], index)
            return index
        return hit[2]

    def remember(self, members: tuple[RankAssignment, ...], shape: Shape,
                 block_of: dict[str, int] | None = None) -> None:
        if len(self._recent) >= 4:
            del self._recent[next(iter(self._recent))]
        self._recent[id(members)] = (members, shape, block_of)
        self.latest, self.latest_shape = members, shape

    def block_ranks(self, shape: Shape) -> list[tuple[int, ...]]:
        """Block b's ranks, b*rpn .. b*rpn + rpn - 1, for every block of `shape`."""
        ranks = self._block_ranks.get(shape)
        if ranks is None:
            nodes, rpn = shape
            if len(self._block_ranks) >= 4:
                self._block_ranks.clear()
            ranks = self._block_ranks[shape] = [tuple(range(b * rpn, (b + 1) * rpn)) for b in range(nodes)]
        return ranks

    def latest_block_ranks(self) -> list[tuple[int, ...]] | None:
        """The block ranks the latest layout was built from (None: not built here)."""
        return self._block_ranks.get(self.latest_shape)


class BlockLayouts:
    """Members tuples known to be block layouts (member i holds ranks i*r .. i*r + r - 1), by
    identity: checked once, then passed on to the placements that keep their blocks."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[RankAssignment, ...]] = {}

    def has(self, members: tuple[RankAssignment, ...]) -> bool:
        known = self._known.get(id(members))
        if known is members:
            return True
        width = len(members[0].ranks) if members else 0
        blocks = list(zip(*[iter(range(len(members) * width))] * width)) if width else []
        if width == 0 or list(map(attrgetter("ranks"), members)) != blocks:
            return False
        self.add(members)
        return True

    def add(self, members: tuple[RankAssignment, ...]) -> None:
        if len(self._known) >= 8:
            del self._known[next(iter(self._known))]
        self._known[id(members)] = members


class LastPlan:
    """The previous fast restore plan's restores, to share RankRestore objects with (equal values;
    a plan at 12,500 nodes otherwise builds 12,500 of them, ~7 ms, per failure)."""

    def __init__(self) -> None:
        self._placement: tuple[RankAssignment, ...] = ()
        self._restores: tuple[RankRestore, ...] = ()
        self._elsewhere: frozenset[int] = frozenset()  # ranks not restored from their own node's RAM

    def restores(self, placement: tuple[RankAssignment, ...], members: tuple[RankAssignment, ...],
                 sources: dict[int, tuple[RestoreKind, str]]) -> tuple[RankRestore, ...]:
        """One RankRestore per rank (block layouts): `sources[rank]` where given, else LOCAL from
        its node in `placement`. Where the snapshot's layout is the previous plan's placement,
        only the ranks in `sources` or restored elsewhere last time are looked at."""
        local, width = RestoreKind.LOCAL_SNAPSHOT, len(members[0].ranks)
        if members is self._placement and len(self._restores) == width * len(members):
            out = list(self._restores)
            for rank in self._elsewhere - sources.keys():
                out[rank] = RankRestore(rank, local, placement[rank // width].node_id)
        else:
            out = [RankRestore(rank, local, m.node_id) for m in placement for rank in m.ranks]
        for rank, (kind, node_id) in sources.items():
            if out[rank].kind is not kind or out[rank].source_node_id != node_id:
                out[rank] = RankRestore(rank, kind, node_id)
        self._placement, self._restores = placement, tuple(out)
        self._elsewhere = frozenset(r for r, (kind, _) in sources.items() if kind is not local)
        return self._restores


@dataclass(eq=False)
class PlanMemo:
    """Everything the generation planner and the restore planner remember between plans."""

    layouts: Layouts = field(default_factory=Layouts)
    blocks: BlockLayouts = field(default_factory=BlockLayouts)
    last_plan: LastPlan = field(default_factory=LastPlan)
    uniform_restores: dict[RestoreKind, tuple[RankRestore, ...]] = field(default_factory=dict)  # kind -> 0..W-1
    # The last survey of the fleet (planner._survey), with the node map (by identity) and the
    # soft state's `links` it was made from: while no generation runs the planner is asked on
    # every decision (ten Ticks a second while a job waits for a spare), and a survey is a pass
    # over every node (~20 ms at 12,500 nodes), though between two asks nothing it reads changed.
    survey: tuple[Mapping[str, object], int, object] | None = None
