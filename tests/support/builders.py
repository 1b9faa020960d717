"""Builders for pure-core tests: a fixed NOW, small configs, inputs with sensible defaults."""

from __future__ import annotations

from collections.abc import Sequence

from ftsup.supervisor.core.config import CoreConfig, DetectorConfig, JobSpec
from ftsup.supervisor.core.events import Event, NodeRole
from ftsup.supervisor.core.inputs import AgentHello, Input, SnapshotHoldings, StepAggregate
from ftsup.supervisor.core.state import ClusterState, SoftState
from ftsup.supervisor.core.step import Core, Ready
from tests.support.evidence import seq_problems

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
    """Drives the pure core as the runtime does, through the same step (core/step.py): refuse,
    observe, decide, then fold the events as records stamped with the sim's clock. Every append
    is checked: the seqs its records name (evidence, SDC check ids) name the right records."""

    def __init__(self, cfg: CoreConfig | None = None, now: float = NOW, state: ClusterState | None = None) -> None:
        self.config = cfg or config()
        self.now = now
        self.core = Core(self.config, state or ClusterState(), SoftState(started_at_s=now))
        self.log: list[Event] = []
        self.records: dict[int, Event] = {}  # seq -> event of every record appended here

    @property
    def state(self) -> ClusterState:
        return self.core.state

    @property
    def soft(self) -> SoftState:
        return self.core.soft

    @property
    def waiting_reason(self) -> str:
        return self.core.waiting_reason

    def restart_leader(self, started_at_s: float) -> None:
        """A new leader: the soft state starts afresh, the logged state stays."""
        self.core.reset_soft(started_at_s)

    def feed(self, inp: Input, *, at: float | None = None) -> list[Event] | str:
        """Returns the events decided, or the refusal reason."""
        if at is not None:
            self.now = at
        ready = self.core.step(inp, self.now)
        if ready.refusal is not None:
            return ready.refusal.reason
        return self._persist(ready)

    def feed_fold(self, parts: Sequence[StepAggregate], *, at: float | None = None,
                  folded: StepAggregate | None = None) -> list[list[Event] | str] | None:
        """Several nodes' aggregates of one step decided as one (Core.step_aggregates): per part
        the refusal reason, or the events the fold decided (the same list for every admitted
        part; parts after the fold's last admitted one fed alone, as the runtime does). None: the
        core would not fold them (nothing observed; the caller feeds each). `folded`: their fold
        as decoded from a shard's packed ShardStepFold (Core.step_aggregates)."""
        if at is not None:
            self.now = at
        stepped = self.core.step_aggregates(parts, self.now, folded)
        if stepped is None:
            return None
        events = self._persist(stepped.ready)
        answers: list[list[Event] | str] = [events if r is None else r.reason for r in stepped.refusals]
        return answers + [self.feed(part) for part in parts[len(stepped.refusals):]]

    def feed_step_fold(self, parts: Sequence[StepAggregate], *, at: float | None = None
                       ) -> list[list[Event] | str] | None:
        """The parts as a shard's packed fold reaches the runtime: decided whole on the fold's
        arrays (Core.step_fold) when it may be, else as `feed_fold` decides its parts."""
        if at is not None:
            self.now = at
        fold = StepAggregate.fold(parts)
        stepped = self.core.step_fold(fold, self.now) if len(parts) > 1 else None
        if stepped is None:
            return self.feed_fold(fold.parts(), folded=fold)
        events = self._persist(stepped.ready)
        return [events] * len(parts)

    def feed_holdings(self, parts: Sequence[SnapshotHoldings], *, at: float | None = None
                      ) -> list[list[Event] | str] | None:
        """Several nodes' SnapshotHoldings of one step decided as one (Core.step_holdings): per
        part the refusal reason or the events the fold decided, the parts after the fold's end fed
        alone, as the runtime does. None: the core would not fold them (the caller feeds each)."""
        if at is not None:
            self.now = at
        stepped = self.core.step_holdings(parts, self.now)
        if stepped is None:
            return None
        events = self._persist(stepped.ready)
        answers: list[list[Event] | str] = [events if r is None else r.reason for r in stepped.refusals]
        return answers + [self.feed(part) for part in parts[len(stepped.refusals):]]

    def _persist(self, ready: Ready) -> list[Event]:
        records = self.core.records(ready.events, self.now)
        self.core.advance(ready, records)
        self.log.extend(ready.events)
        self.records.update((r.seq, r.event) for r in records)
        problems = seq_problems(records, self.records)
        assert not problems, "\n".join(problems)
        return list(ready.events)

    def events(self, inp: Input, *, at: float | None = None) -> list[Event]:
        result = self.feed(inp, at=at)
        assert not isinstance(result, str), f"refused: {result}"
        return result
