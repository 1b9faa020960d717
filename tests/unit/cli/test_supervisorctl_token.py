"""supervisorctl's channel carries the bearer token on unary and streaming calls, beside whatever
metadata the caller gave, and keeps the call's deadline (the interceptor rebuilds the details)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from ftsup.supervisor.ctl import auth
from ftsup.v1 import events_pb2, operator_pb2, operator_pb2_grpc

TOKEN = "admin-token-0123456789"


class Recorder(operator_pb2_grpc.OperatorServicer):
    """Keeps each call's metadata and remaining time."""

    def __init__(self) -> None:
        self.metadata: dict[str, dict[str, str | bytes]] = {}
        self.remaining_s: dict[str, float | None] = {}

    def _record(self, method: str, context: grpc.ServicerContext) -> None:
        self.metadata[method] = dict(context.invocation_metadata())
        self.remaining_s[method] = context.time_remaining()

    def GetLeader(self, request: operator_pb2.GetLeaderRequest,
                  context: grpc.ServicerContext) -> operator_pb2.GetLeaderResponse:
        self._record("GetLeader", context)
        return operator_pb2.GetLeaderResponse(is_leader=True)

    def ListEvents(self, request: operator_pb2.ListEventsRequest,
                   context: grpc.ServicerContext) -> Iterator[events_pb2.Record]:
        self._record("ListEvents", context)
        yield events_pb2.Record(seq=1)


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, str]]:
    servicer = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    operator_pb2_grpc.add_OperatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_the_token_rides_unary_and_streaming_calls_beside_the_callers_metadata(
        recorder: tuple[Recorder, str]) -> None:
    servicer, address = recorder
    with auth.channel(address, auth.Credentials(TOKEN, None)) as channel:
        stub = operator_pb2_grpc.OperatorStub(channel)
        stub.GetLeader(operator_pb2.GetLeaderRequest(), timeout=30.0, metadata=(("x-caller", "ctl"),))
        records = list(stub.ListEvents(operator_pb2.ListEventsRequest(), timeout=30.0))
    assert [r.seq for r in records] == [1]
    for method in ("GetLeader", "ListEvents"):
        assert servicer.metadata[method]["authorization"] == f"Bearer {TOKEN}", method
        remaining_s = servicer.remaining_s[method]
        assert remaining_s is not None and 0 < remaining_s < 60.0, method  # the deadline went along
    assert servicer.metadata["GetLeader"]["x-caller"] == "ctl"


def test_without_a_token_no_authorization_header_is_sent(recorder: tuple[Recorder, str]) -> None:
    servicer, address = recorder
    with auth.channel(address, auth.Credentials(None, None)) as channel:
        operator_pb2_grpc.OperatorStub(channel).GetLeader(operator_pb2.GetLeaderRequest(), timeout=30.0)
    assert "authorization" not in servicer.metadata["GetLeader"]
