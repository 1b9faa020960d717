"""Restore planner: the newest step at which the whole world is recoverable, and each rank's source.

Pure. Given which nodes' RAM holds which rank's snapshot at which step, which nodes can still be
read, where every rank will run next, and the last committed object-store checkpoint, it picks
the newest step S such that *every* rank can be restored at S (one logical model state: ranks
never restore different steps), and for each rank the cheapest source at S, in the order of the
recovery ladder (DESIGN.md): its own node's RAM, then another node's RAM (its buddy's), then the
object store (only when the checkpoint is exactly at S). With nothing recoverable it starts from
step 0 when allowed, and otherwise refuses, naming the ranks whose every copy is gone.
SDC-tainted steps (issue 7) are never candidates.

At 100k GPUs a plan covers 12,500 nodes, and the planner runs on every failure: the committed
snapshot's copies come as one `SnapshotCopies` (not 25,000 `Holding`s), the common plan (its
newest step, every rank recoverable) touches in Python only the ranks whose source differs from
"its own node's RAM", and equal `RankRestore`s are shared with the previous plan (`_LastPlan`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter, is_not, not_

from ftsup.supervisor.core.events import RankAssignment, RankRestore, RestoreKind
from ftsup.supervisor.core.plan_memo import PlanMemo
from ftsup.supervisor.core.taint import covers


@dataclass(frozen=True, slots=True)
class Holding:
    """Node `node_id`'s RAM holds rank `rank`'s snapshot of step `step`."""

    node_id: str
    rank: int
    step: int


@dataclass(frozen=True, slots=True)
class SnapshotCopies:
    """A committed snapshot's copies, one entry per member instead of one `Holding` per copy:
    every rank of `members` is held at `step` by its node and its buddy, except by `lost` holders.
    Iterates as those `Holding`s (member by member, rank by rank, node before buddy)."""

    step: int
    members: tuple[RankAssignment, ...]
    lost: frozenset[str] = frozenset()

    def __iter__(self) -> Iterator[Holding]:
        for member in self.members:
            for rank in member.ranks:
                for node_id in (member.node_id, member.buddy_node_id):
                    if node_id and node_id not in self.lost:
                        yield Holding(node_id, rank, self.step)

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None


@dataclass(frozen=True, slots=True)
class RestoreWorld:
    placement: tuple[RankAssignment, ...]  # where each rank runs in the next generation
    holdings: tuple[Holding, ...] | SnapshotCopies  # RAM copies known to exist (committed ones, typically)
    reachable: frozenset[str]  # nodes whose RAM can be read now (alive and connected)
    checkpoint_step: int | None  # the last committed object-store checkpoint, None if none
    tainted_from_step: int | None = None  # no step >= this may be restored (SDC)
    allow_fresh: bool = True  # nothing recoverable: start from step 0; False: refuse
    # Every rank holds the same state (an elastic data-parallel job): a rank with no copy of its
    # own at a step restores another rank's copy (after a shrink, the world grew back).
    replicated: bool = False


@dataclass(frozen=True, slots=True)
class RestorePlan:
    step: int | None  # the step every rank restores; None: fresh start, or refused
    restores: tuple[RankRestore, ...]  # one per rank, by rank; empty when refused
    is_refused: bool
    reason: str


def plan_restore(world: RestoreWorld, memo: PlanMemo | None = None) -> RestorePlan:
    """The newest whole-world recoverable step and each rank's source; see the module docstring.
    `memo`: the caller's (SoftState.plan_memo), shared with the previous plans; the same plan
    without it, built slower."""
    memo = memo if memo is not None else PlanMemo()
    quick = _plan_from_snapshot(world, memo) if isinstance(world.holdings, SnapshotCopies) else None
    if quick is not None:
        return quick
    ranks = list(chain.from_iterable(map(attrgetter("ranks"), world.placement)))
    is_whole_world = ranks == list(range(len(ranks)))  # 0..W-1 in order: a block layout's
    if not is_whole_world:
        ranks = sorted(set(ranks))
        is_whole_world = ranks == list(range(len(ranks)))
    held = _usable_holders(world)
    checkpoint = _untainted_checkpoint(world)
    candidates = sorted({*held, *(() if checkpoint is None else (checkpoint,))}, reverse=True)
    skipped: list[str] = []
    for step in candidates:
        holders = held.get(step, {})
        missing = [r for r in ranks if not holders.get(r) and step != checkpoint]
        donors = sorted(holders) if world.replicated else []
        if missing and not donors:
            skipped.append(f"step {step} lacks rank(s) {_ranks_text(missing)}")
            continue
        if holders:
            node_of = {rank: member.node_id for member in world.placement for rank in member.ranks}
            restores = tuple(
                _replica_source(rank, node_of[rank], donors, holders) if donors and not holders.get(rank)
                else _source(rank, node_of[rank], holders.get(rank, ()), step, checkpoint)
                for rank in ranks
            )
        else:
            restores = _uniform(ranks, RestoreKind.CHECKPOINT, is_whole_world, memo)  # what _source gives every rank
        reason = _reason(step, restores, skipped)
        borrowed = [r.rank for r in restores if r.source_rank is not None]
        if borrowed:
            reason += f"; rank(s) {_ranks_text(borrowed)} from other ranks' copies (replicated state)"
        return RestorePlan(step, restores, False, reason)
    why = _why_nothing(world, ranks, checkpoint, skipped)
    if world.allow_fresh:
        fresh = _uniform(ranks, RestoreKind.FRESH, is_whole_world, memo)
        return RestorePlan(None, fresh, False, f"starting from step 0: {why}")
    return RestorePlan(None, (), True, f"refused: {why}; no object-store checkpoint to fall back on")


def _untainted_checkpoint(world: RestoreWorld) -> int | None:
    checkpoint = world.checkpoint_step
    if checkpoint is not None and covers(world.tainted_from_step, checkpoint):
        return None
    return checkpoint


def _plan_from_snapshot(world: RestoreWorld, memo: PlanMemo) -> RestorePlan | None:
    """The common plan, in time proportional to what changed: the snapshot is the newest
    candidate, every rank is recoverable from it, and the placement keeps the snapshot's blocks
    (member i holds ranks i*r .. i*r + r - 1). None otherwise: `plan_restore`'s general path
    decides (the same answer, slower)."""
    copies = world.holdings
    assert isinstance(copies, SnapshotCopies)
    step, placement, members = copies.step, world.placement, copies.members
    checkpoint = _untainted_checkpoint(world)
    if covers(world.tainted_from_step, step):
        return None
    if (checkpoint is not None and checkpoint > step) or not placement or len(placement) != len(members):
        return None
    if not memo.blocks.has(members):
        return None
    count = len(members)
    moved = list(compress(range(count), map(is_not, placement, members)))  # other objects: maybe other nodes
    if any(placement[i].ranks != members[i].ranks for i in moved):
        return None
    memo.blocks.add(placement)
    lost, reachable = copies.lost, world.reachable
    owners = list(map(attrgetter("node_id"), members))
    # Blocks whose ranks cannot all come from their own node's RAM: another node runs them now,
    # or the snapshot's owner cannot serve its copy. Every other rank: LOCAL_SNAPSHOT, own node.
    odd = {*moved, *compress(range(count), map(not_, map(reachable.__contains__, owners)))}
    if lost:
        odd.update(compress(range(count), map(lost.__contains__, owners)))
    sources: dict[int, tuple[RestoreKind, str]] = {}
    for index in sorted(odd):
        member, node_id = members[index], placement[index].node_id
        holders = tuple(sorted({
            n for n in (member.node_id, member.buddy_node_id) if n and n not in lost and n in reachable
        }))
        if node_id in holders:
            source = (RestoreKind.LOCAL_SNAPSHOT, node_id)
        elif holders:
            source = (RestoreKind.PEER_SNAPSHOT, holders[0])
        elif step == checkpoint and not world.replicated:
            source = (RestoreKind.CHECKPOINT, "")
        else:
            return None  # a rank with no copy: the general path says what was lost, borrows another
            # rank's copy (replicated state) or falls back
        for rank in member.ranks:
            sources[rank] = source
    restores = memo.last_plan.restores(placement, members, sources)
    return RestorePlan(step, restores, False, _reason_sparse(step, count * len(members[0].ranks), sources))


def _uniform(ranks: list[int], kind: RestoreKind, is_whole_world: bool, memo: PlanMemo) -> tuple[RankRestore, ...]:
    """Every rank from the same kind of source with no node (FRESH, CHECKPOINT); `is_whole_world`:
    `ranks` are 0..len-1 (then the tuple is shared between plans)."""
    cached = memo.uniform_restores.get(kind, ())
    if is_whole_world and len(cached) == len(ranks):
        return cached
    restores = tuple(RankRestore(rank, kind, "") for rank in ranks)
    if is_whole_world:
        memo.uniform_restores[kind] = restores
    return restores


def _usable_holders(world: RestoreWorld) -> dict[int, dict[int, tuple[str, ...]]]:
    """step -> rank -> reachable nodes holding it, untainted steps only."""
    by_step: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for h in world.holdings:
        if h.node_id not in world.reachable:
            continue
        if covers(world.tainted_from_step, h.step):
            continue
        by_step[h.step][h.rank].add(h.node_id)
    return {step: {rank: tuple(sorted(nodes)) for rank, nodes in ranks.items()} for step, ranks in by_step.items()}


def _replica_source(rank: int, node_id: str, donors: list[int], holders: dict[int, tuple[str, ...]]) -> RankRestore:
    """Another rank's copy for `rank` (replicated state): donors in turn, a copy on the rank's
    own node first."""
    for donor in donors:
        if node_id in holders[donor]:
            return RankRestore(rank, RestoreKind.LOCAL_SNAPSHOT, node_id, source_rank=donor)
    donor = donors[rank % len(donors)]
    return RankRestore(rank, RestoreKind.PEER_SNAPSHOT, holders[donor][0], source_rank=donor)


def _source(rank: int, node_id: str, holders: tuple[str, ...], step: int, checkpoint: int | None) -> RankRestore:
    if node_id in holders:
        return RankRestore(rank, RestoreKind.LOCAL_SNAPSHOT, node_id)
    if holders:
        return RankRestore(rank, RestoreKind.PEER_SNAPSHOT, holders[0])
    assert step == checkpoint
    return RankRestore(rank, RestoreKind.CHECKPOINT, "")


_PARTS = {
    RestoreKind.LOCAL_SNAPSHOT: "from their own node's RAM",
    RestoreKind.PEER_SNAPSHOT: "from a peer's RAM",
    RestoreKind.CHECKPOINT: "from the object-store checkpoint",
}


def _reason(step: int, restores: tuple[RankRestore, ...], skipped: list[str]) -> str:
    by_kind: dict[RestoreKind, list[int]] = defaultdict(list)
    peers: set[str] = set()
    for r in restores:
        by_kind[r.kind].append(r.rank)
        if r.kind is RestoreKind.PEER_SNAPSHOT:
            peers.add(r.source_node_id)
    texts = {kind: _ranks_text(ranks) for kind, ranks in by_kind.items()}
    return _reason_text(step, texts, peers, skipped)


def _reason_sparse(step: int, world_size: int, sources: dict[int, tuple[RestoreKind, str]]) -> str:
    """`_reason` of a plan where every rank not in `sources` restores from its own node's RAM."""
    by_kind: dict[RestoreKind, list[int]] = defaultdict(list)
    for rank, (kind, _) in sources.items():
        by_kind[kind].append(rank)
    elsewhere = [rank for rank, (kind, _) in sources.items() if kind is not RestoreKind.LOCAL_SNAPSHOT]
    texts: dict[RestoreKind, str] = {
        kind: _ranks_text(ranks) for kind, ranks in by_kind.items() if kind is not RestoreKind.LOCAL_SNAPSHOT}
    if len(elsewhere) < world_size:
        texts[RestoreKind.LOCAL_SNAPSHOT] = _ranks_text_except(world_size, elsewhere)
    peers = {node for kind, node in sources.values() if kind is RestoreKind.PEER_SNAPSHOT}
    return _reason_text(step, texts, peers, [])


