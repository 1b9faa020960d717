"""The restart budget: which generation ends count as failures, and when the job gives up.

Pure. torchrun's `--max-restarts` rule, with ftsup's causes: each generation ended by a failure
(a rank's exit, a lost or restarted node, a hang, an Xid, SDC, a quarantine) is one gang restart;
the failure after `max_restarts` of them ends the job FAILED (JobFailed naming that failure).
Operator restarts, drains, elastic growth and completion are not failures and cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ftsup.supervisor.core.config import JobSpec
from ftsup.supervisor.core.events import FAILURE_REASONS, EndReason, Event, GenerationEnded, JobFailed
from ftsup.supervisor.core.state import ClusterState


def is_failure(reason: EndReason) -> bool:
    return reason in FAILURE_REASONS


def restart_count(state: ClusterState) -> int:
    """Gang restarts caused by failures so far: TORCHELASTIC_RESTART_COUNT of the next generation."""
    return state.failures


def on_ended(folded: ClusterState, events: Sequence[Event], job: JobSpec) -> list[Event]:
    """JobFailed when one of `events` (already folded into `folded`) is a failure past the budget."""
    if job.max_restarts is None or folded.failed is not None or folded.completion is not None:
        return []
    if folded.generation is not None or folded.failures <= job.max_restarts:
        return []
    ended = [e for e in events if isinstance(e, GenerationEnded) and is_failure(e.reason)]
    if not ended:
        return []
    last = ended[-1]
    return [JobFailed(
        generation=last.generation, cause=last.reason, node_id=last.node_id, rank=last.rank,
        exit_code=last.exit_code, detail=last.detail, output_tail=last.output_tail,
        restarts=folded.failures - 1, max_restarts=job.max_restarts,
    )]


def describe(failed: JobFailed) -> str:
    """One line for people: what failed, where, after how many restarts."""
    where = f" on {failed.node_id}" if failed.node_id else ""
    rank = f" rank {failed.rank}" if failed.rank is not None else ""
    return (f"job failed after {failed.restarts} restart(s) (max_restarts={failed.max_restarts}):"
            f" {failed.cause.value}{rank}{where}: {failed.detail}")
