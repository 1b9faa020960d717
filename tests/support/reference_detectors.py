"""The per-rank implementations the array detectors replaced (issue 14), kept as references.

The straggler detector and the SDC vote used to work on one Python object per rank: a frozen
window tuple per rank rebuilt every step, a rank -> digest dict. They are plain and obviously
right, and too slow at 100,000 ranks; tests hold the numpy implementations in
supervisor/core/policies/ to exactly these verdicts, windows, votes and reasons. Not imported by
the product.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress

from ftsup.supervisor.core.policies.sdc import Dissent, Replicas, SdcConfig, StepVote
from ftsup.supervisor.core.policies.straggler import MAD_TO_SIGMA, StragglerConfig, StragglerVerdict


@dataclass(frozen=True, slots=True)
class RefRankWindow:
    steps: tuple[int, ...] = ()  # oldest first, at most window_steps
    scores: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class RefStragglerState:
    """The detector's memory. Never mutated: `observe_step` returns a new one (soft state, not logged)."""

    last_step: int | None = None
    windows: Mapping[int, RefRankWindow] = field(default_factory=dict)
    flagged: frozenset[int] = frozenset()


def ref_robust_scores(times: Mapping[int, float], min_rel_spread: float) -> tuple[float, dict[int, float]]:
    """Returns (median, rank -> robust z) for one step's compute times."""
    median = statistics.median(times.values())
    mad = statistics.median(abs(t - median) for t in times.values())
    scale = max(MAD_TO_SIGMA * mad, min_rel_spread * abs(median), 1e-12)
    return median, {rank: (t - median) / scale for rank, t in times.items()}


def ref_observe_step(
    state: RefStragglerState, step: int, compute_times_by_rank: Mapping[int, float], config: StragglerConfig
) -> tuple[RefStragglerState, list[StragglerVerdict]]:
    """Folds one step's per-rank compute times into the state; returns it with any flag/clear verdicts.

    Steps at or before `state.last_step` are stale and ignored. A step with fewer than
    `config.min_ranks` ranks is unknown: it moves `last_step` but scores nobody.
    """
    if state.last_step is not None and step <= state.last_step:
        return state, []
    if len(compute_times_by_rank) < config.min_ranks:
        return RefStragglerState(step, state.windows, state.flagged), []
    median, scores = ref_robust_scores(compute_times_by_rank, config.min_rel_spread)
    n = config.window_steps
    windows = dict(state.windows)
    flagged = set(state.flagged)
    verdicts: list[StragglerVerdict] = []
    for rank, z in scores.items():
        old = windows.get(rank)
        if old is None:
            window = RefRankWindow((step,), (z,))
        else:
            window = RefRankWindow((old.steps + (step,))[-n:], (old.scores + (z,))[-n:])
        windows[rank] = window
        if rank in flagged:
            over = sum(1 for s in window.scores if s >= config.clear_z)
            if over <= config.clear_max_over:
                flagged.discard(rank)
                reason = (
                    f"cleared: only {over} of the last {len(window.scores)} steps at z >= {config.clear_z:g} "
                    f"(clear at <= {config.clear_max_over})"
                )
                verdicts.append(_verdict(rank, step, False, reason, window, over, compute_times_by_rank, median))
        elif z >= config.flag_z and len(window.scores) >= config.flag_min_over:
            over = sum(1 for s in window.scores if s >= config.flag_z)
            if over >= config.flag_min_over:
                flagged.add(rank)
                slower = (compute_times_by_rank[rank] / median - 1.0) * 100 if median else float("inf")
                reason = (
                    f"straggler: {over} of the last {len(window.scores)} steps at z >= {config.flag_z:g} "
                    f"(needs {config.flag_min_over}); now {slower:+.1f}% vs the cohort median"
                )
                verdicts.append(_verdict(rank, step, True, reason, window, over, compute_times_by_rank, median))
    return RefStragglerState(step, windows, frozenset(flagged)), verdicts


def _verdict(
    rank: int, step: int, is_straggler: bool, reason: str, window: RefRankWindow, over: int,
    times: Mapping[int, float], median: float,
) -> StragglerVerdict:
    return StragglerVerdict(
        rank=rank, step=step, is_straggler=is_straggler, reason=reason, scores=window.scores,
        window=(window.steps[0], window.steps[-1]), over_threshold=over, compute_time=times[rank],
        cohort_median=median,
    )


def ref_vote_step(step: int, digests: Mapping[int, str], world_size: int, config: SdcConfig,
              reported_groups: Mapping[int, int] | None = None) -> StepVote:
    """Votes on one step's digests (rank -> digest; "" = not reported) once every rank reported.

    `reported_groups`: rank -> the replica group it reported (ranks absent reported none)."""
    if len(digests) < world_size:
        missing = sorted(set(range(world_size)) - set(digests))
        return StepVote(step, False, (), (), f"step {step}: waiting for ranks {missing[:8]}")
    groups: dict[int, dict[int, str]] = {}
    if config.replicas is Replicas.NONE:
        return StepVote(step, True, (), (), f"step {step}: no replicas configured, nothing compared")
    if config.replicas is Replicas.REPORTED and reported_groups:
        # Reported groups are named by their lowest rank; a rank that reported none keeps the
        # layout rule's group, kept apart from the reported ones (negative ids).
        for rank, digest in digests.items():
            if digest:
                group = reported_groups.get(rank)
                key = group if group is not None else -1 - config.shard_group(rank)
                groups.setdefault(key, {})[rank] = digest
    elif config.model_parallel_size == 1:  # one group: every reported digest (12,500 at 100k GPUs, in C)
        reported = dict(compress(digests.items(), digests.values()))
        if reported:
            groups[0] = reported
    else:
        for rank, digest in digests.items():
            if digest:
                groups.setdefault(config.shard_group(rank), {})[rank] = digest
    minorities: list[Dissent] = []
    split: list[Dissent] = []
    for group, by_rank in sorted(groups.items()):
        counts = Counter(by_rank.values())
        if len(counts) == 1:
            continue
        (top, votes), = counts.most_common(1)
        size = len(by_rank)
        if 2 * votes > size:
            minorities += [Dissent(r, d, top, group, size) for r, d in sorted(by_rank.items()) if d != top]
        else:
            split += [Dissent(r, d, "", group, size) for r, d in sorted(by_rank.items())]
    if not minorities and not split:
        compared = sum(len(g) for g in groups.values())
        return StepVote(step, True, (), (), f"step {step}: {compared} digests agree in {len(groups)} group(s)")
    parts = [f"rank {m.rank} {_short(m.digest)} vs majority {_short(m.majority_digest)}" for m in minorities]
    parts += [f"group {g} split {sorted(Counter(d.digest for d in split if d.group == g).values(), reverse=True)}"
              for g in sorted({d.group for d in split})]
    return StepVote(step, False, tuple(minorities), tuple(split), f"step {step}: " + "; ".join(parts))


def _short(digest: str) -> str:
    return digest[:12]
