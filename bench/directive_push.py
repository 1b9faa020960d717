"""The leader's directive push at a generation start: every node's directive built and encoded.

When a generation starts the leader tells every node what to run (`Runtime._push_directives`):
12,500 directives with 100,000 rank restores at 100k GPUs, built and encoded in one turn of its
loop, with no heartbeat read meanwhile (issue 14: the generation-start stall). This bench builds
a core whose generation of N nodes x 8 ranks has started and times (time.process_time) what the
push does before anything is sent: `directives_for` over every node, then the encoding as the
runtime does it (`codec.DirectiveEncoder`: each directive against the last of its action, only
differing fields set again). The baseline, in the same run and alternating with it, is each
directive encoded alone (`codec.directive_to_proto`); both must give equal messages (checked:
`same_messages`).

Also timed: a push to one node (a Hello, a verdict's neighbours), with what the directives read
of the generation kept from an earlier push (`directives._plan`, kept on the generation) and, as
its baseline, worked out again as every push did before (the kept plan dropped first).

    ftsup bench directive-push --json                  # 1,250 and 12,500 nodes
    ftsup bench directive-push --nodes 12500 --repeats 9 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from ftsup.bench.arguments import int_list
from ftsup.bench.core_step import _core
from ftsup.supervisor import codec
from ftsup.supervisor.core.directives import directives_for
from ftsup.v1 import agent_pb2


def run_size(nodes: int, ranks_per_node: int, repeats: int) -> dict[str, Any]:
    core = _core(nodes, ranks_per_node)
    state, job = core.state, core.config.job
    node_ids = list(state.nodes)
    build_s: list[float] = []
    template_s: list[float] = []
    alone_s: list[float] = []
    same = True
    for _ in range(repeats):
        started = time.process_time()
        directives = directives_for(state, job, node_ids, core.waiting_reason)
        build_s.append(time.process_time() - started)
        started = time.process_time()
        encoder = codec.DirectiveEncoder()
        templated = [agent_pb2.SupervisorMessage(directive=encoder.encode(d)) for d in directives]
        template_s.append(time.process_time() - started)
        started = time.process_time()
        alone = [agent_pb2.SupervisorMessage(directive=codec.directive_to_proto(d)) for d in directives]
        alone_s.append(time.process_time() - started)
        same = same and templated == alone
    build, template, baseline = (statistics.median(s) for s in (build_s, template_s, alone_s))
    one_s: list[float] = []
    cold_s: list[float] = []
    generation = state.generation
    assert generation is not None
    for index in range(repeats):
        target = [node_ids[index * 7919 % len(node_ids)]]
        generation._directing.clear()  # (the baseline: nothing kept, as before the plan)
        started = time.process_time()
        directives_for(state, job, target, core.waiting_reason)
        cold_s.append(time.process_time() - started)
        started = time.process_time()
        directives_for(state, job, target, core.waiting_reason)
        one_s.append(time.process_time() - started)
    return {
        "nodes": nodes, "ranks": nodes * ranks_per_node, "repeats": repeats,
        "build_s": round(build, 4), "build_range_s": [round(min(build_s), 4), round(max(build_s), 4)],
        "encode_s": round(template, 4), "encode_range_s": [round(min(template_s), 4), round(max(template_s), 4)],
        "baseline_encode_s": round(baseline, 4),
        "baseline_encode_range_s": [round(min(alone_s), 4), round(max(alone_s), 4)],
        "push_s": round(build + template, 4),
        "us_per_node": round((build + template) / nodes * 1e6, 1),
        "encode_speedup": round(baseline / template, 2) if template else None,
        "one_node_push_s": round(statistics.median(one_s), 6),
        "baseline_one_node_push_s": round(statistics.median(cold_s), 6),
        "same_messages": same,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup bench directive-push", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int_list(1, 100_000), default="1250,12500", help="comma-separated fleet sizes")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="pushes timed per size (medians reported)")
    p.add_argument("--json", action="store_true", help="(the output is always one JSON object)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not 1 <= args.ranks_per_node <= 64 or not 1 <= args.repeats <= 100:
        parser().error("--ranks-per-node within [1, 64]; --repeats within [1, 100]")
    runs = [run_size(n, args.ranks_per_node, args.repeats) for n in args.nodes]
    print(json.dumps({"bench": "directive_push",
                      "baseline": "each directive encoded alone (codec.directive_to_proto), same run, alternating;"
                                  " a one-node push with the generation's plan worked out again",
                      "runs": runs}))
    return 0 if all(r["same_messages"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
