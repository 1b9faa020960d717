"""Failure detector: which nodes to suspect, clear or declare dead, from soft state and `now`.

A closed stream is the fastest signal: the node is suspected at once and declared dead when it
has not reconnected within `reconnect_grace_s`. Silence on an open stream (a hung or partitioned
node) is caught by heartbeats: suspect after 1.5 intervals, dead after `heartbeat_misses`.
A fresh supervisor grants every node one full timeout of grace before any verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.config import DetectorConfig
from supervisor.core.state import ClusterState, Liveness, SoftState


STREAM_LOSS = "stream closed and not reopened"  # the start of a death verdict's reason
NEVER_HEARD = "not heard from within"  # ...when this supervisor never heard the node at all


@dataclass(frozen=True, slots=True)
class Verdict:
    node_id: str
    liveness: Liveness  # SUSPECT or DEAD (or ALIVE to clear)
    reason: str
    silent_for_s: float


def judge(state: ClusterState, soft: SoftState, config: DetectorConfig, now: float) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for node in state.nodes.values():
        if node.liveness is Liveness.DEAD:
            continue
        info = soft.nodes.get(node.node_id)
        # Nodes not heard since this supervisor started count from its start (the grace).
        last_heard = info.last_heard_s if info is not None else soft.started_at_s
        last_heard = max(last_heard, soft.started_at_s)
        silent_for = now - last_heard
        connected = info is not None and info.stream_id is not None
        if info is None:
            # Not heard since this supervisor started: no verdict until the grace is over.
            if silent_for >= config.dead_after_s:
                verdicts.append(
                    Verdict(node.node_id, Liveness.DEAD, f"{NEVER_HEARD} {config.dead_after_s:g}s", silent_for)
                )
            continue
        if not connected:
            closed_at = max(info.disconnected_at_s or soft.started_at_s, soft.started_at_s)
            if now - closed_at >= config.reconnect_grace_s:
                reason = f"{STREAM_LOSS} within {config.reconnect_grace_s:g}s"
                verdicts.append(Verdict(node.node_id, Liveness.DEAD, reason, silent_for))
            elif silent_for >= config.dead_after_s:  # silence is silence, connected or not
                reason = f"no heartbeat for {silent_for:.1f}s (limit {config.dead_after_s:g}s)"
                verdicts.append(Verdict(node.node_id, Liveness.DEAD, reason, silent_for))
            elif node.liveness is Liveness.ALIVE:
                verdicts.append(Verdict(node.node_id, Liveness.SUSPECT, "stream closed", silent_for))
            continue
        if silent_for >= config.dead_after_s:
            verdicts.append(
                Verdict(
                    node.node_id,
                    Liveness.DEAD,
                    f"no heartbeat for {silent_for:.1f}s (limit {config.dead_after_s:g}s)",
                    silent_for,
                )
            )
        elif silent_for >= 1.5 * config.heartbeat_interval_s and node.liveness is Liveness.ALIVE:
            verdicts.append(Verdict(node.node_id, Liveness.SUSPECT, "heartbeat overdue", silent_for))
        elif silent_for < config.heartbeat_interval_s * 1.5 and node.liveness is Liveness.SUSPECT:
            verdicts.append(Verdict(node.node_id, Liveness.ALIVE, "heard from again", silent_for))
    return verdicts
