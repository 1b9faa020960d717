"""The chaos harness's judgement of an event log: figures and invariants from hand-built logs."""

from __future__ import annotations

import socket

import pytest

from ftsup.harness.chaos import checks
from ftsup.harness.chaos.main import chosen
from ftsup.harness.chaos.proxy import PartitionProxy
from ftsup.harness.chaos.scenario import Scenario
from ftsup.harness.chaos.scenarios import SCENARIOS
from ftsup.v1 import events_pb2

BREAK = 100.0


def rec(seq: int, t: float, **event: object) -> events_pb2.Record:
    return events_pb2.Record(seq=seq, term=1, time_unix_s=t, event=events_pb2.Event(**event))


def started(generation: int, restore_step: int | None = None) -> dict:
    body = events_pb2.GenerationStarted(generation=generation)
    if restore_step is not None:
        body.restore_step = restore_step
    return {"generation_started": body}


def node_loss_log() -> list[events_pb2.Record]:
    """Generation 1 runs, a node dies at t=100 (step 6 reached), generation 2 restores step 5."""
    return [
        rec(1, 90.0, **started(1)),
        rec(2, 91.0, generation_running=events_pb2.GenerationRunning(generation=1, first_step=1)),
        rec(3, 99.0, snapshot_committed=events_pb2.SnapshotCommitted(generation=1, step=5)),
        rec(4, 101.5, node_declared_dead=events_pb2.NodeDeclaredDead(node_id="node-3")),
        rec(5, 101.5, generation_ended=events_pb2.GenerationEnded(generation=1, last_step=6)),
        rec(6, 101.5, **started(2, restore_step=5)),
        rec(7, 104.0, generation_running=events_pb2.GenerationRunning(generation=2, first_step=6)),
    ]


def test_detection_recovery_and_lost_steps_come_from_the_supervisors_timestamps() -> None:
    log = node_loss_log()
    assert checks.first_time(log, ("node_declared_dead",), BREAK) == pytest.approx(1.5)
    assert checks.recovered_s(log, BREAK) == pytest.approx(4.0)
    assert checks.lost_steps(log, BREAK, step_at_break=6) == 1
    # The harness saw a later step than the supervisor recorded: the later one counts.
    assert checks.lost_steps(log, BREAK, step_at_break=7) == 2


def test_a_fault_that_never_ended_the_generation_recovers_at_the_next_committed_step() -> None:
    log = node_loss_log()[:3] + [rec(4, 102.0, snapshot_committed=events_pb2.SnapshotCommitted(generation=1, step=6))]
    assert checks.recovered_s(log, BREAK) == pytest.approx(2.0)
    assert checks.lost_steps(log, BREAK, step_at_break=6) == 0
    assert checks.first_time(log, ("node_declared_dead",), BREAK) is None


def test_a_job_that_completed_without_a_restart_lost_nothing() -> None:
    log = node_loss_log()[:3] + [
        rec(4, 120.0, generation_ended=events_pb2.GenerationEnded(
            generation=1, last_step=30, reason=events_pb2.END_REASON_COMPLETED)),
    ]
    assert checks.lost_steps(log, BREAK, step_at_break=6) == 0
    assert checks.recovered_s(log, BREAK) is None  # no step committed after the fault


def test_a_generation_that_never_ran_is_not_where_recovery_is_measured() -> None:
    log = node_loss_log()[:6] + [
        rec(7, 102.0, generation_ended=events_pb2.GenerationEnded(generation=2, last_step=0)),
        rec(8, 102.0, **started(3)),  # fresh: the second loss took the last copies
        rec(9, 106.0, generation_running=events_pb2.GenerationRunning(generation=3, first_step=1)),
    ]
    assert checks.recovered_s(log, BREAK) == pytest.approx(6.0)
    assert checks.lost_steps(log, BREAK, step_at_break=6) == 6


