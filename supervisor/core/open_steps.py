"""A training step's reports until every rank of the world is in: compute times for the straggler
detector, digests for the SDC vote.

Owned by `GenerationProgress` (soft state, never logged). Two tracks per step, as the per-rank
dicts they replaced were kept (issue 14): `OpenTimes` and `OpenVotes`, each complete when it
holds every rank, each given up past MAX_OPEN_STEPS on its own, so what completes when is
unchanged (the fleet simulator fills only the votes of a step it commits). A track keeps dense
arrays indexed by rank, written in place once per aggregate (a few numpy calls for a node's 8
ranks, not 8 dict writes of Python objects), and a rank reported twice keeps its last figures,
as the dicts did. When a track completes partway through an aggregate (a rank sent again after
its step completed), the rest of the aggregate goes to a fresh track of the same step, as the
dicts' `setdefault` after `del` did: `add_*` return where they stopped.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ftsup.supervisor.core.inputs import DigestRanks, Floats, Ranks, StepAggregate
from ftsup.supervisor.core.limits import MAX_OPEN_STEPS

Bools = npt.NDArray[np.bool_]
Codes = npt.NDArray[np.int32]

# Few distinct digests (the usual step: replicas agree) are split out one comparison each; more
# (every rank its own shard, as under FSDP) by one sort.
_FEW_DIGESTS = 16


class _Track:
    """Which ranks a step has heard from (`seen`, `count`), sized to the world, grown on demand."""

    __slots__ = ("seen", "count")

    def __init__(self, world: int) -> None:
        self.seen: Bools = np.zeros(world, dtype=np.bool_)
        self.count = 0

    def _grow(self, rows: int) -> None:
        seen = np.zeros(rows, dtype=np.bool_)
        seen[:len(self.seen)] = self.seen
        self.seen = seen

    def _take(self, world: int, ranks: Ranks) -> tuple[int, Ranks]:
        """How many leading `ranks` this track takes (all, or up to the one that completes it) and
        which of them it had not seen, in order; marks those seen."""
        top = int(ranks.max()) + 1
        if top > len(self.seen):
            self._grow(max(top, 2 * len(self.seen)))
        fresh = np.flatnonzero(~self.seen[ranks])
        need = world - self.count
        if len(fresh) >= need > 0:
            cut, fresh = int(fresh[need - 1]) + 1, fresh[:need]
        else:
            cut = len(ranks)
        new = ranks[fresh]
        self.seen[new] = True
        self.count += len(new)
        return cut, new


class OpenTimes(_Track):
    """Compute times of one step: per rank its last report's, and the order ranks first came in
    (the straggler detector's verdicts follow it, as they followed the dict's insertion order)."""

    __slots__ = ("order", "compute")

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.order: Ranks = np.empty(world, dtype=np.int64)
        self.compute: Floats = np.empty(world, dtype=np.float64)

    def _grow(self, rows: int) -> None:
        super()._grow(rows)
        order, compute = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.float64)
        order[:len(self.order)], compute[:len(self.compute)] = self.order, self.compute
        self.order, self.compute = order, compute


class OpenVotes(_Track):
    """Digests of one step: per rank a code into this step's table of distinct digests (its last
    report's), and the replica group each rank last reported (-1: none)."""

    __slots__ = ("params", "param_values", "grads", "grad_values", "groups", "has_groups")

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.params: Codes = np.zeros(world, dtype=np.int32)
        self.param_values: dict[str, int] = {}
        self.grads: Codes = np.full(world, -1, dtype=np.int32)  # -1: no local-gradient digest
        self.grad_values: dict[str, int] = {}
        self.groups: Ranks = np.full(world, -1, dtype=np.int64)
        self.has_groups = False

    def _grow(self, rows: int) -> None:
        have = len(self.seen)
        super()._grow(rows)
        params, grads = np.zeros(rows, dtype=np.int32), np.full(rows, -1, dtype=np.int32)
        groups = np.full(rows, -1, dtype=np.int64)
        params[:have], grads[:have], groups[:have] = self.params, self.grads, self.groups
        self.params, self.grads, self.groups = params, grads, groups

    def by_digest(self) -> dict[str, Ranks]:
        """The parameter digests grouped by value: digest -> its ranks, ascending."""
        values = list(self.param_values)
        ranks = np.flatnonzero(self.seen)
        codes = self.params[ranks]
        if len(values) == 1:
            return {values[0]: ranks}
        if len(values) <= _FEW_DIGESTS:
            return {value: ranks[codes == code] for code, value in enumerate(values)}
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(1, len(values)))
        return dict(zip(values, np.split(ranks[order], bounds)))


