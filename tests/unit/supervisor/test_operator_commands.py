"""Job-wide operator commands and the experiment record, through the pure core."""

from __future__ import annotations

import pytest

from ftsup.supervisor.core.config import CoreConfig, JobSpec
from ftsup.supervisor.core.events import (
    EndReason,
    GenerationEnded,
    GenerationStarted,
    OperatorCommand,
    RestoreKind,
)
from ftsup.supervisor.core.inputs import OperatorRequest, TrainerHung
from tests.support.builders import NOW, Sim, config, hello
from tests.unit.supervisor.test_decide import alive, running_cluster, step


def test_an_operator_restart_ends_the_generation_and_the_next_restores_the_newest_snapshot():
    sim = running_cluster(spares=0)
    step(sim, 1, 1)
    step(sim, 1, 2)
    events = sim.events(OperatorRequest("restart", "", "suspect loss spike", "alice"))
    assert [type(e) for e in events] == [OperatorCommand, GenerationEnded, GenerationStarted]
    command, ended, started = events
    assert command.command == "restart" and command.args == () and command.operator == "alice"
    assert ended.reason is EndReason.OPERATOR_RESTART and ended.node_id == "" and ended.last_step == 2
    assert ended.detail == "restart by alice: suspect loss spike"
    assert started.generation == 2 and started.restore_step == 2
    assert {r.kind for r in started.restores} == {RestoreKind.LOCAL_SNAPSHOT}
    assert "operator_restart" in started.reason


def test_restart_is_refused_with_a_reason_when_it_cannot_apply():
    sim = Sim(config(nodes=3))
    sim.events(hello("n1", stream_id=1))  # 1 of 3 nodes: no generation yet
    assert "no generation is in force" in sim.feed(OperatorRequest("restart", "", "why not", "bob"))
    sim = running_cluster()
    assert "reason is required" in sim.feed(OperatorRequest("restart", "", "  ", "bob"))
    assert "whole job, not to node 'n1'" in sim.feed(OperatorRequest("restart", "n1", "x", "bob"))


def test_every_generation_records_the_config_hash_and_the_code_and_data_versions():
    spec = JobSpec(name="exp", nodes=1, ranks_per_node=1, argv=("train",), code_version="git:abc123",
                   data_version="c4@2024-05")
    sim = Sim(CoreConfig(job=spec))
    started = [e for e in sim.events(hello("n1", stream_id=1)) if isinstance(e, GenerationStarted)]
    assert len(started) == 1
    assert started[0].code_version == "git:abc123" and started[0].data_version == "c4@2024-05"
    assert started[0].config_hash == spec.config_hash and len(spec.config_hash) == 64


def test_the_config_hash_identifies_the_configuration_not_the_versions():
    base = JobSpec(name="exp", nodes=2, ranks_per_node=1, argv=("train", "--lr", "1e-3"), env=(("A", "1"),))
    same = JobSpec(name="exp", nodes=2, ranks_per_node=1, argv=("train", "--lr", "1e-3"), env=(("A", "1"),),
                   code_version="v2")
    other = JobSpec(name="exp", nodes=2, ranks_per_node=1, argv=("train", "--lr", "3e-3"), env=(("A", "1"),))
    assert base.config_hash == same.config_hash != other.config_hash


@pytest.mark.parametrize("key", ["code_version", "data_version"])
def test_unprintable_or_huge_versions_are_rejected_naming_the_key(key):
    with pytest.raises(ValueError, match=key):
        JobSpec(name="exp", nodes=1, ranks_per_node=1, argv=("t",), **{key: "a\nb"})
    with pytest.raises(ValueError, match=key):
        JobSpec(name="exp", nodes=1, ranks_per_node=1, argv=("t",), **{key: "x" * 257})


def test_a_generation_ended_by_a_hang_or_a_death_records_how_long_the_culprit_was_silent():
    sim = running_cluster(spares=0)
    step(sim, 1, 3)
    alive(sim, NOW + 5.0)
    hung = sim.events(TrainerHung("n2", 1, 2, 3, 120.0, 60.0), at=NOW + 5.0)
    assert isinstance(hung[0], GenerationEnded) and hung[0].silent_for_s == 120.0
    from ftsup.supervisor.core.events import NodeDeclaredDead
    from ftsup.supervisor.core.inputs import StreamClosed, Tick

    sim = running_cluster()
    step(sim, 1, 1)
    alive(sim, NOW + 5.0)
    sim.events(StreamClosed("n3", 1, 3), at=NOW + 5.0)
    sim.events(Tick(), at=NOW + 5.1)
    alive(sim, NOW + 6.0)
    dead, lost = sim.events(Tick(), at=NOW + 6.1)[:2]
    assert isinstance(dead, NodeDeclaredDead) and isinstance(lost, GenerationEnded)
    assert lost.silent_for_s == dead.silent_for_s == pytest.approx(1.1)


def test_an_operator_command_is_a_kind_not_text_and_an_unknown_one_fails_at_the_edge():
    from ftsup.supervisor.core.inputs import OperatorCommandKind, OperatorRequest

    assert OperatorRequest("drain", "n1", "why", "op").command is OperatorCommandKind.DRAIN
    with pytest.raises(ValueError, match="'defenestrate' is not a valid OperatorCommandKind"):
        OperatorRequest("defenestrate", "n1", "why", "op")  # type: ignore[arg-type]
