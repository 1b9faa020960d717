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
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress


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


def vote_step(step: int, digests: Mapping[int, str], world_size: int, config: SdcConfig,
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


def is_convicting(dissent: Dissent, config: SdcConfig) -> bool:
    """A minority outvoted in a large enough group names its node as the culprit."""
    return bool(dissent.majority_digest) and dissent.group_size >= config.min_group_to_convict


def _short(digest: str) -> str:
    return digest[:12]