def add_times(tracks: dict[int, OpenTimes], step: int, world: int, aggregate: StepAggregate, start: int
              ) -> tuple[int, OpenTimes | None]:
    """Records `aggregate`'s compute times from position `start`; returns where it stopped and the
    step's track if this completed it (the rest, if any, is for a fresh track of the step)."""
    track = tracks.get(step)
    if track is None:
        track = tracks[step] = OpenTimes(world)
    ranks = aggregate.ranks[start:]
    before = track.count
    cut, new = track._take(world, ranks)
    track.order[before:track.count] = new
    track.compute[ranks[:cut]] = aggregate.compute_time_s[start:start + cut]
    if track.count < world:
        for stale in sorted(tracks)[:-MAX_OPEN_STEPS]:
            del tracks[stale]
        return start + cut, None
    del tracks[step]
    return start + cut, track


def add_votes(tracks: dict[int, OpenVotes], step: int, world: int, aggregate: StepAggregate, start: int
              ) -> tuple[int, OpenVotes | None]:
    """Records `aggregate`'s digests and replica groups from position `start`, as `add_times`."""
    track = tracks.get(step)
    if track is None:
        track = tracks[step] = OpenVotes(world)
    ranks = aggregate.ranks[start:]
    cut, _ = track._take(world, ranks)
    end = start + cut
    taken = ranks[:cut]
    _write_codes(track.params, track.param_values, aggregate.param_digests, aggregate.ranks, start, end,
                 keep_empty=True)
    track.grads[taken] = -1  # a report without one replaces an earlier one with "not reported"
    _write_codes(track.grads, track.grad_values, aggregate.local_grad_digests, aggregate.ranks, start, end,
                 keep_empty=False)
    groups = aggregate.replica_groups[start:end]
    reported = groups >= 0
    if reported.any():
        track.groups[taken[reported]] = groups[reported]
        track.has_groups = True
    if track.count < world:
        for stale in sorted(tracks)[:-MAX_OPEN_STEPS]:
            del tracks[stale]
        return end, None
    del tracks[step]
    return end, track


def preload_votes(tracks: dict[int, OpenVotes], step: int, world: int, ranks: Ranks, digest: str) -> None:
    """Records `digest` for `ranks` at `step` as their reports would (the fleet simulator commits a
    step this way without sending every rank's report)."""
    track = tracks[step] = OpenVotes(world)
    if len(ranks):
        track._take(world, ranks)
        track.params[ranks] = track.param_values.setdefault(digest, 0)


def _write_codes(codes: Codes, values: dict[str, int], groups: tuple[DigestRanks, ...], ranks: Ranks,
                 start: int, end: int, *, keep_empty: bool) -> None:
    """Each rank at positions [start, end) gets its digest's code in this step's table; "" is a
    value of its own for parameters (the vote skips it) and no digest at all for gradients."""
    whole = start == 0 and end == len(ranks)
    for group in groups:
        if not group.digest and not keep_empty:
            continue
        positions = group.positions if whole else group.positions[(group.positions >= start) & (group.positions < end)]
        if len(positions):
            codes[ranks[positions]] = values.setdefault(group.digest, len(values))
