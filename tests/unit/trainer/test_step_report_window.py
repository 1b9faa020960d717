"""Step reports of a short window go to the agent in one call (trainer/reports.py `StepWindow`):
the first after a quiet window at once, the rest once the window has passed, oldest first; a
flush (a checkpoint shard, the finish) sends what waits without waiting out the window. Through a
Session: one call per window, ReportStep for one report alone, one by one to an agent that does
not know ReportSteps. The sending thread is real; the clock and the window's wait are the test's."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from ftsup.harness.cluster import wait_until
from ftsup.trainer.agent_client import AgentClient
from ftsup.trainer.launch import LaunchEnv
from ftsup.trainer.reports import DEFAULT_WINDOW_S, ReportQueue, StepWindow, window_from_mapping
from ftsup.trainer.session import Session
from ftsup.v1 import peer_pb2, peer_pb2_grpc

WAIT_S = 10.0
ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "FTSUP_GENERATION": "1",
       "FTSUP_NODE_ID": "node-a", "FTSUP_AGENT_ADDRESS": "unix:/nowhere", "FTSUP_RESTORE_STEP": ""}


class HeldWait:
    """The window's wait, held until the test releases it; records how long it was asked to wait."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.release = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.asked.append(round(seconds, 6))
        assert self.release.wait(WAIT_S)


def test_reports_within_the_window_of_the_last_send_go_together_once_it_has_passed():
    now = [100.0]
    sent: list[list[int]] = []
    wait = HeldWait()
    queue = ReportQueue()
    window = StepWindow(queue, sent.append, 0.25, clock=lambda: now[0], wait=wait)
    try:
        window.add(1)  # nothing sent yet: at once, alone
        wait_until(lambda: sent == [[1]], WAIT_S, "the first report", poll_s=0.001)
        now[0] = 100.05
        window.add(2)
        wait_until(lambda: wait.asked == [0.2], WAIT_S, "the sender to wait out the rest of the window",
                   poll_s=0.001)
        window.add(3)
        window.add(4)
        assert sent == [[1]]  # held for the window, not sent one call each
        now[0] = 100.25
        wait.release.set()
        wait_until(lambda: len(sent) == 2, WAIT_S, "the window's reports", poll_s=0.001)
        assert sent == [[1], [2, 3, 4]] and wait.asked == [0.2]
        now[0] = 101.0  # a quiet window later: at once again
        window.add(5)
        wait_until(lambda: len(sent) == 3, WAIT_S, "the report after a quiet window", poll_s=0.001)
        assert sent[-1] == [5] and wait.asked == [0.2]
    finally:
        wait.release.set()
        queue.close()


def test_a_flush_sends_the_waiting_reports_without_waiting_out_the_window():
    sent: list[list[int]] = []
    queue = ReportQueue()
    window = StepWindow(queue, sent.append, 60.0)  # the real wait: only the flush can cut it short
    try:
        window.add(1)
        wait_until(lambda: sent == [[1]], WAIT_S, "the first report", poll_s=0.001)
        window.add(2)
        window.add(3)
        started = time.monotonic()
        window.flush()
        assert sent == [[1], [2, 3]] and time.monotonic() - started < 30.0
        window.add(4)
        window.drop()  # a broken generation's reports: forgotten
        window.flush()
        assert sent == [[1], [2, 3]]
    finally:
        window.hurry.set()
        queue.close()


def test_the_window_comes_from_the_environment_and_bad_values_are_named():
    assert window_from_mapping({}) == DEFAULT_WINDOW_S
    assert window_from_mapping({"FTSUP_STEP_REPORT_WINDOW_S": "0"}) == 0.0
    for bad in ("soon", "-1", "nan", "11"):
        with pytest.raises(ValueError, match="FTSUP_STEP_REPORT_WINDOW_S"):
            window_from_mapping({"FTSUP_STEP_REPORT_WINDOW_S": bad})


class RecordingLink(peer_pb2_grpc.TrainerLinkServicer):
    """An agent's TrainerLink as far as step reports go; `batched` False: one older than ReportSteps."""

    def __init__(self, batched: bool) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.batched = batched

    def ReportStep(self, request, context):
        self.calls.append(("ReportStep", [request.step]))
        return peer_pb2.LinkAck()

    def ReportSteps(self, request, context):
        if not self.batched:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        self.calls.append(("ReportSteps", [r.step for r in request.reports]))
        return peer_pb2.LinkAck()

    def ReportFinished(self, request, context):
        self.calls.append(("ReportFinished", [request.step]))
        return peer_pb2.LinkAck()


@pytest.mark.parametrize("batched", [True, False], ids=["agent-knows-ReportSteps", "older-agent"])
def test_a_session_sends_a_windows_reports_in_one_call_or_one_by_one_to_an_older_agent(tmp_path, batched):
    link = RecordingLink(batched)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    peer_pb2_grpc.add_TrainerLinkServicer_to_server(link, server)
    address = f"unix:{tmp_path}/agent.sock"
    server.add_insecure_port(address)
    server.start()
    session = Session(LaunchEnv.from_mapping(ENV | {"FTSUP_AGENT_ADDRESS": address}), AgentClient(address),
                      report_window_s=60.0)
    try:
        for step in range(1, 9):
            session.report_step(step, 0.02, 0.01, 1.0, "d")
        session.finish(8, "d")  # flushes the window at once, then reports the finish
    finally:
        session.close()
        server.stop(grace=None)
    steps = [s for name, batch in link.calls if name != "ReportFinished" for s in batch]
    assert steps == list(range(1, 9)) and link.calls[-1] == ("ReportFinished", [8])
    names = [name for name, _ in link.calls[:-1]]
    if batched:  # the first at once (maybe with a few more), the rest of the window in one call
        assert len(names) <= 2 and "ReportSteps" in names
    else:
        assert names == ["ReportStep"] * 8
