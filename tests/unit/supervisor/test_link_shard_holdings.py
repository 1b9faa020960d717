"""A link shard folds a session's queued SnapshotReports of one step into one SnapshotHoldings,
only for a leader that says it takes them: the leader then gets every holding once, in its node's
order, held by the session's node, as it would one by one."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from ftsup.supervisor.server import snapshot_holdings, step_aggregate
from ftsup.supervisor.shard_queue import UpQueue, fold_snapshot_reports, forwarded
from ftsup.v1 import agent_pb2, shard_pb2
from tests.unit.supervisor.test_link_shard import beat, report, xid


def held(rank: int, step: int = 5) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(snapshot_report=agent_pb2.SnapshotReport(
        generation=1, rank=rank, step=step, holder_node_ids=["x"], size_bytes=10 + rank, sha256=f"s{rank}"))


def expand(items: list[shard_pb2.Forwarded]) -> list[tuple[int, str, object]]:
    """Each item as the leader sees it: holdings and aggregates as their reports, one by one
    (the holder is the session's node; the reports' own `holder_node_ids`, which the core never
    reads, are left out)."""
    out: list[tuple[int, str, object]] = []
    for item in items:
        kind = item.message.WhichOneof("kind") if item.WhichOneof("kind") == "message" else "closed"
        if kind == "snapshot_holdings":
            out += [(item.session, "held", dataclasses.replace(h, holder_node_ids=())) for h in
                    snapshot_holdings.to_input(item.node_id, item.message.snapshot_holdings).reports()]
        elif kind == "snapshot_report":
            one = snapshot_holdings.report_from_proto(item.node_id, item.message.snapshot_report)
            out.append((item.session, "held", dataclasses.replace(one, holder_node_ids=())))
        elif kind == "step_aggregate":
            out += [(item.session, "step", (r.step, r.rank)) for r in step_aggregate.to_input(
                item.node_id, item.message.step_aggregate).reports()]
        elif kind == "step_report":
            out.append((item.session, "step", (item.message.step_report.step, item.message.step_report.rank)))
        elif kind != "heartbeat":
            out.append((item.session, kind or "", None))
    return out


def test_a_nodes_queued_holdings_of_one_step_go_up_as_one_message_only_to_a_leader_that_takes_them():
    sent = [forwarded(1, "a", 1, held(0)), forwarded(2, "b", 1, held(4)), forwarded(1, "a", 1, beat(1)),
            forwarded(1, "a", 1, held(1)), forwarded(1, "a", 1, held(1)), forwarded(1, "a", 1, held(2, step=6))]
    for takes in (False, True):
        queue = UpQueue()
        for item in sent:
            queue.push(item)
        items = queue.take(folds_holdings=takes)
        names = [(i.session, i.message.WhichOneof("kind")) for i in items]
        if not takes:
            assert names == [(1, "snapshot_report"), (2, "snapshot_report"), (1, "heartbeat"),
                             (1, "snapshot_report"), (1, "snapshot_report"), (1, "snapshot_report")]
            continue
        assert names == [(1, "snapshot_holdings"), (2, "snapshot_report"), (1, "heartbeat"),
                         (1, "snapshot_report"), (1, "snapshot_report")]  # rank 1 again; another step
        holdings = snapshot_holdings.to_input("a", items[0].message.snapshot_holdings)
        assert [(r.rank, r.node_id, r.sha256) for r in holdings.reports()] == [(0, "a", "s0"), (1, "a", "s1")]
        assert queue.holdings_folded == 1


messages = st.sampled_from(["hb", "xid", "closed", "r0", "r1", "h0", "h1", "h2", "h0s6", "h1s6"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), messages), max_size=40), st.integers(1, 50))
def test_folding_holdings_hands_the_leader_every_one_once_in_its_sessions_order(script, take):
    def item(session: int, name: str) -> shard_pb2.Forwarded:
        if name == "hb":
            return forwarded(session, f"n{session}", 1, beat(1))
        if name == "xid":
            return forwarded(session, f"n{session}", 1, xid(79))
        if name == "closed":
            return forwarded(session, f"n{session}", 1, moved=False)
        rank, _, step = name[1:].partition("s")
        make = held if name[0] == "h" else report
        return forwarded(session, f"n{session}", 1, make(int(rank), step=int(step or 5)))

    sent = [item(session, name) for session, name in script]
    queue = UpQueue()
    for each in sent:
        queue.push(each)
    received: list[shard_pb2.Forwarded] = []
    while len(queue):
        received += queue.take(take, folds_holdings=True)
    for session in (1, 2, 3):
        def of(items: list[shard_pb2.Forwarded], session: int = session) -> list[tuple[int, str, object]]:
            return [x for x in expand(items) if x[0] == session]
        assert of(received) == of(sent), "every holding, report and fact once, in its session's order"


def test_a_lone_holding_stays_as_it_is():
    items = [forwarded(1, "a", 1, held(0)), forwarded(1, "a", 1, xid(79)), forwarded(1, "a", 1, held(1))]
    assert fold_snapshot_reports(items) == items
