"""What a RAM snapshot commit costs the leader's loop: a SnapshotRetain to each node against a whole
directive to each, in one run.

A job that snapshots every step commits every step, and each commit moves every node's retain
floor (`Directive.retain_from_step`). Before 2026-11-28 the leader then pushed the whole directive
to every node: at 12,500 nodes the generation start's push (~0.8 s of CPU) once a step. Now an
agent whose Hello says `takes_snapshot_retain` gets one short SnapshotRetain and an older agent the
directive (Runtime._say_retained). This bench runs the real Runtime on an in-memory log with N
in-process streams (outboxes that keep what they are given), starts a generation of N nodes x 8
ranks, and commits steps through the real inputs (every node's step aggregate, its own holdings
and its buddy's copies); the commits alternate between the fleet taking notices and the fleet as
older agents (the baseline). Timed (time.process_time): the runtime's answer to each commit (the
notices, or the directives built, encoded and queued), not the commit's decision. Also: what
each node is sent per commit (messages, bytes).

    ftsup bench commit-push --json                  # 12,500 nodes
    ftsup bench commit-push --nodes 1000 --repeats 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from ftsup.bench import _runtime_fleet
from ftsup.common import logs
from ftsup.supervisor.core.events import SnapshotCommitted
from ftsup.supervisor.core.inputs import SnapshotHoldings, StepAggregate, StepReport
from ftsup.supervisor.outbox import StreamOutbox
from ftsup.supervisor.runtime import Runtime
from ftsup.v1 import agent_pb2


class _Kept(StreamOutbox):
    """An agent stream's outbox that keeps what the leader queues (no transport, no bound)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[agent_pb2.SupervisorMessage] = []

    def put(self, message: agent_pb2.SupervisorMessage) -> bool:
        self.messages.append(message)
        return True


async def _commit(runtime: Runtime, step: int) -> None:
    """Every node's step aggregate, then its own holdings and its buddy's copies, until `step` commits."""
    generation = runtime.state.generation
    assert generation is not None
    copies: dict[str, list[int]] = {}
    for member in generation.members:
        copies.setdefault(member.buddy_node_id, []).extend(member.ranks)
    replies = [runtime.submit(StepAggregate.of_reports([StepReport(m.node_id, generation.number, r, step, 1.0, 0.9,
                                                                   2.0, f"{step:032x}") for r in m.ranks]))
               for m in generation.members]
    for member in generation.members:
        for ranks in (member.ranks, copies.get(member.node_id, [])):
            if ranks:
                replies.append(runtime.submit(SnapshotHoldings(member.node_id, generation.number, step, tuple(ranks),
                                                               (1 << 30,) * len(ranks),
                                                               tuple(f"{r:064x}" for r in ranks))))
    outcomes = await asyncio.gather(*replies)
    refused = [o.refusal for o in outcomes if o.refusal is not None]
    if refused or runtime.state.snapshot is None or runtime.state.snapshot.step != step:
        raise RuntimeError(f"step {step} did not commit: {refused[:3]}")


async def _run(nodes: int, ranks_per_node: int, repeats: int) -> dict[str, Any]:
    outboxes = [_Kept() for _ in range(nodes)]
    runtime, loop = await _runtime_fleet.start(outboxes, ranks_per_node, takes_snapshot_retain=True)
    try:
        answers: dict[str, list[float]] = {"notices": [], "directives": []}
        sent: dict[str, list[tuple[int, int]]] = {"notices": [], "directives": []}
        said = runtime._say_retained
        mode = "notices"

        def timed(committed: SnapshotCommitted, named: Any) -> None:
            before = [len(o.messages) for o in outboxes]
            started = time.process_time()
            said(committed, named)
            answers[mode].append(time.process_time() - started)
            new = [m for o, b in zip(outboxes, before) for m in o.messages[b:]]
            sent[mode].append((len(new), sum(m.ByteSize() for m in new)))

        runtime._say_retained = timed  # type: ignore[method-assign]
        every_node = set(runtime._takes_retain)
        for step in range(1, 2 * repeats + 1):
            mode = "notices" if step % 2 else "directives"
            runtime._takes_retain = set(every_node) if mode == "notices" else set()
            await _commit(runtime, step)
            for outbox in outboxes:
                outbox.messages.clear()
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)

    def summary(mode: str) -> dict[str, Any]:
        messages, size = sent[mode][-1]
        return {"median_cpu_s": round(statistics.median(answers[mode]), 4),
                "samples_s": [round(s, 4) for s in answers[mode]],
                "messages_per_commit": messages, "bytes_per_commit": size}

    notices, directives = summary("notices"), summary("directives")
    return {"nodes": nodes, "ranks": nodes * ranks_per_node, "commits": len(answers["notices"]) + len(
        answers["directives"]), "notices": notices, "baseline_directives": directives,
            "speedup": round(directives["median_cpu_s"] / max(notices["median_cpu_s"], 1e-9), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ftsup bench commit-push", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    p.add_argument("--nodes", type=int, default=12_500)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="commits of each kind (they alternate)")
    args = p.parse_args(argv)
    logs.configure(level="warning")  # stderr: stdout is the one JSON object
    result = asyncio.run(_run(args.nodes, args.ranks_per_node, args.repeats))
    print(json.dumps({"what": "the leader's answer to a RAM snapshot commit: SnapshotRetain notices against"
                              " whole directives (older agents), CPU of the runtime's push", **result}))
    return 0
