"""A training step's reports until every rank of the world is in: compute times for the straggler
detector, digests for the SDC vote.

Owned by `GenerationProgress` (soft state, never logged). Two tracks per step, as the per-rank
dicts they replaced were kept (issue 14): `OpenTimes` and `OpenVotes`, each complete when it
holds every rank, each given up past MAX_OPEN_STEPS on its own, so what completes when is
unchanged (the fleet simulator fills only the votes of a step it commits).

Cost is what shaped it: a step of 12,500 nodes is 12,500 aggregates of 8 ranks, and numpy spends
a microsecond per call whatever the size, so a track does O(1) work per aggregate (it marks its
ranks in a bytearray and keeps the aggregate) and the array work once per step, on the whole
world, when the step completes. A rank reported twice in a step (a report sent again after a
reconnect) is the exception: the track then turns *dense* (arrays indexed by rank, written per
aggregate) so that the rank keeps its last figures, as the dicts did; and when a track completes
partway through an aggregate, the rest of the aggregate goes to a fresh track of the same step,
as the dicts' `setdefault` after `del` did: `add_*` return where they stopped.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from ftsup.supervisor.core.inputs import DigestRanks, Floats, Ranks, StepAggregate
from ftsup.supervisor.core.limits import MAX_OPEN_STEPS

Codes = npt.NDArray[np.int32]

# Few distinct digests (the usual step: replicas agree) are split out one comparison each; more
# (every rank its own shard, as under FSDP) by one sort.
_FEW_DIGESTS = 16
# An aggregate of more ranks than this (a fold of several nodes') is taken with array operations;
# fewer (one node's), rank by rank from Python, which costs less for a handful.
_FEW_RANKS = 64


class _Track:
    """Which ranks a step has heard from: `seen` (a bytearray by rank, cheap to index from Python),
    `count`; in order, the aggregates taken whole (`pending`) until the track turns dense."""

    __slots__ = ("seen", "count", "pending")

    def __init__(self, world: int) -> None:
        self.seen = bytearray(world)
        self.count = 0
        self.pending: list[StepAggregate] | None = []

    def _take_whole(self, aggregate: StepAggregate) -> bool:
        """Takes the whole aggregate if no rank of it was seen (the usual case); False: it was not."""
        if self.pending is None:
            return False
        seen = self.seen
        size = len(seen)
        if len(aggregate.ranks) > _FEW_RANKS:  # (a shard's fold: its ranks at once)
            ranks_ = aggregate.ranks
            if int(ranks_.max()) >= size:
                return False
            marks = np.frombuffer(seen, dtype=np.bool_)
            if bool(marks[ranks_].any()):
                return False
            marks[ranks_] = True
            del marks  # (a live view would pin the bytearray's size)
            self.count += len(ranks_)
            self.pending.append(aggregate)
            return True
        ranks = aggregate.ranks.tolist()
        for r in ranks:
            if r >= size or seen[r]:
                return False
        for r in ranks:
            seen[r] = 1
        self.count += len(ranks)
        self.pending.append(aggregate)
        return True

    def _take(self, world: int, ranks: Ranks) -> tuple[int, Ranks]:
        """Dense: how many leading `ranks` this track takes (all, or up to the one that completes
        it) and which of them it had not seen, in order; marks those seen."""
        top = int(ranks.max()) + 1
        if top > len(self.seen):
            self._grow(max(top, 2 * len(self.seen)))
        seen = np.frombuffer(self.seen, dtype=np.bool_)
        fresh = np.flatnonzero(~seen[ranks])
        need = world - self.count
        if len(fresh) >= need > 0:
            cut, fresh = int(fresh[need - 1]) + 1, fresh[:need]
        else:
            cut = len(ranks)
        new = ranks[fresh]
        seen[new] = True
        del seen  # (a live view would pin the bytearray's size)
        self.count += len(new)
        return cut, new

    def _grow(self, rows: int) -> None:
        self.seen.extend(bytes(rows - len(self.seen)))

    def ranks_seen(self) -> Ranks:
        """Every rank heard from, ascending."""
        seen: Ranks = np.flatnonzero(np.frombuffer(self.seen, dtype=np.bool_))
        return seen


class OpenTimes(_Track):
    """Compute times of one step: per rank its last report's, and the order ranks first came in
    (the straggler detector's verdicts follow it, as they followed the dict's insertion order)."""

    __slots__ = ("order", "compute")

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.order: Ranks = np.empty(0, dtype=np.int64)
        self.compute: Floats = np.empty(0, dtype=np.float64)

    def _densify(self) -> None:
        if self.pending is None:
            return
        size = len(self.seen)
        self.order, self.compute = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.float64)
        if self.pending:
            ranks = np.concatenate([a.ranks for a in self.pending])
            self.order[:len(ranks)] = ranks
            self.compute[ranks] = np.concatenate([a.compute_time_s for a in self.pending])
        self.pending = None

    def _grow(self, rows: int) -> None:
        super()._grow(rows)
        order, compute = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.float64)
        order[:len(self.order)], compute[:len(self.compute)] = self.order, self.compute
        self.order, self.compute = order, compute

    def scored(self) -> tuple[Ranks, Floats]:
        """The step's ranks in the order they first came in, and their compute times."""
        if self.pending is not None:
            return (np.concatenate([a.ranks for a in self.pending]),
                    np.concatenate([a.compute_time_s for a in self.pending]))
        order = self.order[:self.count]
        return order, self.compute[order]


