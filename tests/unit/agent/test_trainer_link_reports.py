"""The agent's side of a window of step reports (TrainerLink.ReportSteps): each report handled as
ReportStep would (forwarded to the supervisor in order, counted as progress), the answer that of
the newest step, and a report of a rank this node does not run refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
import structlog

from ftsup.agent.progress import ProgressTracker
from ftsup.agent.trainer_api import TrainerLinkService
from ftsup.v1 import agent_pb2, peer_pb2


class Aborted(Exception):
    pass


class Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class Sent(list):
    def send(self, message: agent_pb2.AgentMessage, sticky: bool = False) -> None:
        self.append(message)


def link(sent: Sent, progress: ProgressTracker) -> TrainerLinkService:
    run = SimpleNamespace(generation=4, ranks=[0, 1], checkpoint_steps=(5, 20))
    launcher = SimpleNamespace(run=run, mark_attached=lambda generation, rank: None)
    return TrainerLinkService("node-a", launcher, None, None, None, sent, structlog.get_logger("test"),  # type: ignore[arg-type]
                              progress=progress)


def report(step: int, rank: int = 1) -> agent_pb2.StepReport:
    return agent_pb2.StepReport(generation=4, rank=rank, step=step, step_time_s=0.03)


def test_a_window_of_reports_is_forwarded_in_order_and_answered_for_its_newest_step():
    sent, progress = Sent(), ProgressTracker(clock=lambda: 50.0)
    progress.start_generation(4, (0, 1))
    service = link(sent, progress)
    ack = asyncio.run(service.ReportSteps(peer_pb2.StepReports(reports=[report(s) for s in (4, 5, 6)]), Context()))
    assert [m.step_report.step for m in sent] == [4, 5, 6]
    assert list(ack.checkpoint_steps) == [20]  # step 5 is behind the newest report: not asked again
    assert progress.ranks[1].last_step == 6
    one = asyncio.run(service.ReportStep(report(4), Context()))
    assert list(one.checkpoint_steps) == [5, 20]  # ReportStep answers the same way for its one step


def test_a_window_with_a_rank_this_node_does_not_run_is_refused():
    sent = Sent()
    with pytest.raises(Aborted) as info:
        asyncio.run(link(sent, ProgressTracker()).ReportSteps(
            peer_pb2.StepReports(reports=[report(1), report(2, rank=7)]), Context()))
    assert info.value.args[0] == grpc.StatusCode.INVALID_ARGUMENT
