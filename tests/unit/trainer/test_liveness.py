"""Level 1 liveness (issue 13): heartbeats and named phases, trainer side and the agent's hang rule."""

from __future__ import annotations

import warnings

import pytest

from ftsup.agent.core.hang import HangConfig, Phase, check_hang, hang_limit_s
from ftsup.agent.progress import ProgressTracker
from ftsup.trainer import offline
from ftsup.trainer.liveness import Liveness
from ftsup.trainer.session import Session

CONFIG = HangConfig(multiple=10.0, floor_s=120.0, startup_s=600.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_phase_has_its_own_hang_limit_and_leaving_it_restores_the_step_based_one():
    steps = [1.0] * 5
    assert hang_limit_s(steps, CONFIG) == 120.0
    assert hang_limit_s(steps, CONFIG, Phase("eval", 1800.0)) == 1800.0
    assert check_hang(steps, last_progress_s=0.0, now=1000.0, config=CONFIG, phase=Phase("eval", 1800.0)) is None
    hang = check_hang(steps, last_progress_s=0.0, now=1801.0, config=CONFIG, phase=Phase("eval", 1800.0))
    assert hang is not None and hang.phase == "eval" and hang.limit_s == 1800.0
    assert check_hang(steps, 0.0, 121.0, CONFIG) is not None  # outside the phase: 120 s
    assert hang_limit_s(steps, CONFIG, Phase("save", 0.0)) == 120.0  # 0: the step-time limit


def test_liveness_reports_phases_nested_and_rate_limits_heartbeats():
    sent = []
    clock = Clock()
    live = Liveness(sent.append, lambda: (3, 1), clock=clock)
    live.heartbeat()
    live.heartbeat()  # within a second: not sent again
    with live.phase("eval", timeout_s=1800):
        with live.phase("save", timeout_s=600):
            assert live.phase_name == "save"
        assert live.phase_name == "eval"
    assert [(r.generation, r.rank, r.phase, r.phase_timeout_s) for r in sent] == [
        (3, 1, "", 0.0), (3, 1, "eval", 1800.0), (3, 1, "save", 600.0), (3, 1, "eval", 1800.0), (3, 1, "", 0.0)]
    clock.now += 1.0
    live.heartbeat()
    assert len(sent) == 6
    with pytest.raises(ValueError, match="timeout_s"), live.phase("eval", timeout_s=-1):
        pass


def test_a_lost_liveness_report_is_logged_not_raised():
    def down(_report: object) -> None:
        raise RuntimeError("agent unreachable")

    with Liveness(down, lambda: (1, 0)).phase("eval", 60):
        pass


def test_the_agent_judges_only_ranks_that_report_and_a_heartbeat_is_progress():
    clock = Clock()
    tracker = ProgressTracker(clock)
    tracker.start_generation(1, (0, 1))
    assert not tracker.ranks[0].is_watched  # a plain script: never judged
    clock.now += 50
    tracker.record_liveness(1, 0, Phase("eval", 1800.0))
    progress = tracker.ranks[0]
    assert progress.is_watched and progress.last_progress_s == clock.now and progress.phase == Phase("eval", 1800.0)
    tracker.record_liveness(1, 0, None)
    assert tracker.ranks[0].phase is None
    tracker.record_liveness(2, 1, None)  # another generation's: ignored
    assert not tracker.ranks[1].is_watched
    tracker.attach(2, 1)  # a Session of generation 2 spoke before the watcher switched to it
    tracker.start_generation(2, (0, 1))
    assert tracker.ranks[1].is_watched and not tracker.ranks[0].is_watched


def test_session_from_env_outside_ftsup_is_a_no_op_with_one_warning(monkeypatch):
    monkeypatch.setattr(offline, "_warned", False)
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = Session.from_env(env)
        Session.from_env(env)
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == [
        ("ftsup: no FTSUP_AGENT_ADDRESS (not launched by ftsup): Session is a no-op here;"
         " nothing is snapshotted, reported or restored")]
    assert (session.rank, session.world_size, session.node_id) == (1, 2, "offline")
    session.heartbeat()
    with session.phase("eval", timeout_s=60):
        pass
    session.close()
