"""What applying a Directive means, given what this node already applied.

Pure: the launcher passes the (generation, action) it last applied and the new directive's, and
gets back one typed step with its reason. The rule it enforces: directives are applied
idempotently and keyed by generation, so a re-sent directive (reconnect, new leader) never
restarts trainers, and a directive from an older generation never undoes a newer one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    """Mirrors proto `Action`; kept here so core never imports generated code."""

    STANDBY = "standby"
    RUN = "run"


@dataclass(frozen=True, slots=True)
class Applied:
    """The directive this node last acted on (its generation and action)."""

    generation: int
    action: Action


class Step(enum.Enum):
    START = "start"  # no live trainers of another generation: start the ranks
    RESTART = "restart"  # kill trainers of the old generation, wait until reaped, then start
    UPDATE = "update"  # same RUN again: only refresh retention and buddy
    STOP = "stop"  # stand by: stop trainers gracefully
    NOOP = "noop"  # same STANDBY again
    IGNORE = "ignore"  # stale or malformed; the reason says which


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    reason: str


def diff_directive(
    applied: Applied | None, generation: int, action: Action | None, *, has_live_trainers: bool
) -> Decision:
    """Decides how to apply a directive for `generation` with `action`.

    Args:
        applied: the directive last acted on, None before the first one.
        generation: the new directive's generation.
        action: the new directive's action; None when the sender left it unspecified.
        has_live_trainers: whether trainer processes are still alive on this node.
    """
    if action is None:
        return Decision(Step.IGNORE, f"directive for generation {generation} has no action")
    if applied is not None and generation < applied.generation:
        return Decision(
            Step.IGNORE,
            f"stale directive: generation {generation} is older than applied generation {applied.generation}",
        )
    same_generation = applied is not None and applied.generation == generation
    if action is Action.STANDBY:
        if same_generation and applied is not None and applied.action is Action.STANDBY:
            return Decision(Step.NOOP, f"already standing by in generation {generation}")
        return Decision(Step.STOP, f"stand by in generation {generation}")
    if same_generation and applied is not None and applied.action is Action.RUN:
        return Decision(Step.UPDATE, f"generation {generation} already running: refresh retention and buddy")
    if has_live_trainers:
        previous = applied.generation if applied is not None else 0
        return Decision(
            Step.RESTART, f"generation {generation} replaces generation {previous}: kill its trainers first"
        )
    return Decision(Step.START, f"start generation {generation}")


def validate_run(generation: int, ranks: list[int], world_size: int, argv: list[str]) -> str | None:
    """Returns why a RUN directive cannot be applied, or None when it can."""
    if generation < 1:
        return f"RUN directive has generation {generation}; 0 is reserved for 'none running'"
    if not argv:
        return "RUN directive has an empty argv"
    if not ranks:
        return "RUN directive lists no ranks"
    if len(set(ranks)) != len(ranks):
        return f"RUN directive lists duplicate ranks {ranks}"
    if world_size < 1 or max(ranks) >= world_size:
        return f"RUN directive ranks {ranks} do not fit world_size {world_size}"
    return None
