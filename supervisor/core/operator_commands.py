"""Operator commands in the core (`supervisorctl quarantine|unquarantine|drain|checkpoint|restart`):
what each decides once admission let it through (who may, on which node: admission.py).

Every command is recorded first (OperatorCommand: who, authenticated as whom, why); what it
changes follows as its own events, and a quarantine names the command's record as evidence. A
drain only records here: soft.observe keeps it pending and drains.py hands the node over. Pure.
"""

from __future__ import annotations

from typing import assert_never

from ftsup.supervisor.core import checkpoints
from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.emission import Emission
from ftsup.supervisor.core.events import EndReason, NodeQuarantined, NodeUnquarantined, OperatorCommand, QuarantineCause
from ftsup.supervisor.core.generations import end_if_member, ended
from ftsup.supervisor.core.inputs import OperatorCommandKind, OperatorRequest
from ftsup.supervisor.core.state import ClusterState, SoftState


def on_request(state: ClusterState, soft: SoftState, request: OperatorRequest, config: CoreConfig,
               out: Emission) -> None:
    """The command's record, then what it changes (a quarantine names the record as evidence)."""
    evidence = out.add(OperatorCommand(request.command.value, (request.node_id,) if request.node_id else (),
                                       request.operator, request.reason, request.principal))
    reason = f"{request.command} by {request.operator or 'an operator'}: {request.reason}"
    match request.command:
        case OperatorCommandKind.QUARANTINE:
            out.extend(end_if_member(state, soft, request.node_id, EndReason.NODE_QUARANTINED, reason))
            out.add(NodeQuarantined(request.node_id, reason, evidence, QuarantineCause.OPERATOR))
        case OperatorCommandKind.UNQUARANTINE:
            out.add(NodeUnquarantined(request.node_id, request.reason, request.operator))
        case OperatorCommandKind.CHECKPOINT:  # ranks save at the lead step; the reply names it
            out.extend(checkpoints.request(state, soft, config, reason))
        case OperatorCommandKind.RESTART:  # the planner starts the next generation from the newest committed snapshot
            generation = state.generation
            if generation is not None:  # admission refuses a restart without one; kept total for property tests
                out.add(ended(soft, generation.number, EndReason.OPERATOR_RESTART, "", reason))
        case OperatorCommandKind.DRAIN:  # recorded in soft.pending_drains; an idle node goes at once
            pass  # (drains.drain_idle), a training one at its generation's next committed step
        case unknown:
            assert_never(unknown)
