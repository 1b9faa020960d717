"""What each node should be doing: a projection of the cluster state, never stored.

A new leader recomputes directives instead of remembering what was sent; agents apply them
idempotently (keyed by generation), so sending the same directive twice is harmless.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.core.config import JobSpec
from supervisor.core.events import RestoreKind
from supervisor.core.state import ClusterState, Generation


class Action(enum.Enum):
    STANDBY = "standby"
    RUN = "run"


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class RestoreFrom:
    rank: int
    kind: RestoreKind
    source_node_id: str
    source_address: str


@dataclass(frozen=True, slots=True)
class Directive:
    generation: int
    action: Action
    ranks: tuple[int, ...] = ()
    world_size: int = 0
    master_addr: str = ""
    master_port: int = 0
    argv: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    restore_step: int | None = None
    restores: tuple[RestoreFrom, ...] = ()
    buddy_node_id: str = ""
    buddy_address: str = ""
    retain_from_step: int = 0
    reason: str = ""


def project_directives(state: ClusterState, job: JobSpec, waiting_reason: str) -> Mapping[str, Directive]:
    return {node_id: directive_for(state, job, node_id, waiting_reason) for node_id in state.nodes}


def directive_for(state: ClusterState, job: JobSpec, node_id: str, waiting_reason: str) -> Directive:
    generation = state.generation
    retain = state.snapshot.step if state.snapshot is not None else 0
    if generation is not None:
        member = generation.member(node_id)
        if member is not None:
            return _run(state, job, generation, node_id, retain)
    number = generation.number if generation else state.last_generation
    return Directive(generation=number, action=Action.STANDBY, retain_from_step=retain,
                     reason=_standby_reason(state, node_id, waiting_reason))


def _run(state: ClusterState, job: JobSpec, generation: Generation, node_id: str, retain: int) -> Directive:
    member = generation.member(node_id)
    assert member is not None
    buddy = state.node(member.buddy_node_id) if member.buddy_node_id else None
    restores = tuple(
        RestoreFrom(
            rank=r.rank,
            kind=r.kind,
            source_node_id=r.source_node_id,
            source_address=_address(state, r.source_node_id),
        )
        for r in generation.restores
        if r.rank in member.ranks
    )
    return Directive(
        generation=generation.number,
        action=Action.RUN,
        ranks=member.ranks,
        world_size=generation.world_size,
        master_addr=generation.master_addr,
        master_port=generation.master_port,
        argv=job.argv,
        env=tuple(EnvVar(k, v) for k, v in job.env),
        restore_step=generation.restore_step,
        restores=restores,
        buddy_node_id=member.buddy_node_id,
        buddy_address=buddy.peer_address if buddy else "",
        # The restore step is the committed one, so it is kept until a newer step commits.
        retain_from_step=retain,
        reason=f"generation {generation.number}",
    )


def _address(state: ClusterState, node_id: str) -> str:
    node = state.node(node_id)
    return node.peer_address if node else ""


def _standby_reason(state: ClusterState, node_id: str, waiting_reason: str) -> str:
    node = state.node(node_id)
    if state.completion is not None:
        return "job completed"
    if node is not None and node.is_quarantined:
        return f"quarantined: {node.quarantine_reason}"
    if node is not None and node.is_drained:
        return "drained"
    if state.generation is not None:
        return f"spare for generation {state.generation.number}"
    return waiting_reason or "waiting"
