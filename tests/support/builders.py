"""Builders for pure-core tests: a fixed NOW, small configs, inputs with sensible defaults."""

from __future__ import annotations

import dataclasses

from ftsup.supervisor.core import soft as soft_state
from ftsup.supervisor.core.admission import refusal
from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.decide import decide
from ftsup.supervisor.core.events import Event, NodeRole, SnapshotCommitted
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.inputs import AgentHello, Input
from ftsup.supervisor.core.state import ClusterState, SoftState

NOW = 1_000.0


def job(nodes: int = 3, ranks_per_node: int = 2) -> JobSpec:
    return JobSpec(name="test", nodes=nodes, ranks_per_node=ranks_per_node, argv=("train",))


def config(nodes: int = 3, ranks_per_node: int = 2, allowed: frozenset[str] = frozenset()) -> CoreConfig:
    return CoreConfig(
        job=job(nodes, ranks_per_node),
        detector=DetectorConfig(heartbeat_interval_s=1.0, heartbeat_misses=3, reconnect_grace_s=1.0),
        allowed_nodes=allowed,
        spare_grace_s=3.0,
    )


def hello(node_id: str, *, spare: bool = False, incarnation: int = 1, stream_id: int | None = None,
          port: int = 9000) -> AgentHello:
    return AgentHello(
        node_id=node_id,
        incarnation=incarnation,
        role=NodeRole.SPARE if spare else NodeRole.ACTIVE,
        host="127.0.0.1",
        peer_port=port,
        gpus=8,
        stream_id=stream_id if stream_id is not None else abs(hash((node_id, incarnation))) % 10_000 + 1,
    )


class Sim:
    """Drives the pure core like the runtime does: refuse, observe, decide, fold."""

    def __init__(self, cfg: CoreConfig | None = None, now: float = NOW) -> None:
        self.config = cfg or config()
        self.now = now
        self.state = ClusterState()
        self.soft = SoftState(started_at_s=now)
        self.log: list[Event] = []
        self.waiting_reason = ""

    def feed(self, inp: Input, *, at: float | None = None) -> list[Event] | str:
        """Returns the events decided, or the refusal reason."""
        if at is not None:
            self.now = at
        reason = refusal(self.state, self.soft, inp, self.config)
        if reason is not None:
            return reason
        soft_state.observe(self.soft, self.state, inp, self.now, self.config.straggler)
        decision = decide(self.state, self.soft, inp, self.now, self.config)
        self.state = evolve_all(self.state, decision.events)
        self.state = dataclasses.replace(self.state, applied_seq=self.state.applied_seq + len(decision.events))
        self.waiting_reason = decision.waiting_reason
        self.log.extend(decision.events)
        for event in decision.events:
            if isinstance(event, SnapshotCommitted):
                soft_state.forget_committed(self.soft, event.step)
        return list(decision.events)

    def events(self, inp: Input, *, at: float | None = None) -> list[Event]:
        result = self.feed(inp, at=at)
        assert not isinstance(result, str), f"refused: {result}"
        return result
