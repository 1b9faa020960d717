"""The snapshot cadence (trainer/core/cadence.py) and the Session's schedule around it: every rank
snapshots the same steps, auto mode aims at the configured interval, a fixed k never talks to
the other ranks, and local-gradient digests are wanted only for steps a recompute can replay."""

import pytest
import torch

from ftsup.trainer.core import cadence
from ftsup.trainer.schedule import Schedule, config_from_mapping
from tests.unit.trainer.test_trainer_session import FakeClient, make_session


class Clock:
    def __init__(self) -> None:
        self.now = 0.0  # steps of 1/8 s below: exact in binary, no rounding in the pace

    def __call__(self) -> float:
        return self.now


def run(schedule: Schedule, clock: Clock, steps: range, step_s: float) -> list[int]:
    due = []
    for step in steps:
        clock.now += step_s
        if schedule.is_due(step):
            due.append(step)
    return due


def test_a_fixed_cadence_snapshots_every_k_steps_from_the_start_and_never_agrees():
    asked: list[int] = []
    schedule = Schedule(cadence.CadenceConfig(every_steps=3), Clock(), agree=lambda v: asked.append(v) or v)
    assert run(schedule, Clock(), range(1, 11), 0.01) == [3, 6, 9]
    assert asked == [] and schedule.every == 3


def test_every_step_is_the_old_contract():
    schedule = Schedule(cadence.CadenceConfig(every_steps=1), Clock())
    schedule.restart(4)  # restored step 4
    assert run(schedule, Clock(), range(5, 10), 5.0) == [5, 6, 7, 8, 9]


def test_auto_spaces_snapshots_by_the_interval_at_the_measured_pace():
    clock = Clock()
    schedule = Schedule(cadence.CadenceConfig(interval_s=1.0), clock)
    due = run(schedule, clock, range(1, 101), 0.125)  # 8 steps per second
    # Step 1 marks the pace, step 2 measures it: k = 8 from the start (step 0 is the initial state).
    assert due[0] == 8 and schedule.every == 8
    assert all(b - a == 8 for a, b in zip(due, due[1:]))


def test_auto_does_not_snapshot_the_steps_right_after_a_restore_the_restored_step_is_held():
    clock = Clock()
    schedule = Schedule(cadence.CadenceConfig(interval_s=1.0), clock)
    schedule.restart(30)
    due = run(schedule, clock, range(31, 60), 0.25)  # 4 steps per second
    assert due[0] == 34 and all(b - a == 4 for a, b in zip(due, due[1:]))


def test_auto_with_steps_longer_than_the_interval_snapshots_every_step_once_measured():
    clock = Clock()
    schedule = Schedule(cadence.CadenceConfig(interval_s=1.0), clock)
    assert run(schedule, clock, range(1, 6), 3.0) == [2, 3, 4, 5]
    assert schedule.every == 1


def test_auto_agrees_on_the_smallest_proposal_so_ranks_with_different_clocks_snapshot_the_same_steps():
    proposals: list[int] = []

    def agree(mine: int) -> int:
        proposals.append(mine)
        return min(mine, 4)  # another rank measured a slower pace: it proposes 4

    clock = Clock()
    schedule = Schedule(cadence.CadenceConfig(interval_s=1.0), clock, agree=agree)
    due = run(schedule, clock, range(1, 20), 0.125)
    assert due == [4, 8, 12, 16]
    assert proposals[0] == 8 and len(proposals) == 1 + len(due)  # step 2, then each snapshot step
    assert schedule.every == 4


def test_auto_follows_a_change_of_pace_at_the_next_snapshot_step():
    clock = Clock()
    schedule = Schedule(cadence.CadenceConfig(interval_s=1.0), clock)
    run(schedule, clock, range(1, 23), 0.125)
    assert schedule.every == 8
    run(schedule, clock, range(23, 60), 0.5)  # steps got slower (an eval, a bigger batch)
    assert schedule.every == 2


def test_a_restart_begins_the_cadence_at_its_step():
    clock = Clock()
    schedule = Schedule(cadence.CadenceConfig(every_steps=5), clock)
    run(schedule, clock, range(1, 4), 0.1)
    schedule.restart(2)
    assert [s for s in range(3, 13) if schedule.is_due(s)] == [7, 12]


@pytest.mark.parametrize("env, message", [
    ({"FTSUP_SNAPSHOT_EVERY_STEPS": "x"}, "FTSUP_SNAPSHOT_EVERY_STEPS='x' is not an integer"),
    ({"FTSUP_SNAPSHOT_EVERY_STEPS": "-1"}, "every_steps must be within [0, 10000]"),
    ({"FTSUP_SNAPSHOT_INTERVAL_S": "0"}, "interval_s must be within (0, 86400]"),
    ({"FTSUP_SNAPSHOT_INTERVAL_S": "nan"}, "interval_s must be within"),
    ({"FTSUP_SNAPSHOT_INTERVAL_S": "soon"}, "FTSUP_SNAPSHOT_INTERVAL_S='soon' is not a number"),
])
def test_a_bad_cadence_in_the_environment_is_refused_naming_it(env, message):
    with pytest.raises(ValueError) as err:
        config_from_mapping(env)
    assert message in str(err.value)


def test_the_environment_sets_the_cadence_and_unset_means_auto_at_one_second():
    assert config_from_mapping({}) == cadence.CadenceConfig(0, 1.0)
    assert config_from_mapping({"FTSUP_SNAPSHOT_EVERY_STEPS": "1"}).every_steps == 1
    assert config_from_mapping({"FTSUP_SNAPSHOT_INTERVAL_S": "2.5"}).interval_s == 2.5


def test_session_wants_a_gradient_digest_only_for_the_step_after_a_snapshot():
    session = make_session(FakeClient())
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert not session.wants_grad_digest(1)  # nothing snapshotted: no replay can start anywhere
    session.snapshot(4, model, optimizer)
    session.wait_for_snapshots()
    assert session.wants_grad_digest(5)
    assert not session.wants_grad_digest(6) and not session.wants_grad_digest(4)
    session.close()


def test_session_snapshot_due_follows_its_schedule_and_checks_the_step():
    session = make_session(FakeClient())
    session.schedule = Schedule(cadence.CadenceConfig(every_steps=2), Clock())
    assert [s for s in range(1, 8) if session.snapshot_due(s)] == [2, 4, 6]
    assert session.snapshot_every == 2
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        session.snapshot_due(-1)
    session.close()


def test_the_framework_callbacks_follow_the_sessions_cadence_unless_given_a_fixed_k():
    from ftsup.trainer.integrations.state import check_snapshot_every, is_snapshot_step

    session = make_session(FakeClient())
    session.schedule = Schedule(cadence.CadenceConfig(every_steps=3), Clock())
    assert [s for s in range(1, 8) if is_snapshot_step(session, s, None)] == [3, 6]  # the default
    assert [s for s in range(1, 8) if is_snapshot_step(session, s, 2)] == [2, 4, 6]
    assert not any(is_snapshot_step(session, s, 0) for s in range(1, 8))
    for bad in (-1, True):
        with pytest.raises(ValueError, match="snapshot_every must be None"):
            check_snapshot_every(bad)
    session.close()
