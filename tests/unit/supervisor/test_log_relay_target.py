"""Which node and rank `supervisorctl logs` reaches, from the rank map of the generation in force."""

from __future__ import annotations

import grpc
import pytest

from ftsup.supervisor.server.log_relay import RelayRefused, target_of
from ftsup.v1 import operator_pb2
from tests.support.builders import Sim, config, hello


def running_sim(ranks_per_node: int = 1) -> Sim:
    sim = Sim(config(nodes=2, ranks_per_node=ranks_per_node))
    sim.events(hello("n1"))
    sim.events(hello("n2"))
    assert sim.state.generation is not None
    return sim


def refusal(sim: Sim, **fields: object) -> RelayRefused:
    with pytest.raises(RelayRefused) as caught:
        target_of(sim.state, operator_pb2.StreamLogsRequest(**fields))
    return caught.value


def test_a_rank_alone_is_found_on_the_node_running_it_now() -> None:
    sim = running_sim()
    assert target_of(sim.state, operator_pb2.StreamLogsRequest(rank=1)) == ("n2", 1, 1)
    assert target_of(sim.state, operator_pb2.StreamLogsRequest(node_id="n1")) == ("n1", 0, 1)


def test_wrong_or_missing_names_are_refused_with_what_to_say_instead() -> None:
    sim = running_sim(ranks_per_node=2)
    assert refusal(sim).code == grpc.StatusCode.INVALID_ARGUMENT
    assert refusal(sim, rank=9).code == grpc.StatusCode.NOT_FOUND
    assert refusal(sim, node_id="ghost", rank=0).code == grpc.StatusCode.NOT_FOUND
    several = refusal(sim, node_id="n2")
    assert several.code == grpc.StatusCode.INVALID_ARGUMENT and "[2, 3]" in str(several)
    older = refusal(sim, rank=0, generation=7)
    assert older.code == grpc.StatusCode.FAILED_PRECONDITION and "--node" in str(older)


def test_an_older_generation_is_reached_through_the_node_named() -> None:
    sim = running_sim()
    assert target_of(sim.state, operator_pb2.StreamLogsRequest(node_id="n2", rank=1, generation=7)) == ("n2", 1, 7)