class OpenVotes(_Track):
    """Digests of one step. Dense: per rank a code into this step's table of distinct digests (its
    last report's), and the replica group each rank last reported (-1: none)."""

    __slots__ = ("params", "param_values", "grads", "grad_values", "groups", "has_groups")

    def __init__(self, world: int) -> None:
        super().__init__(world)
        self.params: Codes = np.empty(0, dtype=np.int32)
        self.param_values: dict[str, int] = {}
        self.grads: Codes = np.empty(0, dtype=np.int32)  # -1: no local-gradient digest
        self.grad_values: dict[str, int] = {}
        self.groups: Ranks = np.empty(0, dtype=np.int64)
        self.has_groups = False

    def densify(self) -> None:
        """Turns the track dense (a rank came twice, or the evidence is read): the aggregates taken
        so far written into per-rank arrays."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        size = len(self.seen)
        self.params = np.zeros(size, dtype=np.int32)
        self.grads = np.full(size, -1, dtype=np.int32)
        self.groups = np.full(size, -1, dtype=np.int64)
        for aggregate in pending:
            self._write(aggregate, 0, len(aggregate))

    def _write(self, aggregate: StepAggregate, start: int, end: int) -> None:
        taken = aggregate.ranks[start:end]
        _write_codes(self.params, self.param_values, aggregate.param_digests, aggregate.ranks, start, end,
                     keep_empty=True)
        self.grads[taken] = -1  # a report without one replaces an earlier one with "not reported"
        _write_codes(self.grads, self.grad_values, aggregate.local_grad_digests, aggregate.ranks, start, end,
                     keep_empty=False)
        groups = aggregate.replica_groups[start:end]
        reported = groups >= 0
        if reported.any():
            self.groups[taken[reported]] = groups[reported]
            self.has_groups = True

    def _grow(self, rows: int) -> None:
        have = len(self.seen)
        super()._grow(rows)
        if self.pending is not None:
            return
        params, grads = np.zeros(rows, dtype=np.int32), np.full(rows, -1, dtype=np.int32)
        groups = np.full(rows, -1, dtype=np.int64)
        params[:have], grads[:have], groups[:have] = self.params, self.grads, self.groups
        self.params, self.grads, self.groups = params, grads, groups

    def by_digest(self) -> dict[str, Ranks]:
        """The parameter digests grouped by value: digest -> its ranks (each rank once)."""
        if self.pending is not None:
            pending = self.pending
            if all(len(a.param_digests) == 1 for a in pending):  # each aggregate agrees within itself
                firsts = [a.param_digests[0].digest for a in pending]
                if len(set(firsts)) == 1:  # and with the others: the usual step
                    return {firsts[0]: np.concatenate([a.ranks for a in pending])}
            parts: dict[str, list[Ranks]] = {}
            for aggregate in pending:
                for group in aggregate.param_digests:
                    whole = len(group.positions) == len(aggregate.ranks)
                    ranks = aggregate.ranks if whole else aggregate.ranks[group.positions]
                    parts.setdefault(group.digest, []).append(ranks)
            return {digest: np.concatenate(arrays) for digest, arrays in parts.items()}
        values = list(self.param_values)
        ranks = self.ranks_seen()
        codes = self.params[ranks]
        if len(values) == 1:
            return {values[0]: ranks}
        if len(values) <= _FEW_DIGESTS:
            return {value: ranks[codes == code] for code, value in enumerate(values)}
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(1, len(values)))
        return dict(zip(values, np.split(ranks[order], bounds)))

    def reported_groups(self) -> Ranks | None:
        """Per rank the replica group it reported (-1: none); None when no rank reported one."""
        if self.pending is not None:
            if not self.pending:
                return None
            groups = np.concatenate([a.replica_groups for a in self.pending])
            reported = groups >= 0
            if not reported.any():
                return None
            ranks = np.concatenate([a.ranks for a in self.pending])
            by_rank: Ranks = np.full(len(self.seen), -1, dtype=np.int64)
            by_rank[ranks[reported]] = groups[reported]
            return by_rank
        return self.groups if self.has_groups else None


def add_times(tracks: dict[int, OpenTimes], step: int, world: int, aggregate: StepAggregate, start: int
              ) -> tuple[int, OpenTimes | None]:
    """Records `aggregate`'s compute times from position `start`; returns where it stopped and the
    step's track if this completed it (the rest, if any, is for a fresh track of the step)."""
    track = tracks.get(step)
    if track is None:
        track = tracks[step] = OpenTimes(world)
    if start == 0 and track._take_whole(aggregate):
        end = len(aggregate.ranks)
    else:
        track._densify()
        ranks = aggregate.ranks[start:]
        before = track.count
        cut, new = track._take(world, ranks)
        track.order[before:track.count] = new
        track.compute[ranks[:cut]] = aggregate.compute_time_s[start:start + cut]
        end = start + cut
    return end, _completed(tracks, step, world, track)


