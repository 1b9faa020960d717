"""supervisorctl top's frame: node states, grouping by failure domain, step rate, sizing."""

from __future__ import annotations

import re

from ftsup.supervisor.ctl import top_view
from ftsup.supervisor.ctl.main import main
from ftsup.v1 import events_pb2, operator_pb2, state_pb2

NOW = 1_700_000_000.0
ALIVE, SUSPECT, DEAD = state_pb2.LIVENESS_ALIVE, state_pb2.LIVENESS_SUSPECT, state_pb2.LIVENESS_DEAD
ACTIVE, SPARE = events_pb2.NODE_ROLE_ACTIVE, events_pb2.NODE_ROLE_SPARE


def node(node_id: str, domain: str = "", liveness: int = ALIVE, ranks: tuple[int, ...] = (0,), **kw) -> operator_pb2.NodeInfo:
    return operator_pb2.NodeInfo(node_id=node_id, failure_domain=domain, liveness=liveness, ranks=ranks,
                                 role=kw.pop("role", ACTIVE), **kw)


def status(**kw) -> operator_pb2.GetStatusResponse:
    base = dict(job_name="llm", phase=operator_pb2.JOB_PHASE_RUNNING, generation=3, step=1200, world_size=4,
                loss=0.25, head_seq=40, leader_address="10.0.0.1:7070", ettr=0.97)
    return operator_pb2.GetStatusResponse(**{**base, **kw})


def dead_record(seq: int, node_id: str) -> events_pb2.Record:
    event = events_pb2.Event(node_declared_dead=events_pb2.NodeDeclaredDead(node_id=node_id))
    return events_pb2.Record(seq=seq, term=1, time_unix_s=NOW - 5, event=event)


def snap(seq: int, t: float, generation: int, step: int) -> events_pb2.Record:
    event = events_pb2.Event(snapshot_committed=events_pb2.SnapshotCommitted(generation=generation, step=step))
    return events_pb2.Record(seq=seq, term=1, time_unix_s=t, event=event)


FLEET = [
    node("a1", "rack-a"), node("a2", "rack-a", liveness=DEAD, ranks=()),
    node("b1", "rack-b", ranks=(), role=SPARE), node("b2", "rack-b", liveness=SUSPECT),
    node("b3", "rack-b", ranks=(), quarantined=True), node("c1", "rack-c", ranks=(), drained=True),
]


def test_each_node_gets_the_most_urgent_state_and_the_fleet_groups_by_failure_domain() -> None:
    data = top_view.frame(status(), FLEET, [dead_record(39, "a2")], 2.0, NOW)
    assert data["counts"] == {"active": 1, "spare": 1, "suspect": 1, "dead": 1, "quarantined": 1, "drained": 1}
    assert [(g["domain"], [s for _, s in g["nodes"]]) for g in data["groups"]] == [
        ("rack-a", ["active", "dead"]), ("rack-b", ["spare", "suspect", "quarantined"]), ("rack-c", ["drained"])]
    assert data["events"][-1]["kind"] == "node_declared_dead" and data["events"][-1]["node_id"] == "a2"


def test_before_any_generation_an_active_role_node_counts_active_and_a_spare_spare() -> None:
    data = top_view.frame(status(), [node("n1", ranks=()), node("n2", ranks=(), role=SPARE)], [], None, NOW)
    assert data["counts"]["active"] == 1 and data["counts"]["spare"] == 1


def test_the_frame_shows_rate_loss_ettr_the_grid_and_the_last_event_within_the_width() -> None:
    text = top_view.lines(top_view.frame(status(), FLEET, [dead_record(39, "a2")], 2.5, NOW), 100, 30)
    joined = "\n".join(text)
    assert "2.50 steps/s" in joined and "loss 0.2500" in joined and "ETTR 97.0%" in joined
    assert "rack-a #X" in joined and "rack-b .?Q" in joined and "rack-c D" in joined
    assert "node_declared_dead node_id=a2" in text[-1]
    assert all(len(line) <= 100 for line in text) and len(text) <= 30


def test_a_narrow_short_terminal_wraps_the_header_and_folds_many_nodes_into_a_cell() -> None:
    fleet = [node(f"n{i:05d}", f"rack-{i // 500}", liveness=DEAD if i == 7 else ALIVE) for i in range(5000)]
    data = top_view.frame(status(), fleet, [dead_record(39, "n00007")], None, NOW)
    text = top_view.lines(data, 40, 24)
    assert len(text) <= 24 and all(len(line) <= 40 for line in text)
    assert any(line.startswith("1 cell = 16 nodes") for line in text)  # 10 racks of 500 nodes: a row each
    assert any("X" in line for line in text if line.startswith("rack-0"))  # the dead node survives folding
    assert "node_declared_dead" in text[-1]


def test_colour_escapes_change_only_where_the_state_does() -> None:
    rows, _ = top_view.grid_rows([{"domain": "", "nodes": [["x", "active"]] * 50 + [["y", "dead"]]}], 80, 5)
    drawn = top_view._cells(rows[0].cells, colour=True)
    assert drawn.count("\x1b[") == 3 and re.sub(r"\x1b\[[0-9;]*m", "", drawn) == "#" * 50 + "X"


def test_step_rate_uses_live_samples_and_falls_back_to_snapshot_commits() -> None:
    rate = top_view.StepRate()
    seeds = top_view.snapshot_samples([snap(1, NOW - 20, 3, 100), snap(2, NOW - 10, 3, 150), snap(3, NOW, 3, 200)])
    assert rate.rate(seeds) == 5.0  # (200 - 100) / 20 s from the commits
    rate.add(top_view.Sample(NOW, 3, 200))
    rate.add(top_view.Sample(NOW + 2, 3, 206))
    assert rate.rate(seeds) == 3.0
    rate.add(top_view.Sample(NOW + 3, 4, 10))  # a new generation: its own samples only, too few yet
    assert rate.rate([]) is None


def test_top_json_needs_once(capsys) -> None:
    assert main(["--address", "127.0.0.1:1", "top", "--json"]) == 2
    assert "add --once" in capsys.readouterr().err
