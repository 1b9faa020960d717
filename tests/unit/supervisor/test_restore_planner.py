"""Restore planner: each rung of the recovery ladder, the whole-world rule, taint and refusal."""

from __future__ import annotations

from ftsup.supervisor.core.events import RankAssignment, RestoreKind
from ftsup.supervisor.core.policies.restore import Holding, RestoreWorld, plan_restore

# 4 nodes x 2 ranks; each node's buddy is the next node (ring), as the elastic planner lays out.
OLD = (
    RankAssignment("n1", (0, 1), "n2"),
    RankAssignment("n2", (2, 3), "n3"),
    RankAssignment("n3", (4, 5), "n4"),
    RankAssignment("n4", (6, 7), "n1"),
)
ALL = frozenset({"n1", "n2", "n3", "n4", "s1"})


def held_twice(step: int, layout=OLD) -> tuple[Holding, ...]:
    """Every rank's snapshot of `step` on its node and its buddy (a committed step)."""
    return tuple(
        Holding(node, rank, step) for m in layout for rank in m.ranks for node in (m.node_id, m.buddy_node_id)
    )


def replaced(lost: str, by: str) -> tuple[RankAssignment, ...]:
    return tuple(RankAssignment(by if m.node_id == lost else m.node_id, m.ranks, m.buddy_node_id) for m in OLD)


def kinds(plan) -> dict[int, tuple[RestoreKind, str]]:
    return {r.rank: (r.kind, r.source_node_id) for r in plan.restores}


def test_with_every_node_alive_each_rank_restores_the_newest_step_from_its_own_ram():
    plan = plan_restore(RestoreWorld(OLD, held_twice(7) + held_twice(8), ALL, checkpoint_step=5))
    assert plan.step == 8 and not plan.is_refused
    assert all(kind is RestoreKind.LOCAL_SNAPSHOT for kind, _ in kinds(plan).values())
    assert kinds(plan)[2] == (RestoreKind.LOCAL_SNAPSHOT, "n2")
    assert plan.reason == "step 8: rank(s) 0-7 from their own node's RAM"


def test_a_lost_nodes_ranks_come_from_the_buddys_ram_onto_the_spare():
    world = RestoreWorld(replaced("n2", "s1"), held_twice(8), ALL - {"n2"}, checkpoint_step=None)
    plan = plan_restore(world)
    assert plan.step == 8
    assert kinds(plan)[2] == kinds(plan)[3] == (RestoreKind.PEER_SNAPSHOT, "n3")
    assert {r for r, (k, _) in kinds(plan).items() if k is RestoreKind.LOCAL_SNAPSHOT} == {0, 1, 4, 5, 6, 7}
    assert "rank(s) 2-3 from a peer's RAM (n3)" in plan.reason


def test_a_rank_and_its_buddy_both_lost_sends_everyone_to_the_object_store_checkpoint():
    # n2 holds ranks 2,3 and n3 is their buddy: both gone, so step 8 cannot be rebuilt whole.
    layout = tuple(RankAssignment({"n2": "s1", "n3": "s2"}.get(m.node_id, m.node_id), m.ranks, m.buddy_node_id) for m in OLD)
    world = RestoreWorld(layout, held_twice(8), ALL - {"n2", "n3"}, checkpoint_step=6)
    plan = plan_restore(world)
    assert plan.step == 6 and not plan.is_refused
    assert {kind for kind, _ in kinds(plan).values()} == {RestoreKind.CHECKPOINT}  # one model state for all
    assert "step 6: rank(s) 0-7 from the object-store checkpoint" in plan.reason
    assert "step 8 lacks rank(s) 2-3" in plan.reason


def test_a_rank_and_its_buddy_both_lost_with_no_checkpoint_is_refused_naming_them():
    layout = replaced("n2", "s1")
    world = RestoreWorld(layout, held_twice(8), ALL - {"n2", "n3"}, checkpoint_step=None, allow_fresh=False)
    plan = plan_restore(world)
    assert plan.is_refused and plan.step is None and plan.restores == ()
    assert plan.reason == (
        "refused: every RAM copy of rank(s) 2-3 is gone (held only by n2, n3, unreachable);"
        " no object-store checkpoint to fall back on"
    )


def test_the_same_loss_starts_from_step_zero_when_a_fresh_start_is_allowed():
    world = RestoreWorld(replaced("n2", "s1"), held_twice(8), ALL - {"n2", "n3"}, checkpoint_step=None)
    plan = plan_restore(world)
    assert plan.step is None and not plan.is_refused
    assert {kind for kind, _ in kinds(plan).values()} == {RestoreKind.FRESH} and len(plan.restores) == 8
    assert plan.reason.startswith("starting from step 0: every RAM copy of rank(s) 2-3 is gone")


def test_a_step_still_in_flight_for_one_rank_is_skipped_for_the_newest_whole_one():
    partial = tuple(h for h in held_twice(9) if h.rank != 3)  # rank 3's step-9 copy not handed off yet
    plan = plan_restore(RestoreWorld(OLD, held_twice(8) + partial, ALL, checkpoint_step=None))
    assert plan.step == 8 and "newer: step 9 lacks rank(s) 3" in plan.reason


def test_a_checkpoint_newer_than_every_whole_ram_step_wins():
    plan = plan_restore(RestoreWorld(OLD, held_twice(4), ALL, checkpoint_step=6))
    assert plan.step == 6 and {kind for kind, _ in kinds(plan).values()} == {RestoreKind.CHECKPOINT}


def test_at_the_checkpoints_own_step_ram_is_preferred_and_only_missing_ranks_read_the_store():
    ram = tuple(h for h in held_twice(6) if h.rank != 5)  # rank 5's copies of step 6 were dropped
    plan = plan_restore(RestoreWorld(OLD, ram, ALL, checkpoint_step=6))
    assert plan.step == 6
    assert kinds(plan)[5] == (RestoreKind.CHECKPOINT, "")
    assert kinds(plan)[4] == (RestoreKind.LOCAL_SNAPSHOT, "n3")


def test_sdc_tainted_steps_are_never_restored_from_ram_or_the_object_store():
    world = RestoreWorld(OLD, held_twice(7) + held_twice(8), ALL, checkpoint_step=8, tainted_from_step=8)
    plan = plan_restore(world)
    assert plan.step == 7 and all(k is RestoreKind.LOCAL_SNAPSHOT for k, _ in kinds(plan).values())

    only_tainted = RestoreWorld(OLD, held_twice(8), ALL, checkpoint_step=9, tainted_from_step=8, allow_fresh=False)
    refused = plan_restore(only_tainted)
    assert refused.is_refused
    assert "steps from 8 on are SDC-tainted" in refused.reason and "checkpoint at step 9 is tainted" in refused.reason


def test_a_first_generation_with_nothing_held_starts_fresh():
    plan = plan_restore(RestoreWorld(OLD, (), ALL, checkpoint_step=None))
    assert plan.step is None and {k for k, _ in kinds(plan).values()} == {RestoreKind.FRESH}
    assert plan.reason == "starting from step 0: no RAM snapshot or checkpoint exists yet"
