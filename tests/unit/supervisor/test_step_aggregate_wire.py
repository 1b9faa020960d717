"""StepAggregate on the wire: packed arrays and grouped digests decode to the very reports they
were made from; a malformed one is refused with the reason, over a real gRPC stream too."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.core.inputs import StepAggregate, StepReport
from ftsup.supervisor.eventlog.memory import MemoryLog
from ftsup.supervisor.runtime import Runtime
from ftsup.supervisor.server import step_aggregate
from ftsup.v1 import agent_pb2, events_pb2
from tests.support.builders import config
from tests.support.served import served


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 5.0) -> None:
    """Waits on the loop (the servers run on it) for `predicate`, failing at the deadline."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(0.01)


rank_reports = st.lists(
    st.tuples(
        st.floats(0.0, 10.0), st.floats(0.0, 10.0), st.floats(allow_nan=True, allow_infinity=False),
        st.one_of(st.just(math.nan), st.floats(0.0, 100.0)), st.integers(0, 1 << 40),
        st.sampled_from(["a", "b", "c"]), st.sampled_from(["", "g1", "g2"]), st.one_of(st.none(), st.integers(0, 3)),
    ),
    min_size=1, max_size=12,
)


def _same(a: StepReport, b: StepReport) -> bool:
    # NaN != NaN: compared as "both not reported" instead.
    def norm(r: StepReport) -> tuple[object, ...]:
        return tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in (
            r.node_id, r.generation, r.rank, r.step, r.step_time_s, r.compute_time_s, r.loss, r.param_digest,
            r.grad_norm, r.tokens, r.local_grad_digest, r.replica_group))
    return norm(a) == norm(b)


@settings(max_examples=200, deadline=None)
@given(rank_reports)
def test_an_aggregate_decodes_to_the_reports_it_was_made_from(rows):
    reports = [StepReport("n1", 3, rank, 17, st_, ct, loss, digest, gn, tokens, grad, group)
               for rank, (st_, ct, loss, gn, tokens, digest, grad, group) in enumerate(rows)]
    message = agent_pb2.StepAggregate.FromString(step_aggregate.to_proto(reports).SerializeToString())
    decoded = step_aggregate.to_input("n1", message)
    assert decoded.generation == 3 and decoded.step == 17 and len(decoded.reports()) == len(reports)
    assert all(_same(a, b) for a, b in zip(decoded.reports(), reports))
    assert len(message.param_digests) == len({r.param_digest for r in reports}), "each digest sent once"


@pytest.mark.parametrize("damage, says", [
    (lambda m: m.compute_time_s.pop(), "compute_time_s has 1 values for 2 ranks"),
    (lambda m: m.param_digests[0].indexes.append(9), "index 9 is past the 2 ranks"),
    (lambda m: m.param_digests.add(digest="z", indexes=[0]), "position 0 is in two groups"),
    (lambda m: m.ClearField("param_digests"), "rank 4 is in no param_digests group"),
    (lambda m: m.tokens.append(5), "tokens has 1 values for 2 ranks (or none)"),
])
def test_a_malformed_aggregate_says_what_is_wrong(damage, says):
    message = step_aggregate.to_proto([StepReport("n1", 1, 4, 2, 1.0, 0.5, 0.1, "d"),
                                       StepReport("n1", 1, 5, 2, 1.0, 0.5, 0.1, "d")])
    message.ClearField("tokens")
    damage(message)
    with pytest.raises(step_aggregate.MalformedAggregate, match=says.replace("(", r"\(").replace(")", r"\)")):
        step_aggregate.to_input("n1", message)


async def test_a_node_reports_its_ranks_step_in_one_message_over_grpc():
    runtime = Runtime(config(nodes=1, ranks_per_node=4), MemoryLog(), tick_s=0.05)
    async with served(runtime) as stub:
        call = stub.Connect()
        await call.write(agent_pb2.AgentMessage(hello=agent_pb2.Hello(
            node_id="n1", incarnation=1, host="127.0.0.1", peer_port=9000, role=events_pb2.NODE_ROLE_ACTIVE)))
        await until(lambda: runtime.state.generation is not None, "the generation to start")
        generation = runtime.state.generation
        assert generation is not None
        reports = [StepReport("n1", generation.number, rank, 1, 1.0, 0.5, 2.0, "same") for rank in range(4)]
        await call.write(agent_pb2.AgentMessage(step_aggregate=step_aggregate.to_proto(reports)))
        await until(lambda: runtime.soft.progress is not None and runtime.soft.progress.step_reports == 4,
                    "the four ranks' reports to be observed")
        assert runtime.state.generation is not None and runtime.state.generation.is_running
        assert 1 in runtime.soft.progress.sdc_clear_steps, "all four digests were voted on: they agree"

        broken = step_aggregate.to_proto(reports[:2])
        broken.loss.pop()
        await call.write(agent_pb2.AgentMessage(step_aggregate=broken))
        while True:
            answer = await asyncio.wait_for(call.read(), 5.0)
            if answer.WhichOneof("kind") == "refusal":
                break
        assert answer.refusal.refused == "step_aggregate"
        assert "loss has 1 values for 2 ranks" in answer.refusal.reason
        assert runtime.soft.progress.step_reports == 4, "nothing of the malformed one was observed"
        call.cancel()


def test_the_core_input_keeps_the_wire_order():
    message = step_aggregate.to_proto([StepReport("n1", 1, r, 2, 1.0, 0.5, 0.1, "d") for r in (3, 1, 2)])
    assert [r.rank for r in step_aggregate.to_input("n1", message).reports()] == [3, 1, 2]
    assert isinstance(step_aggregate.to_input("n1", message), StepAggregate)


def test_the_decoded_aggregates_arrays_are_read_only():
    # The core keeps views of an input's arrays (open steps): an input that could change after
    # admission would change what was admitted.
    reports = [StepReport("n1", 3, rank, 17, 1.0, 0.5, 2.0, "d", 1.0, 10, "g", rank) for rank in range(3)]
    decoded = step_aggregate.to_input("n1", step_aggregate.to_proto(reports))
    arrays = [decoded.ranks, decoded.step_time_s, decoded.compute_time_s, decoded.loss, decoded.grad_norm,
              decoded.tokens, decoded.replica_groups, *(g.positions for g in decoded.param_digests),
              *(g.positions for g in decoded.local_grad_digests)]
    for array in arrays:
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0
