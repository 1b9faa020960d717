"""StepBurst: whether a shard's nodes are still reporting the newest step (how long a relay waits)."""

from __future__ import annotations

from ftsup.supervisor.shard_queue import UpQueue, forwarded
from ftsup.supervisor.step_burst import KEPT_STEPS, StepBurst
from ftsup.v1 import agent_pb2


def _reported(burst: StepBurst, step: int, sessions: range | list[int], generation: int = 1) -> None:
    for session in sessions:
        burst.note(session, generation, step)


def test_a_step_is_incomplete_while_fewer_nodes_reported_it_than_the_step_before():
    burst = StepBurst()
    _reported(burst, 4, range(3))
    assert not burst.incomplete, "a generation's first step heard: nothing to compare with"
    _reported(burst, 5, [0, 1])
    assert burst.incomplete
    _reported(burst, 5, [1])  # (a node's second message of the step counts once)
    assert burst.incomplete
    _reported(burst, 5, [2])
    assert not burst.incomplete
    _reported(burst, 4, [7])  # (a late report of an older step changes nothing about the newest)
    _reported(burst, 5, [3])  # (a node more than before: complete)
    assert not burst.incomplete


def test_steps_are_compared_within_a_generation_and_in_the_order_first_heard():
    burst = StepBurst()
    _reported(burst, 9, range(4), generation=1)
    _reported(burst, 1, [0], generation=2)
    assert not burst.incomplete, "a new generation's first step is not compared with the last one's"
    _reported(burst, 2, [0], generation=2)
    assert not burst.incomplete
    # A step number far ahead (a buggy agent) is the newest for one step only.
    _reported(burst, 10**9, [5], generation=2)
    assert burst.incomplete is False  # (1 reporter against step 2's 1)
    _reported(burst, 3, [0], generation=2)
    assert not burst.incomplete, "the next real step is newer than the bogus one"


def test_only_the_last_steps_are_kept():
    burst = StepBurst()
    for step in range(100):
        _reported(burst, step, range(3))
    assert len(burst._reporters) == KEPT_STEPS
    assert list(burst._reporters)[-1] == (1, 99)


def test_the_up_queue_notes_each_step_message_of_its_sessions():
    queue = UpQueue()

    def aggregate(session: int, step: int) -> None:
        queue.push(forwarded(session, f"n{session}", 1, agent_pb2.AgentMessage(
            step_aggregate=agent_pb2.StepAggregate(generation=1, step=step, ranks=[0]))))

    def per_rank(session: int, step: int) -> None:  # (an older agent's per-rank report)
        queue.push(forwarded(session, f"n{session}", 1, agent_pb2.AgentMessage(
            step_report=agent_pb2.StepReport(generation=1, step=step, rank=0))))

    aggregate(1, 7)
    per_rank(2, 7)
    queue.push(forwarded(3, "n3", 1, agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=1))))
    aggregate(1, 8)
    assert queue.steps.incomplete, "node 2 has not reported step 8 yet (the heartbeat's node never reported)"
    per_rank(2, 8)
    assert not queue.steps.incomplete
