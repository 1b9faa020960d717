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


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ranked(rank: int, step_no: int, generation: int = 1, digest: str = "d") -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(step_report=agent_pb2.StepReport(
        generation=generation, rank=rank, step=step_no, step_time_s=1.0, compute_time_s=0.5, loss=0.1,
        param_digest=digest))


async def test_a_nodes_step_reports_go_as_one_aggregate_once_every_rank_reported():
    clock = Clock()
    reports = Reports(clock=clock)
    reports.send(ranked(0, 7))
    held = agent_pb2.AgentMessage(snapshot_report=agent_pb2.SnapshotReport(generation=1, rank=0, step=7))
    reports.send(held)  # rank 0's snapshot of the step: the aggregate may overtake it
    reports.send(ranked(1, 7))
    message, items, hold_s = reports.take(expected_ranks=3)
    assert (message, items) == (None, []) and 0 < hold_s <= 0.02  # rank 2 may follow: wait for it
    reports.send(ranked(2, 7, digest="x"))
    message, items, hold_s = reports.take(expected_ranks=3)
    assert len(items) == 3 and hold_s == 0.0 and message is not None
    aggregate = message.step_aggregate
    assert (aggregate.generation, aggregate.step, list(aggregate.ranks)) == (1, 7, [0, 1, 2])
    assert sorted((g.digest, list(g.indexes)) for g in aggregate.param_digests) == [("d", [0, 1]), ("x", [2])]
    reports.done(items)
    assert reports.take(expected_ranks=3) == (held, [held], 0.0)  # then the snapshot report, once


async def test_a_missing_rank_delays_its_nodes_report_by_the_window_only_and_other_kinds_break_a_run():
    clock = Clock()
    reports = Reports(clock=clock)
    reports.send(ranked(0, 7))
    reports.send(ranked(0, 8))  # the same rank again: the next step, not this one's
    clock.now += 0.021
    message, items, _ = reports.take(expected_ranks=2)
    assert len(items) == 1 and message is not None and message.step_report.step == 7  # alone, once the window closed
    reports.done(items)
    reports.send(agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(rank=1)))
    reports.send(ranked(1, 8))
    clock.now += 0.021
    message, items, _ = reports.take(expected_ranks=2)
    assert len(items) == 1 and message is not None and message.step_report.rank == 0  # the exit sits between
    reports.done(items)
    message, _, _ = reports.take(expected_ranks=2)
    assert message is not None and message.WhichOneof("kind") == "trainer_exit"  # never held back


async def test_without_the_supervisors_word_nothing_is_folded():
    reports = Reports(clock=Clock())
    reports.send(ranked(0, 7))
    reports.send(ranked(1, 7))
    message, items, hold_s = reports.take(expected_ranks=0)  # an older supervisor: reports one by one
    assert message is not None and message.WhichOneof("kind") == "step_report" and len(items) == 1 and hold_s == 0.0


def holding(rank: int, step_no: int, generation: int = 1) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(snapshot_report=agent_pb2.SnapshotReport(
        generation=generation, rank=rank, step=step_no, holder_node_ids=["n0"], size_bytes=100 + rank,
        sha256=f"s{rank}"))


async def test_a_nodes_holdings_of_a_step_go_as_one_message_once_its_rank_count_is_queued():
    clock = Clock()
    reports = Reports(clock=clock)
    reports.send(holding(0, 7))
    reports.send(holding(5, 6))  # another step's holding: left for its own message
    reports.send(holding(1, 7))
    message, items, hold_s = reports.take(expected_ranks=2, expected_holdings=3)
    assert (message, items) == (None, []) and 0 < hold_s <= 0.05  # rank 2 may follow: wait for it
    reports.send(holding(2, 7))
    message, items, hold_s = reports.take(expected_ranks=2, expected_holdings=3)
    assert message is not None and len(items) == 3 and hold_s == 0.0
    holdings = message.snapshot_holdings
    assert (holdings.generation, holdings.step, list(holdings.ranks)) == (1, 7, [0, 1, 2])
    assert list(holdings.size_bytes) == [100, 101, 102] and list(holdings.sha256) == ["s0", "s1", "s2"]
    reports.done(items)
    clock.now += 0.051
    message, items, _ = reports.take(expected_ranks=2, expected_holdings=3)
    assert message is not None and message.WhichOneof("kind") == "snapshot_report" and len(items) == 1


async def test_holdings_wait_no_longer_than_the_window_and_not_at_all_for_what_queues_behind():
    clock = Clock()
    reports = Reports(clock=clock)
    reports.send(holding(0, 7))
    reports.send(holding(1, 7))
    clock.now += 0.049
    assert reports.take(expected_ranks=2, expected_holdings=8)[0] is None
    clock.now += 0.002
    message, items, _ = reports.take(expected_ranks=2, expected_holdings=8)
    assert message is not None and list(message.snapshot_holdings.ranks) == [0, 1]  # the window closed
    reports.done(items)
    reports.send(holding(2, 8))
    exit_ = agent_pb2.AgentMessage(trainer_exit=agent_pb2.TrainerExit(rank=1))
    reports.send(exit_)
    reports.send(holding(3, 8))
    message, items, hold_s = reports.take(expected_ranks=2, expected_holdings=8)
    assert message is not None and message.snapshot_report.rank == 2 and hold_s == 0.0  # the exit waits for nothing
    reports.done(items)
    assert reports.take(expected_ranks=2, expected_holdings=8) == (exit_, [exit_], 0.0)  # order kept


async def test_without_the_supervisors_word_holdings_go_one_by_one():
    reports = Reports(clock=Clock())
    reports.send(holding(0, 7))
    reports.send(holding(1, 7))
    message, items, hold_s = reports.take(expected_ranks=2, expected_holdings=0)  # an older supervisor
    assert message is not None and message.WhichOneof("kind") == "snapshot_report" and len(items) == 1
    assert hold_s == 0.0


async def test_step_reports_go_by_holdings_that_wait_and_do_not_cut_them_short():
    clock = Clock()
    reports = Reports(clock=clock)
    reports.send(holding(0, 7))
    reports.send(ranked(0, 8))  # the next step's reports, while rank 1's holding is on its way
    reports.send(ranked(1, 8))
    message, items, hold_s = reports.take(expected_ranks=2, expected_holdings=2)
    assert message is not None and message.WhichOneof("kind") == "step_aggregate" and hold_s == 0.0
    reports.done(items)
    reports.send(ranked(0, 9))
    message, items, hold_s = reports.take(expected_ranks=2, expected_holdings=2)
    assert message is None and 0 < hold_s <= 0.02  # both wait: the sooner deadline is the step's
    reports.send(holding(1, 7))
    message, items, _ = reports.take(expected_ranks=2, expected_holdings=2)
    assert message is not None and list(message.snapshot_holdings.ranks) == [0, 1]
    reports.done(items)
    message, items, _ = reports.take(expected_ranks=0, expected_holdings=2)
    assert message is not None and message.step_report.step == 9
