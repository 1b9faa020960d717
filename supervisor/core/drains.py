"""Operator drains in the core: when a drained node's ranks are handed over.

`supervisorctl drain` records the request (soft.observe keeps it in `soft.pending_drains` until
the node is drained or unquarantined). A node that holds no ranks goes at once, before the next
plan (`drain_idle`); a training one at its generation's next committed snapshot step, when every
rank is held twice and the restore loses nothing (`hand_over_at`, called by the commit). Pure.
"""

from __future__ import annotations

from ftsup.supervisor.core.events import EndReason, Event, NodeDrained
from ftsup.supervisor.core.generations import ended, newest_step
from ftsup.supervisor.core.state import ClusterState, Generation, SoftState


def drain_idle(state: ClusterState, soft: SoftState) -> list[Event]:
    """Pending drains of nodes that hold no ranks (any more) take effect before the next plan."""
    generation = state.generation
    return [
        NodeDrained(node_id, "drained (it held no ranks)", "")
        for node_id in sorted(soft.pending_drains)
        if node_id in state.nodes
        and not state.nodes[node_id].is_drained
        and (generation is None or not generation.member(node_id))
    ]


def hand_over_at(soft: SoftState, generation: Generation, step: int) -> list[Event]:
    """At a committed step (every rank held twice), the first pending drain of a member ends the
    generation and drains its node; other pending drains apply to idle nodes (`drain_idle`)."""
    for node_id in sorted(soft.pending_drains):
        if generation.member(node_id):
            detail = f"drained at committed step {step}"
            last = max(step, newest_step(soft, generation.number))
            return [ended(soft, generation.number, EndReason.NODE_DRAINED, node_id, detail, last_step=last),
                    NodeDrained(node_id, detail, "")]
    return []
