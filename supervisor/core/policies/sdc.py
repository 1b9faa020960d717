"""SDC digest vote: which ranks disagree with their replicas after an optimizer step.

Pure. Every data-parallel replica must hold the same parameter bits after each step (DESIGN.md:
one logical model state), so ranks that hold the same shard report the same digest. Per step the
ranks are grouped by shard, and only ranks of one group are compared. Where the groups come from
is `SdcConfig.replicas`: REPORTED (default) takes each rank's reported replica group (derived
from its device mesh by trainer.replicas: under FSDP over every rank each rank is alone and
nothing is compared; under HSDP or TP the ranks holding the same shard vote together), and a
rank that reported none falls back to the layout rule; LAYOUT uses only the layout rule
(`model_parallel_size`, data parallelism outermost); NONE compares nobody. Within a group a digest held by a strict majority
wins: the others are *minorities* (their nodes are SDC suspects). A group with no strict
majority (2 vs 2, or 1 vs 1) is *split*: something is wrong but the vote cannot say who, which is
what the recompute check (`policies/recompute.py`) is for. A rank that reported no digest is
"unknown, skip", never a vote. A step is *clear* (its snapshots and checkpoints may be committed)
only when every rank reported and no group disagreed.

The vote takes digests grouped by value with their ranks (the wire's form, merged across a step's
aggregates: issue 14), so a step of 100,000 agreeing ranks costs a few array passes, not a Counter
over 100,000 strings. The per-rank implementation it replaced is the reference in
tests/support/reference_detectors.py, held equal by a property test.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Ranks = npt.NDArray[np.int64]


class Replicas(enum.Enum):
    """Which ranks must hold the same parameter bits (the job file's `sdc_replicas`)."""

    REPORTED = "reported"  # each rank's reported replica group; the layout rule for ranks that report none
    LAYOUT = "layout"  # rank % model_parallel_size, whatever the ranks report
    NONE = "none"  # nobody is a replica of anybody (e.g. a pipeline without data parallelism): no vote


@dataclass(frozen=True, slots=True)
class SdcConfig:
    # Ranks per model replica (tensor x pipeline parallel size), with data parallelism the
    # outermost mesh dimension (rank = dp_index * model_parallel_size + shard): ranks r and r'
    # must hold identical shards when r % model_parallel_size == r' % model_parallel_size.
    model_parallel_size: int = 1
    # A minority digest in a group of at least this many ranks quarantines the rank's node: the
    # majority, on other ranks, is the confirmation. Smaller groups can only split.
    min_group_to_convict: int = 3
    replicas: Replicas = Replicas.REPORTED

    def __post_init__(self) -> None:
        if not 1 <= self.model_parallel_size <= 65536:
            raise ValueError(f"model_parallel_size must be within [1, 65536], got {self.model_parallel_size}")
        if not 3 <= self.min_group_to_convict <= 65536:
            raise ValueError(f"min_group_to_convict must be within [3, 65536], got {self.min_group_to_convict}")

    def shard_group(self, rank: int) -> int:
        """The id of the ranks that must match `rank` bit for bit."""
        return rank % self.model_parallel_size


@dataclass(frozen=True, slots=True)
class Dissent:
    """A rank whose digest differs from its group's; `majority_digest` is "" for a split group."""

    rank: int
    digest: str
    majority_digest: str
    group: int
    group_size: int


@dataclass(frozen=True, slots=True)
class StepVote:
    step: int
    is_clear: bool  # every rank reported and every group agreed: commits may use this step
    minorities: tuple[Dissent, ...]  # outvoted by a strict majority: the suspects
    split: tuple[Dissent, ...]  # every rank of groups without a strict majority
    reason: str

    @property
    def is_diverged(self) -> bool:
        return bool(self.minorities or self.split)


def vote_step(step: int, digests: Mapping[str, Ranks], world_size: int, config: SdcConfig,
              reported_groups: Ranks | None = None) -> StepVote:
    """Votes on one step's digests, grouped by value (digest -> the ranks that reported it, each
    rank once; "" = not reported), once every rank reported.

    `reported_groups`: indexed by rank, the replica group each rank reported, -1 for none (None:
    no rank reported one). Works on arrays: agreement is checked per group with one pass of
    ufuncs, and only a group that disagrees is walked rank by rank (to name its dissenters)."""
    count = sum(len(ranks) for ranks in digests.values())
    if count < world_size:
        present = np.concatenate([*digests.values(), np.empty(0, dtype=np.int64)])
        missing = np.setdiff1d(np.arange(world_size, dtype=np.int64), present)[:8].tolist()
        return StepVote(step, False, (), (), f"step {step}: waiting for ranks {missing}")
    if config.replicas is Replicas.NONE:
        return StepVote(step, True, (), (), f"step {step}: no replicas configured, nothing compared")
    values = [digest for digest, ranks in digests.items() if digest and len(ranks)]
    if not values:
        return StepVote(step, True, (), (), f"step {step}: 0 digests agree in 0 group(s)")
    ranks = np.concatenate([digests[v] for v in values]).astype(np.int64, copy=False)
    codes = np.repeat(np.arange(len(values), dtype=np.int64), [len(digests[v]) for v in values])
    has_reported = (config.replicas is Replicas.REPORTED and reported_groups is not None
                    and bool(np.any(reported_groups >= 0)))
    if has_reported:
        # Reported groups are named by their lowest rank; a rank that reported none keeps the
        # layout rule's group, kept apart from the reported ones (negative ids).
        assert reported_groups is not None
        reported = reported_groups[ranks]
        keys = np.where(reported >= 0, reported, -1 - ranks % config.model_parallel_size)
    elif config.model_parallel_size == 1:
        if len(values) == 1:  # the usual step: one group, one digest (100,000 ranks, no Python loop)
            return StepVote(step, True, (), (), f"step {step}: {len(ranks)} digests agree in 1 group(s)")
        keys = np.zeros(len(ranks), dtype=np.int64)
    else:
        keys = ranks % config.model_parallel_size
    low = int(keys.min())
    shifted = keys - low
    size = int(shifted.max()) + 1
    lowest, highest = np.full(size, len(values), dtype=np.int64), np.full(size, -1, dtype=np.int64)
    np.minimum.at(lowest, shifted, codes)
    np.maximum.at(highest, shifted, codes)
    present = highest >= 0
    split_groups = np.flatnonzero(present & (lowest != highest))
    if len(split_groups) == 0:
        groups = int(np.count_nonzero(present))
        return StepVote(step, True, (), (), f"step {step}: {len(ranks)} digests agree in {groups} group(s)")
    minorities: list[Dissent] = []
    split: list[Dissent] = []
    for index in split_groups.tolist():  # ascending: groups in the order of their ids
        members = np.flatnonzero(shifted == index)
        order = members[np.argsort(ranks[members], kind="stable")]
        group_ranks, group_codes = ranks[order].tolist(), codes[order].tolist()
        votes = np.bincount(codes[members], minlength=len(values))
        top = int(np.argmax(votes))
        group, size_ = index + low, len(members)
        if 2 * int(votes[top]) > size_:
            minorities += [Dissent(r, values[c], values[top], group, size_)
                           for r, c in zip(group_ranks, group_codes) if c != top]
        else:
            split += [Dissent(r, values[c], "", group, size_) for r, c in zip(group_ranks, group_codes)]
    parts = [f"rank {m.rank} {_short(m.digest)} vs majority {_short(m.majority_digest)}" for m in minorities]
    parts += [f"group {g} split {sorted(Counter(d.digest for d in split if d.group == g).values(), reverse=True)}"
              for g in sorted({d.group for d in split})]
    return StepVote(step, False, tuple(minorities), tuple(split), f"step {step}: " + "; ".join(parts))


def vote_by_rank(step: int, digests: Mapping[int, str], world_size: int, config: SdcConfig,
                 reported_groups: Mapping[int, int] | None = None) -> StepVote:
    """`vote_step` from rank -> digest and rank -> reported group (benches, tests, small callers)."""
    by_value: dict[str, list[int]] = {}
    for rank, digest in digests.items():
        by_value.setdefault(digest, []).append(rank)
    grouped = {digest: np.array(ranks, dtype=np.int64) for digest, ranks in by_value.items()}
    groups = None
    if reported_groups:
        groups = np.full(max([*digests, *reported_groups, world_size - 1]) + 1, -1, dtype=np.int64)
        groups[list(reported_groups)] = list(reported_groups.values())
    return vote_step(step, grouped, world_size, config, groups)


def is_convicting(dissent: Dissent, config: SdcConfig) -> bool:
    """A minority outvoted in a large enough group names its node as the culprit."""
    return bool(dissent.majority_digest) and dissent.group_size >= config.min_group_to_convict


def _short(digest: str) -> str:
    return digest[:12]