def _reason_text(step: int, texts: dict[RestoreKind, str], peers: set[str], skipped: list[str]) -> str:
    parts = []
    for kind in (RestoreKind.LOCAL_SNAPSHOT, RestoreKind.PEER_SNAPSHOT, RestoreKind.CHECKPOINT):
        if kind in texts:
            where = _PARTS[kind]
            if kind is RestoreKind.PEER_SNAPSHOT:
                where += f" ({', '.join(sorted(peers))})"
            parts.append(f"rank(s) {texts[kind]} {where}")
    text = f"step {step}: " + "; ".join(parts)
    if skipped:
        text += f" (newer: {'; '.join(skipped[:3])}{'; ...' if len(skipped) > 3 else ''})"
    return text


def _why_nothing(world: RestoreWorld, ranks: list[int], checkpoint: int | None, skipped: list[str]) -> str:
    if not world.holdings and world.checkpoint_step is None:
        return "no RAM snapshot or checkpoint exists yet"
    lost: dict[int, set[str]] = defaultdict(set)
    for h in world.holdings:
        lost[h.rank].add(h.node_id)
    gone = [r for r in ranks if not (lost[r] & world.reachable)]
    if gone:
        holders = sorted({n for r in gone for n in lost[r]})
        where = f" (held only by {', '.join(holders)}, unreachable)" if holders else " (never held)"
        text = f"every RAM copy of rank(s) {_ranks_text(gone)} is gone{where}"
    elif skipped:
        text = "no step is held for every rank: " + "; ".join(skipped[:3])
    else:
        text = "no RAM snapshot is held"
    if world.tainted_from_step is not None:
        text += f"; steps from {world.tainted_from_step} on are SDC-tainted"
    if checkpoint is None and world.checkpoint_step is not None:
        text += f"; the checkpoint at step {world.checkpoint_step} is tainted"
    return text


def _ranks_text(ranks: Iterable[int]) -> str:
    """0,1,2,5 -> '0-2, 5': short even for thousands of ranks."""
    ordered = sorted(ranks)
    runs: list[str] = []
    start = prev = ordered[0] if ordered else 0
    for r in ordered[1:]:
        if r == prev + 1:
            prev = r
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    if ordered:
        runs.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(runs)


def _ranks_text_except(world_size: int, excluded: Iterable[int]) -> str:
    """`_ranks_text` of 0..world_size-1 without `excluded` (distinct ranks in range), in time
    proportional to the excluded ones."""
    runs: list[str] = []
    start = 0
    for r in [*sorted(excluded), world_size]:
        if r > start:
            runs.append(f"{start}-{r - 1}" if r - 1 > start else str(start))
        start = r + 1
    return ", ".join(runs)
