"""A generation's life in the core: when it runs, how it ends, when the job completes, and what
starts the next one (or why none can start yet).

The one builder of GenerationEnded is here (`ended`), so every end carries the same facts: the
newest step any rank reported (unless the caller knows better) and, for a rank's exit, its code
and output. Ends for causes owned elsewhere (a death in liveness.py, an Xid or a hang in
faults.py, a drain in drains.py, an SDC verdict in sdc_verdicts.py) are built through it. What
ends here: a rank's exit (at once, or once a collateral-looking exit's settle window is over),
every rank finished (the job completes), an elastic job growing back. Pure.
"""

from __future__ import annotations

from ftsup.supervisor.core.config import CoreConfig
from ftsup.supervisor.core.events import EndReason, Event, GenerationEnded, GenerationRunning, JobCompleted
from ftsup.supervisor.core.inputs import StepReport, TrainerExit
from ftsup.supervisor.core.policies import exit_cause, planner
from ftsup.supervisor.core.state import ClusterState, SoftState

# -- starting and waiting -------------------------------------------------------------------------


def plan_next(state: ClusterState, soft: SoftState, config: CoreConfig, now: float) -> planner.Plan:
    """The next generation when none is in force and one can be placed, else why the job waits
    (the planner's reasons: active nodes, spares and their grace, restore sources)."""
    return planner.plan_generation(state, soft, config.job, now, spare_grace_s=config.spare_grace_s)


# -- running --------------------------------------------------------------------------------------


def mark_running(state: ClusterState, report: StepReport) -> list[Event]:
    """The generation in force runs from its first step report."""
    generation = state.generation
    if generation is None or generation.number != report.generation or generation.is_running:
        return []
    return [GenerationRunning(generation=report.generation, first_step=report.step)]


def newest_step(soft: SoftState, generation: int) -> int:
    """The newest step any rank of `generation` reported (0: none, or another generation's)."""
    progress = soft.progress
    return progress.max_step if progress is not None and progress.generation == generation else 0


# -- ending ---------------------------------------------------------------------------------------


def ended(soft: SoftState | None, generation: int, reason: EndReason, node_id: str, detail: str, *,
          last_step: int | None = None, silent_for_s: float = 0.0, exit_: TrainerExit | None = None
          ) -> GenerationEnded:
    """The one place a generation's end is built: its last step is the newest step any rank
    reported (unless the caller knows better), and a rank's exit brings its code and output."""
    return GenerationEnded(
        generation=generation,
        reason=reason,
        node_id=node_id,
        last_step=last_step if last_step is not None else newest_step(soft, generation) if soft is not None else 0,
        detail=detail,
        silent_for_s=silent_for_s,
        rank=exit_.rank if exit_ is not None else None,
        exit_code=exit_.exit_code if exit_ is not None else None,
        output_tail=exit_.output_tail if exit_ is not None else "",
    )


def end_if_member(state: ClusterState, soft: SoftState, node_id: str, reason: EndReason, detail: str,
                  *, silent_for_s: float = 0.0) -> list[Event]:
    """Ends the generation in force when `node_id` holds ranks in it."""
    generation = state.generation
    if generation is None or not generation.member(node_id):
        return []
    return [ended(soft, generation.number, reason, node_id, detail, silent_for_s=silent_for_s)]


def end_current(state: ClusterState, soft: SoftState, reason: EndReason, detail: str) -> list[Event]:
    """Ends the generation in force, if one is, naming no node."""
    generation = state.generation
    if generation is None:
        return []
    return [ended(soft, generation.number, reason, "", detail)]


def complete_if_finished(state: ClusterState, soft: SoftState) -> list[Event]:
    """Every rank finished: the job completes, unless a recompute check may still prove one of
    its steps corrupt (then it completes when the last check closes clean)."""
    generation = state.generation
    progress = soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    if len(progress.finished) < generation.world_size or state.sdc_checks:
        return []
    digests = sorted(set(progress.finished.values()))
    detail = "every rank finished" if len(digests) == 1 else f"ranks disagree on the final digest: {digests}"
    return [
        ended(soft, generation.number, EndReason.COMPLETED, "", detail),  # last step: progress.max_step
        JobCompleted(generation=generation.number, step=progress.max_step,
                     param_digest=progress.finished[0] if 0 in progress.finished else digests[0]),
    ]


def on_trainer_exit(state: ClusterState, soft: SoftState, exit_: TrainerExit) -> list[Event]:
    """A rank exited. Finished (it said so, or a plain script exited 0: torchrun's rule, level 0)
    -> the job completes when every rank has; anything else ends the generation (gang restart)."""
    generation = state.generation
    if generation is None or generation.number != exit_.generation:
        return []
    if exit_.is_plain_script and exit_.exit_code == 0:
        return complete_if_finished(state, soft)  # soft.observe counted it finished
    if exit_.finished:
        return []
    progress = soft.progress
    if progress is not None and progress.generation == generation.number and exit_.rank in progress.finished:
        return []
    if exit_cause.should_hold(state, exit_):
        return []  # collateral, by the look of it: soft.observe held it; release_held_exit ends on it if nothing better shows
    return [_ended_by_exit(soft, exit_, f"rank {exit_.rank} exited with {_exit_text(exit_.exit_code)}")]


def release_held_exit(state: ClusterState, soft: SoftState, now: float, config: CoreConfig) -> list[Event]:
    """Ends the generation on the first held (collateral-looking) exit once the settle window is
    over and no member is suspected any more; a suspect's verdict comes within the detector's
    limits, so the wait is capped by them too."""
    generation, progress = state.generation, soft.progress
    if generation is None or progress is None or progress.generation != generation.number:
        return []
    since = progress.held_since_s
    if since is None or not progress.held_exits:
        return []
    waited = now - since
    detector = config.detector
    cap = config.exit_settle_s + detector.dead_after_s + detector.reconnect_grace_s
    if waited < config.exit_settle_s or (waited < cap and exit_cause.suspects_besides(state, "")):
        return []
    first = progress.held_exits[0]
    others = len(progress.held_exits) - 1
    detail = (f"rank {first.rank} exited with {_exit_text(first.exit_code)} after a peer connection failed;"
              f" no other cause showed within {waited:.1f}s" + (f" ({others} more ranks exited alike)" if others else ""))
    return [_ended_by_exit(soft, first, detail)]


def _ended_by_exit(soft: SoftState, exit_: TrainerExit, detail: str) -> GenerationEnded:
    return ended(soft, exit_.generation, EndReason.TRAINER_EXITED, exit_.node_id, detail, exit_=exit_)


def _exit_text(code: int) -> str:
    if code < 0:
        return f"signal {-code}"
    return f"code {code}"


def grow_if_nodes_back(state: ClusterState, soft: SoftState, config: CoreConfig) -> list[Event]:
    """A shrunk elastic job with nodes back ends its generation at its committed snapshot; the
    planner then starts the bigger world from it (ranks without a copy of their own take another
    rank's: the state is replicated)."""
    target = planner.grow_to(state, soft, config.job)
    generation = state.generation
    if target is None or generation is None:
        return []
    nodes = generation.world_size // config.job.ranks_per_node
    detail = f"{target} nodes healthy for a world of {nodes}: growing back toward {config.job.nodes}"
    return [ended(soft, generation.number, EndReason.ELASTIC_GROW, "", detail)]
