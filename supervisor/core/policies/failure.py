"""Failure detector: which nodes to suspect, clear or declare dead, from soft state and `now`.

A closed stream is the fastest signal: the node is suspected at once and declared dead when it
has not reconnected within `reconnect_grace_s`, or AGENT_GONE_SETTLE_S after the close when
its agent is known gone (its peer port refused a connection after the close: `AgentGone`).
Silence on an open stream (a hung or partitioned node) is caught by heartbeats: suspect after
1.5 intervals, dead after `heartbeat_misses`.
A fresh supervisor grants every node one full timeout of grace before any verdict.

A node a link shard relays is heard through the shard's liveness summaries. A shard that keeps
alive speaks at least every few hundred ms; quiet for longer than QUIET_SHARD_AFTER_S, it is
the shard that is silent (its loop starved of CPU, its process stopped), and its nodes' silence is
counted only up to then, as the supervisor's own stalls are not counted (issue 14: a shard's
trouble is one event, not two thousand node deaths). For at most SHARD_QUIET_LIMIT x
`dead_after_s`: a shard quiet for that long is gone, and its nodes that did not move are judged on
their whole silence, so a node behind a hung shard is declared dead after at most about twice the
usual silence (a killed shard's streams close at once: its nodes move within the reconnect grace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ftsup.supervisor.core.config import DetectorConfig
from ftsup.supervisor.core.events import QuarantineCause
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeSoft, SoftState

STREAM_LOSS = "stream closed and not reopened"  # the start of a death verdict's reason
NEVER_HEARD = "not heard from within"  # ...when this supervisor never heard the node at all
# A shard that keeps alive sends a summary at least every SHARD_KEEPALIVE_S (supervisor/shard.py,
# 0.2 s); quiet for longer than this, the silence is the shard's.
QUIET_SHARD_AFTER_S = 0.5
# How long a shard may be quiet, in nodes' allowances of silence (`dead_after_s`), before it is
# taken for gone: a starved shard's quiet can outlast one allowance (a node that stepped just
# before is then still owed a whole one); a hung shard's nodes are not kept alive for long.
SHARD_QUIET_LIMIT = 2
_SILENT = QuarantineCause.DEAD_SILENT
# A node whose agent is known gone (AgentGone) is declared dead this long after its stream closed,
# not at once: nodes failing together (a job-wide kill, two nodes lost "at once") then close their
# streams inside one window, are suspected in the same pass, and are replaced by one restart, as
# the grace batched them (a test that killed a node and its buddy back to back saw two restarts).
AGENT_GONE_SETTLE_S = 0.15
# A connected, alive node whose silence is within this fraction of its first limit (suspicion,
# 1.5 intervals) of it is watched, judged alone on each Tick until it is heard, instead of setting
# the next pass over the fleet: a loaded fleet always has some node heard late, and its deadline
# made every Tick a pass over 12,500 nodes (issue 14, part 16: a fifth of the leader's loop).
# A fifth: at 5 s heartbeats a node is watched from 6 s of silence, at 1 s from 1.2 s, past the
# usual jitter of a heartbeat's way (a shard's gather, a Tick), so a healthy fleet watches none.
WATCH_AHEAD_FRACTION = 0.2


@dataclass(frozen=True, slots=True)
class Verdict:
    node_id: str
    liveness: Liveness  # SUSPECT or DEAD (or ALIVE to clear)
    reason: str
    silent_for_s: float
    # For a DEAD verdict, which kind of death (what a quarantine for it records); else UNSPECIFIED.
    cause: QuarantineCause = QuarantineCause.UNSPECIFIED


def judge(state: ClusterState, soft: SoftState, config: DetectorConfig, now: float) -> list[Verdict]:
    memo = soft.detector_memo
    nodes = state.nodes
    watched = memo.to_judge(nodes, config, soft.started_at_s, now)
    if watched is not None and not watched:
        return []  # (no node can have a verdict yet: core/detector_memo.py)
    verdicts: list[Verdict] = []
    # One pass over every node (12,500 at 100k GPUs) when one is due, else over the watched few:
    # the common case, a connected node heard from recently, is decided in a few operations, with
    # the limits computed once, and the oldest such node's time kept for the memo; every other
    # node is watched (judged on each Tick until the next whole pass).
    dead_after, suspect_after = config.dead_after_s, 1.5 * config.heartbeat_interval_s
    quiet_below = min(dead_after, suspect_after)  # (one miss: dead before suspect)
    unwatched_below = quiet_below * (1.0 - WATCH_AHEAD_FRACTION)  # (silent longer: due soon, watched)
    started, infos = soft.started_at_s, soft.nodes
    alive, suspect, dead = Liveness.ALIVE, Liveness.SUSPECT, Liveness.DEAD
    heard_until = _quiet_shards(soft, dead_after, now) if soft.shard_heard_s else {}
    oldest = math.inf
    watch: list[str] = []
    for node_id, node in (nodes.items() if watched is None else ((n, nodes[n]) for n in watched)):
        liveness = node.liveness
        if liveness is dead:
            continue
        info = infos.get(node_id)
        if info is None or info.stream_id is None:
            watch.append(node_id)
            verdict = _judge_unconnected(node_id, liveness, info, soft, config, now)
            if verdict is not None:
                verdicts.append(verdict)
            continue
        # Nodes not heard since this supervisor started count from its start (the grace).
        last_heard = info.last_heard_s
        if started > last_heard:  # max(last_heard, started)
            last_heard = started
        silent_for = now - last_heard
        if heard_until and silent_for >= quiet_below and info.shard in heard_until:
            silent_for = min(silent_for, heard_until[info.shard] - last_heard)  # (the rest is the shard's)
        if silent_for < quiet_below:  # the common case first: heard from lately
            if liveness is alive:
                if silent_for < unwatched_below:
                    if last_heard < oldest:
                        oldest = last_heard
                else:
                    watch.append(node_id)  # (due soon: judged alone on each Tick until heard)
                continue
            watch.append(node_id)
            if liveness is suspect:
                verdicts.append(Verdict(node_id, Liveness.ALIVE, "heard from again", silent_for))
            continue
        watch.append(node_id)  # (overdue, a suspect, or a clock that is not a number: look again next Tick)
        if silent_for >= dead_after:
            verdicts.append(
                Verdict(
                    node_id,
                    Liveness.DEAD,
                    f"no heartbeat for {silent_for:.1f}s (limit {config.dead_after_s:g}s)",
                    silent_for,
                    _SILENT,
                )
            )
        elif silent_for >= suspect_after and liveness is alive:  # (not NaN)
            verdicts.append(Verdict(node_id, Liveness.SUSPECT, "heartbeat overdue", silent_for))
    if watched is None:
        memo.passed(nodes, config, started, quiet_below, oldest, watch)
    else:
        memo.judged_watched(oldest, watch)
    return verdicts


def _quiet_shards(soft: SoftState, dead_after_s: float, now: float) -> dict[str, float]:
    """Shard -> the time up to which its nodes' silence counts, for each shard quiet now but not
    for so long that it is gone."""
    quiet: dict[str, float] = {}
    for shard, heard_s in soft.shard_heard_s.items():
        until = heard_s + QUIET_SHARD_AFTER_S
        if until < now < until + SHARD_QUIET_LIMIT * dead_after_s:
            quiet[shard] = until
    return quiet


def _judge_unconnected(
    node_id: str, liveness: Liveness, info: NodeSoft | None, soft: SoftState, config: DetectorConfig, now: float
) -> Verdict | None:
    """A node never heard by this supervisor (`info` None), or whose stream is closed."""
    last_heard = info.last_heard_s if info is not None else soft.started_at_s
    last_heard = max(last_heard, soft.started_at_s)
    silent_for = now - last_heard
    if info is None:
        # Not heard since this supervisor started: no verdict until the grace is over.
        if silent_for >= config.dead_after_s:
            return Verdict(node_id, Liveness.DEAD, f"{NEVER_HEARD} {config.dead_after_s:g}s", silent_for,
                           QuarantineCause.DEAD_NEVER_HEARD)
        return None
    closed_at = max(info.disconnected_at_s or soft.started_at_s, soft.started_at_s)
    if info.agent_gone and config.agent_probe and now - closed_at >= min(AGENT_GONE_SETTLE_S, config.reconnect_grace_s):
        # nothing listens where its agent did: it cannot reconnect within the grace
        return Verdict(node_id, Liveness.DEAD, f"{STREAM_LOSS}: {info.agent_gone}", silent_for,
                       QuarantineCause.DEAD_STREAM_LOSS)
    if now - closed_at >= config.reconnect_grace_s:
        return Verdict(node_id, Liveness.DEAD, f"{STREAM_LOSS} within {config.reconnect_grace_s:g}s", silent_for,
                       QuarantineCause.DEAD_STREAM_LOSS)
    if silent_for >= config.dead_after_s:  # silence is silence, connected or not
        return Verdict(node_id, Liveness.DEAD, f"no heartbeat for {silent_for:.1f}s (limit {config.dead_after_s:g}s)",
                       silent_for, _SILENT)
    if liveness is Liveness.ALIVE:
        return Verdict(node_id, Liveness.SUSPECT, "stream closed", silent_for)
    return None
