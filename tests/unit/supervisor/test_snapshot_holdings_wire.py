"""SnapshotHoldings on the wire: packed arrays decode to the very SnapshotReports they were made
from, held by the stream's node whatever the reports named; a malformed or foreign one is refused
with the reason, over a real gRPC stream too, and a step held through them commits."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.common import holdings_pack
from ftsup.supervisor.core.inputs import SnapshotHoldings
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server import snapshot_holdings
from ftsup.supervisor.server.agent_service import to_input
from ftsup.v1 import agent_pb2, events_pb2
from tests.support.builders import config
from tests.support.served import served
from tests.unit.supervisor.test_step_aggregate_wire import until


def _report(rank: int, size: int = 10, sha: str = "", step: int = 17) -> agent_pb2.SnapshotReport:
    return agent_pb2.SnapshotReport(generation=3, rank=rank, step=step, holder_node_ids=["n1"], size_bytes=size,
                                    sha256=sha)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.sampled_from(["", "ab" * 32, "cd" * 32])),
                min_size=1, max_size=16))
def test_holdings_decode_to_the_reports_they_were_made_from(rows):
    reports = [_report(rank, size, sha) for rank, (size, sha) in enumerate(rows)]
    wire = agent_pb2.AgentMessage(snapshot_holdings=holdings_pack.pack(reports))
    decoded = to_input("n1", 1, agent_pb2.AgentMessage.FromString(wire.SerializeToString()))
    assert isinstance(decoded, SnapshotHoldings)
    assert (decoded.node_id, decoded.generation, decoded.step) == ("n1", 3, 17)
    one_by_one = [to_input("n1", 1, agent_pb2.AgentMessage(snapshot_report=r)) for r in reports]
    assert list(decoded.reports()) == one_by_one


def test_the_holder_is_the_streams_node_not_what_the_reports_named():
    spoofed = agent_pb2.SnapshotReport(generation=3, rank=0, step=1, holder_node_ids=["n9"], size_bytes=1)
    decoded = snapshot_holdings.to_input("n1", holdings_pack.pack([spoofed]))
    first = decoded.reports()[0]
    assert first.node_id == "n1" and first.holder_node_ids == ("n1",)


def test_packing_refuses_reports_of_several_steps_or_a_rank_twice():
    with pytest.raises(ValueError, match="one generation's step"):
        holdings_pack.pack([_report(0), _report(1, step=18)])
    with pytest.raises(ValueError, match="each rank once"):
        holdings_pack.pack([_report(0), _report(0)])
    with pytest.raises(ValueError, match="at least one"):
        holdings_pack.pack([])


@pytest.mark.parametrize("damage, says", [
    (lambda m: m.size_bytes.pop(), "size_bytes has 1 values for 2 ranks"),
    (lambda m: m.sha256.append("x"), "sha256 has 3 values for 2 ranks"),
    (lambda m: m.ClearField("ranks"), "snapshot holdings with no ranks"),
])
def test_malformed_holdings_say_what_is_wrong(damage, says):
    message = holdings_pack.pack([_report(4), _report(5)])
    damage(message)
    with pytest.raises(snapshot_holdings.MalformedHoldings, match=says):
        snapshot_holdings.to_input("n1", message)


def test_holdings_past_the_limit_are_refused_before_they_are_unpacked(monkeypatch):
    monkeypatch.setattr(snapshot_holdings, "MAX_RANKS_PER_NODE_REPORT", 2)
    with pytest.raises(snapshot_holdings.MalformedHoldings, match="of 3 ranks \\(at most 2\\)"):
        snapshot_holdings.to_input("n1", holdings_pack.pack([_report(0), _report(1), _report(2)]))


async def _refusal(call: grpc.aio.StreamStreamCall) -> agent_pb2.Refusal:
    while True:
        answer = await asyncio.wait_for(call.read(), 5.0)
        if answer.WhichOneof("kind") == "refusal":
            return answer.refusal


async def test_a_node_reports_its_holdings_in_one_message_over_grpc_and_the_step_commits():
    runtime = Runtime(config(nodes=1, ranks_per_node=4), MemoryLog(), tick_s=0.05)
    async with served(runtime) as stub:
        call = stub.Connect()
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(
            node_id="n1", incarnation=1, host="127.0.0.1", peer_port=9000, role=events_pb2.NODE_ROLE_ACTIVE)))
        welcome = await asyncio.wait_for(call.read(), 5.0)
        assert welcome.welcome.takes_snapshot_holdings, "the agent is told it may fold its holdings"
        await until(lambda: runtime.state.generation is not None, "the generation to start")
        generation = runtime.state.generation
        assert generation is not None
        for rank in range(4):
            await call.write(agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(
                generation=generation.number, rank=rank, step=1, step_time_s=1.0, compute_time_s=0.5,
                param_digest="same")))
        held = [agent_pb2.SnapshotReport(generation=generation.number, rank=rank, step=1, size_bytes=10,
                                         sha256=f"s{rank}") for rank in range(4)]

        foreign = holdings_pack.pack([*held[:3], agent_pb2.SnapshotReport(generation=generation.number, rank=9,
                                                                          step=1, size_bytes=10)])
        await call.write(agent_pb2.AgentMessage(snapshot_holdings=foreign))
        refusal = await _refusal(call)
        assert refusal.refused == "SnapshotHoldings" and "rank 9: node 'n1' is neither" in refusal.reason
        broken = holdings_pack.pack(held)
        broken.sha256.pop()
        await call.write(agent_pb2.AgentMessage(snapshot_holdings=broken))
        refusal = await _refusal(call)
        assert refusal.refused == "snapshot_holdings" and "sha256 has 3 values for 4 ranks" in refusal.reason
        assert runtime.state.snapshot is None, "nothing of the refused ones was held"

        await call.write(agent_pb2.AgentMessage(snapshot_holdings=holdings_pack.pack(held)))
        await until(lambda: runtime.state.snapshot is not None, "step 1 to commit")
        assert runtime.state.snapshot is not None and runtime.state.snapshot.step == 1
        call.cancel()
