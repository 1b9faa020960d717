"""Restore planner: the newest step at which the whole world is recoverable, and each rank's source.

Pure. Given which nodes' RAM holds which rank's snapshot at which step, which nodes can still be
read, where every rank will run next, and the last committed object-store checkpoint, it picks
the newest step S such that *every* rank can be restored at S (one logical model state: ranks
never restore different steps), and for each rank the cheapest source at S, in the order of the
recovery ladder (DESIGN.md): its own node's RAM, then another node's RAM (its buddy's), then the
object store (only when the checkpoint is exactly at S). With nothing recoverable it starts from
step 0 when allowed, and otherwise refuses, naming the ranks whose every copy is gone.
SDC-tainted steps (issue 7) are never candidates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.core.events import RankAssignment, RankRestore, RestoreKind


@dataclass(frozen=True, slots=True)
class Holding:
    """Node `node_id`'s RAM holds rank `rank`'s snapshot of step `step`."""

    node_id: str
    rank: int
    step: int


@dataclass(frozen=True, slots=True)
class RestoreWorld:
    placement: tuple[RankAssignment, ...]  # where each rank runs in the next generation
    holdings: tuple[Holding, ...]  # RAM copies known to exist (committed ones, typically)
    reachable: frozenset[str]  # nodes whose RAM can be read now (alive and connected)
    checkpoint_step: int | None  # the last committed object-store checkpoint, None if none
    tainted_from_step: int | None = None  # no step >= this may be restored (SDC)
    allow_fresh: bool = True  # nothing recoverable: start from step 0; False: refuse


@dataclass(frozen=True, slots=True)
class RestorePlan:
    step: int | None  # the step every rank restores; None: fresh start, or refused
    restores: tuple[RankRestore, ...]  # one per rank, by rank; empty when refused
    is_refused: bool
    reason: str


def plan_restore(world: RestoreWorld) -> RestorePlan:
    """The newest whole-world recoverable step and each rank's source; see the module docstring."""
    node_of = {rank: member.node_id for member in world.placement for rank in member.ranks}
    ranks = sorted(node_of)
    held = _usable_holders(world)
    checkpoint = world.checkpoint_step
    if checkpoint is not None and world.tainted_from_step is not None and checkpoint >= world.tainted_from_step:
        checkpoint = None
    candidates = sorted({*held, *(() if checkpoint is None else (checkpoint,))}, reverse=True)
    skipped: list[str] = []
    for step in candidates:
        holders = held.get(step, {})
        missing = [r for r in ranks if not holders.get(r) and step != checkpoint]
        if missing:
            skipped.append(f"step {step} lacks rank(s) {_ranks_text(missing)}")
            continue
        restores = tuple(_source(rank, node_of[rank], holders.get(rank, ()), step, checkpoint) for rank in ranks)
        return RestorePlan(step, restores, False, _reason(step, restores, skipped))
    why = _why_nothing(world, ranks, checkpoint, skipped)
    if world.allow_fresh:
        fresh = tuple(RankRestore(rank, RestoreKind.FRESH, "") for rank in ranks)
        return RestorePlan(None, fresh, False, f"starting from step 0: {why}")
    return RestorePlan(None, (), True, f"refused: {why}; no object-store checkpoint to fall back on")


def _usable_holders(world: RestoreWorld) -> dict[int, dict[int, tuple[str, ...]]]:
    """step -> rank -> reachable nodes holding it, untainted steps only."""
    by_step: dict[int, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for h in world.holdings:
        if h.node_id not in world.reachable:
            continue
        if world.tainted_from_step is not None and h.step >= world.tainted_from_step:
            continue
        by_step[h.step][h.rank].add(h.node_id)
    return {step: {rank: tuple(sorted(nodes)) for rank, nodes in ranks.items()} for step, ranks in by_step.items()}


def _source(rank: int, node_id: str, holders: tuple[str, ...], step: int, checkpoint: int | None) -> RankRestore:
    if node_id in holders:
        return RankRestore(rank, RestoreKind.LOCAL_SNAPSHOT, node_id)
    if holders:
        return RankRestore(rank, RestoreKind.PEER_SNAPSHOT, holders[0])
    assert step == checkpoint
    return RankRestore(rank, RestoreKind.CHECKPOINT, "")


def _reason(step: int, restores: tuple[RankRestore, ...], skipped: list[str]) -> str:
    by_kind: dict[RestoreKind, list[int]] = defaultdict(list)
    peers: set[str] = set()
    for r in restores:
        by_kind[r.kind].append(r.rank)
        if r.kind is RestoreKind.PEER_SNAPSHOT:
            peers.add(r.source_node_id)
    parts = []
    if by_kind[RestoreKind.LOCAL_SNAPSHOT]:
        parts.append(f"rank(s) {_ranks_text(by_kind[RestoreKind.LOCAL_SNAPSHOT])} from their own node's RAM")
    if by_kind[RestoreKind.PEER_SNAPSHOT]:
        parts.append(
            f"rank(s) {_ranks_text(by_kind[RestoreKind.PEER_SNAPSHOT])} from a peer's RAM ({', '.join(sorted(peers))})"
        )
    if by_kind[RestoreKind.CHECKPOINT]:
        parts.append(f"rank(s) {_ranks_text(by_kind[RestoreKind.CHECKPOINT])} from the object-store checkpoint")
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
