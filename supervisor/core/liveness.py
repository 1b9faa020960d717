"""A node's registration and liveness in the core: what a Hello changes, and what the failure
detector's verdicts on a Tick decide (suspected, cleared, declared dead).

A death is three events in evolve's order: NodeDeclaredDead, then (if the node trained) the
generation's end, then the quarantine naming the death record as its evidence. A node declared
dead after a lost stream (or never heard by a new leader) that comes back as the same agent
process was not dead: its Hello returns it to service (`QuarantineCause.is_transient_death`).
The detector's rules are policies/failure.py's; the heartbeat times it reads are soft state. Pure.
"""

from __future__ import annotations

from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.emission import Emission
from ftsup.supervisor.core.events import (
    EndReason,
    Event,
    NodeCleared,
    NodeDeclaredDead,
    NodeQuarantined,
    NodeRegistered,
    NodeSuspected,
    NodeUnquarantined,
)
from ftsup.supervisor.core.generations import ended
from ftsup.supervisor.core.inputs import AgentHello
from ftsup.supervisor.core.policies import failure
from ftsup.supervisor.core.state import ClusterState, Liveness, SoftState


def on_hello(state: ClusterState, hello: AgentHello) -> list[Event]:
    """A new node registers; a known one re-registers when anything it runs as changed (a new
    incarnation of a member breaks the gang), clears a suspicion, or returns after a blip."""
    node = state.node(hello.node_id)
    registered = NodeRegistered(
        node_id=hello.node_id,
        incarnation=hello.incarnation,
        role=hello.role,
        host=hello.host,
        peer_port=hello.peer_port,
        gpus=hello.gpus,
        failure_domain=hello.failure_domain,
    )
    if node is None:
        return [registered]
    if node.liveness is Liveness.DEAD:
        if node.incarnation == hello.incarnation and node.quarantine_cause.is_transient_death:
            # The same agent process is back: its stream loss was transient (a network blip), or
            # this supervisor (new after a failover) never heard it in time, not a death. Its
            # generation was already replaced; it returns to service as a spare would.
            why = "reconnected with the same incarnation: the loss was transient"
            return [registered, NodeUnquarantined(hello.node_id, why, "")]
        return [registered]
    events: list[Event] = []
    changed = (node.incarnation, node.role, node.host, node.peer_port, node.gpus, node.failure_domain) != (
        hello.incarnation, hello.role, hello.host, hello.peer_port, hello.gpus, hello.failure_domain,
    )
    current = state.generation
    if node.incarnation != hello.incarnation and current is not None and current.member(hello.node_id):
        # A restarted agent lost its trainers and its RAM snapshots: the gang is broken.
        detail = f"agent restarted (incarnation {node.incarnation} -> {hello.incarnation})"
        events.append(ended(None, current.number, EndReason.NODE_RESTARTED, hello.node_id, detail, last_step=0))
    if changed:
        events.append(registered)  # also makes a suspect node alive again
    elif node.liveness is Liveness.SUSPECT:
        events.append(NodeCleared(hello.node_id, "reconnected"))
    return events


def on_tick(soft: SoftState, now: float, config: CoreConfig, out: Emission) -> None:
    """The failure detector's verdicts at `now`, each decided against the state with the ones
    before it folded in (a death ends the generation once; the next death finds it ended)."""
    for verdict in failure.judge(out.folded(), soft, config.detector, now):
        state = out.folded()
        if verdict.liveness is Liveness.SUSPECT:
            out.add(NodeSuspected(verdict.node_id, verdict.reason, verdict.silent_for_s))
        elif verdict.liveness is Liveness.ALIVE:
            out.add(NodeCleared(verdict.node_id, verdict.reason))
        else:
            declare_dead(state, soft, verdict, out)


def declare_dead(state: ClusterState, soft: SoftState, verdict: failure.Verdict, out: Emission) -> None:
    """Dead, then (if it was training) the generation ends, then quarantine: evolve's order. The
    quarantine's evidence is the NodeDeclaredDead record."""
    evidence = out.add(NodeDeclaredDead(verdict.node_id, verdict.reason, verdict.silent_for_s, verdict.cause))
    generation = state.generation
    if generation is not None and generation.member(verdict.node_id):
        out.add(ended(soft, generation.number, EndReason.NODE_LOST, verdict.node_id, verdict.reason,
                      silent_for_s=verdict.silent_for_s))
    if not state.nodes[verdict.node_id].is_quarantined:
        out.add(NodeQuarantined(verdict.node_id, _quarantine_reason(verdict.reason), evidence, verdict.cause))


def _quarantine_reason(death_reason: str) -> str:
    return f"declared dead: {death_reason}"
