"""Level 0 (issue 13): a plain torchrun script under ftsup. Exit 0 of every rank completes the
job; failures restart the gang until the restart budget is spent, then JobFailed names the cause."""

from __future__ import annotations

import dataclasses

from ftsup.supervisor.core import budget
from ftsup.supervisor.core.directives import Action, directive_for
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationStarted,
    JobCompleted,
    JobFailed,
)
from ftsup.supervisor.core.inputs import Heartbeat, StreamClosed, Tick, TrainerExit
from tests.support.builders import NOW, Sim, config, hello


def cluster(max_restarts: int | None, *, nodes: int = 1, spares: int = 0) -> Sim:
    cfg = config(nodes=nodes)
    sim = Sim(dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, max_restarts=max_restarts)))
    for i in range(nodes):
        sim.events(hello(f"n{i + 1}", stream_id=i + 1))
    for j in range(spares):
        sim.events(hello(f"s{j + 1}", spare=True, stream_id=10 + j))
    assert sim.state.generation is not None
    return sim


def crash(sim: Sim, rank: int = 1, code: int = -9, tail: str = "Traceback ...\nRuntimeError: boom\n") -> list:
    generation = sim.state.generation
    assert generation is not None
    node = generation.node_of_rank(rank)
    assert node is not None
    return sim.events(TrainerExit(node, generation.number, rank, code, False, output_tail=tail, is_plain_script=True))


def test_every_rank_of_a_plain_script_exiting_0_completes_the_job():
    sim = cluster(max_restarts=None)
    assert sim.events(TrainerExit("n1", 1, 0, 0, False, is_plain_script=True)) == []
    events = sim.events(TrainerExit("n1", 1, 1, 0, False, is_plain_script=True))
    assert [type(e) for e in events] == [GenerationEnded, JobCompleted]
    assert events[0].reason is EndReason.COMPLETED
    assert sim.state.completion is not None and sim.waiting_reason == "job completed"


def test_a_session_user_exiting_0_without_finishing_is_still_a_failure():
    sim = cluster(max_restarts=None)
    events = sim.events(TrainerExit("n1", 1, 0, 0, False, is_plain_script=False))
    assert isinstance(events[0], GenerationEnded) and events[0].reason is EndReason.TRAINER_EXITED


def test_a_crash_restarts_the_gang_and_the_ended_record_carries_rank_code_and_output_tail():
    sim = cluster(max_restarts=1)
    ended, started = crash(sim)
    assert isinstance(ended, GenerationEnded)
    assert (ended.rank, ended.exit_code, ended.detail) == (1, -9, "rank 1 exited with signal 9")
    assert "RuntimeError: boom" in ended.output_tail
    assert isinstance(started, GenerationStarted) and started.generation == 2
    assert sim.state.failures == 1
    run = directive_for(sim.state, sim.config.job, "n1", "")
    assert (run.action, run.restart_count, run.max_restarts, run.job_name) == (Action.RUN, 1, 1, "test")


def test_the_failure_past_max_restarts_fails_the_job_naming_the_last_failure():
    sim = cluster(max_restarts=1)
    crash(sim)
    events = crash(sim, rank=0, code=3, tail="ValueError: bad batch\n")
    assert [type(e) for e in events] == [GenerationEnded, JobFailed]
    failed = events[1]
    assert failed == JobFailed(2, EndReason.TRAINER_EXITED, "n1", 0, 3, "rank 0 exited with code 3",
                               "ValueError: bad batch\n", restarts=1, max_restarts=1)
    assert sim.state.failed == failed and sim.state.generation is None
    assert "job failed" in sim.waiting_reason
    assert directive_for(sim.state, sim.config.job, "n1", sim.waiting_reason).action is Action.STANDBY
    assert "after 1 restart(s)" in budget.describe(failed)
    assert sim.events(Tick(), at=NOW + 1) == []  # nothing starts again


def test_max_restarts_0_fails_at_the_first_failure_and_unlimited_never_fails():
    sim = cluster(max_restarts=0)
    assert [type(e) for e in crash(sim)] == [GenerationEnded, JobFailed]
    sim = cluster(max_restarts=None)
    for _ in range(5):
        assert isinstance(crash(sim)[-1], GenerationStarted)
    assert sim.state.failures == 5 and sim.state.failed is None


def test_a_lost_node_counts_against_the_budget_and_a_spare_takes_over_while_it_lasts():
    sim = cluster(max_restarts=1, nodes=1, spares=1)
    sim.events(StreamClosed("n1", 1, 1), at=NOW + 1)
    events = []
    for t in (1.1, 2.6, 3.5):  # suspected, dead (budget 1 of 1 used), then the spare grace is over
        events += sim.events(Heartbeat("s1", 1, 0), at=NOW + t - 0.05)
        events += sim.events(Tick(), at=NOW + t)
    assert not any(isinstance(e, JobFailed) for e in events)
    started = [e for e in events if isinstance(e, GenerationStarted)]
    assert started and started[0].members[0].node_id == "s1"
    assert sim.state.failures == 1


def test_operator_restarts_and_completion_are_not_failures():
    assert not budget.is_failure(EndReason.OPERATOR_RESTART)
    assert not budget.is_failure(EndReason.COMPLETED)
    assert not budget.is_failure(EndReason.ELASTIC_GROW)
    assert budget.is_failure(EndReason.NODE_LOST) and budget.is_failure(EndReason.HUNG)


def test_a_failed_job_survives_a_state_snapshot_and_shows_failed_in_status():
    from ftsup.supervisor import codec
    from ftsup.supervisor.core.views import JobPhase, status_view
    from ftsup.supervisor.ctl import render
    from ftsup.v1 import operator_pb2

    sim = cluster(max_restarts=0)
    crash(sim)
    restored = codec.state_from_proto(codec.state_to_proto(sim.state))
    assert restored.failed == sim.state.failed and restored.failures == 1
    view = status_view(restored, sim.soft, "test", 2)
    assert view.phase is JobPhase.FAILED and view.restarts == 0 and "RuntimeError: boom" in view.failure_tail
    response = operator_pb2.GetStatusResponse(job_name="test", phase=operator_pb2.JOB_PHASE_FAILED,
                                              failure=view.failure, failure_tail=view.failure_tail, max_restarts=0)
    text = render.status_text(response)
    assert "FAILED      job failed after 0 restart(s) (max_restarts=0): trainer_exited rank 1 on n1" in text
    assert "RuntimeError: boom" in text and "restarts    0 after failures (max 0)" in text
    import argparse

    from ftsup.supervisor.ctl.main import EXIT_JOB_FAILED, EXIT_OK, cmd_status

    class Stub:
        def __init__(self, reply: operator_pb2.GetStatusResponse) -> None:
            self.reply = reply

        def GetStatus(self, _request: object, timeout: float) -> operator_pb2.GetStatusResponse:
            return self.reply

    args = argparse.Namespace(json=True, timeout=1.0)
    assert cmd_status(Stub(response), args) == EXIT_JOB_FAILED  # type: ignore[arg-type]
    running = operator_pb2.GetStatusResponse(phase=operator_pb2.JOB_PHASE_RUNNING)
    assert cmd_status(Stub(running), args) == EXIT_OK  # type: ignore[arg-type]
