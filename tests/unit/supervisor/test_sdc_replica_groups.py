"""The SDC vote by replica group: ranks compared only with the ranks reported (or configured) to
hold the same shards; trainer.replicas derives the groups from a device mesh's rank grid."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ftsup.supervisor.config import ConfigError, load_job_sdc
from ftsup.supervisor.core.policies.sdc import Replicas, SdcConfig, vote_by_rank
from ftsup.trainer.replicas import _mesh_replicas

A, B = "a" * 32, "b" * 32


def test_fsdp_over_every_rank_compares_nobody_even_when_every_digest_differs() -> None:
    digests = {r: f"{r:032x}" for r in range(4)}
    vote = vote_by_rank(7, digests, 4, SdcConfig(), reported_groups={r: r for r in range(4)})
    assert vote.is_clear and not vote.is_diverged
    # Without the reported groups the same digests split the one data-parallel group.
    assert vote_by_rank(7, digests, 4, SdcConfig()).split


def test_hsdp_groups_vote_apart_and_a_minority_in_one_group_is_named() -> None:
    # 2 replicas x 3 shards, mesh (replicate, shard): rank = replica * 3 + shard, group = shard.
    groups = {r: r % 3 for r in range(9)}
    digests = {r: f"shard{r % 3}".ljust(32, "0") for r in range(9)}
    digests[4] = B
    vote = vote_by_rank(3, digests, 9, SdcConfig(), reported_groups=groups)
    assert [(m.rank, m.group, m.group_size) for m in vote.minorities] == [(4, 1, 3)]
    assert not vote.split


def test_the_job_file_can_switch_the_vote_off_or_to_the_layout_rule() -> None:
    digests = {0: A, 1: B}
    assert vote_by_rank(1, digests, 2, SdcConfig(replicas=Replicas.NONE)).is_clear
    layout = SdcConfig(replicas=Replicas.LAYOUT)
    assert vote_by_rank(1, digests, 2, layout, reported_groups={0: 0, 1: 1}).split  # reports ignored


def test_a_rank_reporting_no_group_keeps_the_layout_rule_apart_from_reported_groups() -> None:
    vote = vote_by_rank(1, {0: A, 1: A, 2: B, 3: B}, 4, SdcConfig(), reported_groups={0: 0, 1: 0})
    assert vote.is_clear  # 2 and 3 reported none: compared with each other only


@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_a_flipped_digest_is_only_ever_blamed_within_its_replica_group(replicas, shards, data) -> None:
    world = replicas * shards
    groups = {r: r % shards for r in range(world)}  # the lowest rank of each shard's replicas
    digests = {r: f"{r % shards:032x}" for r in range(world)}
    bad = data.draw(st.integers(0, world - 1))
    digests[bad] = "f" * 32
    vote = vote_by_rank(1, digests, world, SdcConfig(), reported_groups=groups)
    blamed = {d.rank for d in vote.minorities} | {d.rank for d in vote.split}
    assert blamed <= {r for r in range(world) if groups[r] == groups[bad]}
    assert vote.is_clear == (replicas == 1)  # alone in its group, a flip cannot be seen
    if replicas >= 3:
        assert [m.rank for m in vote.minorities] == [bad]


@pytest.mark.parametrize(("grid", "coordinate", "replicated", "rank", "expected"), [
    ([0, 1, 2, 3], [2], [False], 2, {2}),  # FSDP over every rank: alone
    ([0, 1, 2, 3], [2], [True], 2, {0, 1, 2, 3}),  # replicated (DDP as a DTensor)
    ([[0, 1, 2], [3, 4, 5]], [1, 1], [True, False], 4, {1, 4}),  # HSDP (replicate, shard)
    ([[0, 1], [2, 3]], [0, 1], [False, True], 1, {0, 1}),  # (dp sharded, tp replicated)
    ([0, 1], None, [False], 5, {5}),  # a rank outside the mesh
])
def test_replicas_are_the_ranks_sharing_every_sharded_coordinate(grid, coordinate, replicated, rank, expected):
    assert _mesh_replicas(torch.tensor(grid), coordinate, replicated, rank) == expected


def test_the_job_file_states_replicas_and_bad_values_name_the_key(tmp_path: pathlib.Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"nodes": 1, "argv": ["x"], "sdc_replicas": "layout", "model_parallel_size": 4}))
    assert load_job_sdc(job) == SdcConfig(model_parallel_size=4, replicas=Replicas.LAYOUT)
    job.write_text(json.dumps({"nodes": 1, "argv": ["x"], "sdc_replicas": "some"}))
    with pytest.raises(ConfigError, match="sdc_replicas must be one of"):
        load_job_sdc(job)