def add_votes(tracks: dict[int, OpenVotes], step: int, world: int, aggregate: StepAggregate, start: int
              ) -> tuple[int, OpenVotes | None]:
    """Records `aggregate`'s digests and replica groups from position `start`, as `add_times`."""
    track = tracks.get(step)
    if track is None:
        track = tracks[step] = OpenVotes(world)
    if start == 0 and track._take_whole(aggregate):
        end = len(aggregate.ranks)
    else:
        track.densify()
        cut, _ = track._take(world, aggregate.ranks[start:])
        end = start + cut
        track._write(aggregate, start, end)
    return end, _completed(tracks, step, world, track)


_T = TypeVar("_T", bound=_Track)


def _completed(tracks: dict[int, _T], step: int, world: int, track: _T) -> _T | None:
    if track.count < world:
        if len(tracks) > MAX_OPEN_STEPS:
            for stale in sorted(tracks)[:-MAX_OPEN_STEPS]:
                del tracks[stale]
        return None
    del tracks[step]
    return track


def preload_votes(tracks: dict[int, OpenVotes], step: int, world: int, ranks: Ranks, digest: str) -> None:
    """Records `digest` for `ranks` at `step` as their reports would (the fleet simulator commits a
    step this way without sending every rank's report)."""
    track = tracks[step] = OpenVotes(world)
    track.densify()
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
