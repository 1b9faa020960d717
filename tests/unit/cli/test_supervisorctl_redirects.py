"""supervisorctl sends its token only where it was told to: a replica's leader answer outside
--address is refused without TLS (under TLS the handshake proves a supervisor)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from ftsup.supervisor.ctl import auth
from ftsup.supervisor.ctl.main import UntrustedRedirect, pick_replica
from ftsup.v1 import operator_pb2, operator_pb2_grpc


class Follower(operator_pb2_grpc.OperatorServicer):
    def __init__(self, leader: str) -> None:
        self.leader = leader

    def GetLeader(self, request, context):  # type: ignore[no-untyped-def]
        return operator_pb2.GetLeaderResponse(is_leader=False, leader_address=self.leader)


@pytest.fixture
def follower() -> Iterator[tuple[Follower, str]]:
    servicer = Follower("")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    operator_pb2_grpc.add_OperatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_a_leader_outside_the_address_list_gets_no_token_without_tls(follower) -> None:  # type: ignore[no-untyped-def]
    servicer, address = follower
    servicer.leader = "203.0.113.9:7070"
    credentials = auth.Credentials("admin-token-0123456789", None)
    with pytest.raises(UntrustedRedirect, match="203.0.113.9:7070.*not in --address"):
        pick_replica([address, "127.0.0.1:1"], needs_leader=True, timeout_s=2.0, credentials=credentials)


def test_a_leader_in_the_address_list_is_followed(follower) -> None:  # type: ignore[no-untyped-def]
    servicer, address = follower
    servicer.leader = "127.0.0.1:1"
    credentials = auth.Credentials("admin-token-0123456789", None)
    assert pick_replica([address, "127.0.0.1:1"], needs_leader=True, timeout_s=2.0,
                        credentials=credentials) == "127.0.0.1:1"
