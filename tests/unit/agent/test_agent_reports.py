"""The link's report queue: step reports go first when full; exits and finished ranks never go."""

from __future__ import annotations

from ftsup.v1 import agent_pb2

from agent.link import Reports


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
