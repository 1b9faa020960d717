"""Checks that records naming other records by seq name the right ones: a quarantine's evidence
(`NodeQuarantined.evidence_seq`) is the record of what it was quarantined for, and an SDC check's
id is `sdc-<the seq of its own SdcCheckStarted record>`. The unit-test driver (builders.Sim) runs
it on every append, so every core test checks it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ftsup.supervisor.core.events import (
    EndReason,
    Event,
    GenerationEnded,
    NodeDeclaredDead,
    NodeQuarantined,
    OperatorCommand,
    QuarantineCause,
    Record,
    SdcCheckFinished,
    SdcCheckStarted,
    SdcSuspected,
    StragglerDetected,
    XidReported,
)

DEATHS = (QuarantineCause.DEAD_STREAM_LOSS, QuarantineCause.DEAD_NEVER_HEARD, QuarantineCause.DEAD_SILENT)


def is_evidence_for(quarantined: NodeQuarantined, evidence: Event) -> bool:
    """Whether `evidence` is the record a quarantine with this cause must name."""
    node = quarantined.node_id
    match quarantined.cause:
        case QuarantineCause.XID:
            return isinstance(evidence, XidReported) and evidence.node_id == node
        case QuarantineCause.HUNG:
            return (isinstance(evidence, GenerationEnded) and evidence.reason is EndReason.HUNG
                    and evidence.node_id == node)
        case QuarantineCause.STRAGGLER:
            return isinstance(evidence, StragglerDetected) and evidence.node_id == node
        case QuarantineCause.SDC:
            return ((isinstance(evidence, SdcSuspected) and evidence.node_id == node)
                    or (isinstance(evidence, SdcCheckFinished) and node in evidence.culprit_node_ids))
        case QuarantineCause.OPERATOR:
            return isinstance(evidence, OperatorCommand) and evidence.command == "quarantine" and node in evidence.args
        case cause if cause in DEATHS:
            return isinstance(evidence, NodeDeclaredDead) and evidence.node_id == node and evidence.cause is cause
    return False


def seq_problems(appended: Iterable[Record], log: Mapping[int, Event]) -> list[str]:
    """What is wrong with the seqs the `appended` records name; `log` maps seq -> event and holds
    them and every record before them."""
    problems = []
    for record in appended:
        event = record.event
        if isinstance(event, NodeQuarantined):
            evidence = log.get(event.evidence_seq)
            if evidence is None or not is_evidence_for(event, evidence):
                problems.append(f"record {record.seq}: {event} names record {event.evidence_seq} as evidence,"
                                f" which is {evidence}")
        elif isinstance(event, SdcCheckStarted) and event.check_id != f"sdc-{record.seq}":
            problems.append(f"record {record.seq}: SDC check {event.check_id!r} is not named after its record")
    return problems