def test_a_lost_or_changed_acknowledged_record_is_counted_and_a_hole_reported() -> None:
    log = node_loss_log()
    acknowledged = log[:3]
    assert checks.events_lost(acknowledged, log) == 0 and checks.gap_problems(log) == []
    changed = [log[0], rec(2, 91.0, generation_running=events_pb2.GenerationRunning(generation=1, first_step=2)),
               *log[2:]]
    assert checks.events_lost(acknowledged, changed) == 1
    holed = [r for r in log if r.seq != 3]
    assert checks.events_lost(acknowledged, holed) == 1
    assert "missing seqs [3]" in checks.gap_problems(holed)[0]


def test_a_committed_checkpoint_that_vanished_or_is_half_written_counts_as_lost() -> None:
    start = rec(1, 1.0, checkpoint_started=events_pb2.CheckpointStarted(checkpoint_id="c1", shards=2))
    shard0 = rec(2, 2.0, checkpoint_shard_written=events_pb2.CheckpointShardWritten(checkpoint_id="c1", shard=0))
    shard1 = rec(3, 3.0, checkpoint_shard_written=events_pb2.CheckpointShardWritten(checkpoint_id="c1", shard=1))
    commit = rec(4, 4.0, checkpoint_committed=events_pb2.CheckpointCommitted(checkpoint_id="c1", step=5))
    whole = [start, shard0, shard1, commit]
    assert checks.checkpoints_lost(whole, whole) == 0
    assert checks.checkpoints_lost(whole, whole[:3]) == 1  # committed before, gone after
    assert checks.checkpoints_lost([], [start, shard0, commit]) == 1  # committed with a shard missing


def test_the_partition_proxy_forwards_black_holes_without_closing_and_heals() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    host, port = upstream.getsockname()
    with PartitionProxy(f"{host}:{port}") as proxy:
        proxy_host, proxy_port = proxy.address.rsplit(":", 1)
        client = socket.create_connection((proxy_host, int(proxy_port)))
        server, _ = upstream.accept()
        client.sendall(b"ping")
        server.settimeout(5)
        assert server.recv(16) == b"ping"
        proxy.partition()
        client.sendall(b"lost?")
        server.settimeout(0.5)
        with pytest.raises(socket.timeout):  # silence, not a reset: the bytes wait
            server.recv(16)
        proxy.heal()
        server.settimeout(5)
        assert server.recv(16) == b"lost?"
        server.sendall(b"pong")
        client.settimeout(5)
        assert client.recv(16) == b"pong"
        client.close()
        server.close()
    upstream.close()


def test_a_cut_closes_every_open_connection_and_new_ones_flow() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    host, port = upstream.getsockname()
    with PartitionProxy(f"{host}:{port}") as proxy:
        proxy_host, proxy_port = proxy.address.rsplit(":", 1)
        client = socket.create_connection((proxy_host, int(proxy_port)))
        server, _ = upstream.accept()
        proxy.cut()
        assert proxy.cuts == 1
        server.settimeout(5)
        client.settimeout(5)
        assert server.recv(16) == b""  # EOF on both ends: the stream is gone, not stalled
        assert client.recv(16) == b""
        again = socket.create_connection((proxy_host, int(proxy_port)))
        fresh, _ = upstream.accept()
        again.sendall(b"back")
        fresh.settimeout(5)
        assert fresh.recv(16) == b"back"
        for sock in (client, server, again, fresh):
            sock.close()
    upstream.close()


def test_scenario_names_are_unique_and_the_cli_rejects_an_unknown_one_by_name() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names))
    assert chosen(["all"]) == names
    assert chosen(["xid_48", "node_sigkill"]) == ["node_sigkill", "xid_48"]  # registry order
    assert "'nope'" in str(chosen(["nope"]))
    with pytest.raises(ValueError, match="need etcd"):
        Scenario("x", "", lambda c: None, lambda o: [], (), supervisors=3)  # type: ignore[arg-type, return-value]
