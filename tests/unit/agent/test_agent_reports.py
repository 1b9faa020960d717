"""The link's report queue: step reports go first when full; exits and finished ranks never go."""

from __future__ import annotations

from ftsup.agent.link import Reports
from ftsup.v1 import agent_pb2


def step(n: int) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(step=n))


async def test_full_queue_drops_oldest_step_reports_and_keeps_exits_and_finished_ranks():
    reports = Reports(capacity=3)
    reports.send(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(rank=1)))
    reports.send(step(1))
    reports.send(agent_pb2.AgentMessage(rank_finished=agent_pb2.RankFinished(rank=1)))
    reports.send(step(2))
    reports.send(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(rank=2)))
    kinds = []
    while reports.peek() is not None:
        message = reports.pop()
        kinds.append((message.WhichOneof("kind"), message.step_report.step))
    assert kinds == [("trainer_exit", 0), ("rank_finished", 0), ("trainer_exit", 0)]
    assert reports.dropped == 2


def finished(generation: int, rank: int, step_no: int) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(rank_finished=agent_pb2.RankFinished(generation=generation, rank=rank, step=step_no))


async def test_sticky_facts_outlive_their_send_until_a_newer_generation_and_repeat_once_each():
    reports = Reports()
    reports.send(finished(1, 0, 10), sticky=True)
    reports.send(finished(1, 1, 10), sticky=True)
    reports.send(step(11))
    reports.send(finished(1, 0, 12), sticky=True)  # the same rank again: the newer fact replaces it
    while reports.peek() is not None:
        reports.pop()  # written to a supervisor that may die before handling them
    again = reports.sticky()
    assert [(m.rank_finished.rank, m.rank_finished.step) for m in again] == [(1, 10), (0, 12)]
    reports.forget_sticky_before(2)
    assert reports.sticky() == []
