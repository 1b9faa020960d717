"""One trainer rank of `ftsup bench overhead`: the same training loop without ftsup, at Level 1 and
at Level 2, in interleaved rounds, timing every step.

Run by a real agent (argv of the bench job). Rank 0 trains a stack of square Linear layers of
`--params` parameters with SGD + momentum and measures; the other rank holds a small model and
only keeps its node's agent busy being rank 0's buddy (it snapshots too, so the buddy path is
the real one) until rank 0 is done. Per round, `--steps` steps of each variant:
- baseline: forward, backward, optimizer step; nothing of ftsup;
- level1: + `session.heartbeat()` and `session.report_step(...)` (no digest);
- level2: + `session.snapshot_barrier()` before backward and `session.snapshot(step, model,
  optimizer)` after the optimizer step (a RAM snapshot every step, held by the rank's agent and
  its buddy agent).
Each step's wall time is recorded with its parts (barrier wait, snapshot() call, the optimizer's
wait for the background copy); rounds interleave the variants so the machine's load drifts over
all three alike. The SDC parameter digest (optional at Level 2) is timed apart, after the rounds.
Writes `--out/rank-N.json`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import torch
from torch import nn

from ftsup.trainer.digest import Digester
from ftsup.trainer.session import Session

BATCH = 8
WIDTH = 2048
VARIANTS = ("baseline", "level1", "level2")


def build(params: int, seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    layers = max(1, round(params / (WIDTH * WIDTH)))
    torch.manual_seed(seed)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))
    return model, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)


def run_variant(variant: str, session: Session, model: nn.Module, optimizer: torch.optim.Optimizer,
                batch: torch.Tensor, step: int) -> dict[str, float]:
    """One training step of `variant`; returns its wall time and parts (seconds)."""
    parts = {"barrier_s": 0.0, "snapshot_call_s": 0.0, "capture_wait_s": 0.0}
    waits_before = session.stats.capture_wait_s
    started = time.monotonic()
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    if variant == "level2":
        parts["barrier_s"] = session.snapshot_barrier()
    loss.backward()
    compute_s = time.monotonic() - started - parts["barrier_s"]
    optimizer.step()
    if variant != "baseline":
        session.heartbeat()
        step_s = time.monotonic() - started
        # Each rank trains its own model (no data parallelism): each is its own SDC replica group.
        session.report_step(step, step_s, compute_s, float(loss.item()), "", replica_group=session.rank)
    if variant == "level2":
        mark = time.monotonic()
        session.snapshot(step, model, optimizer)
        parts["snapshot_call_s"] = time.monotonic() - mark
    parts["step_s"] = time.monotonic() - started
    parts["capture_wait_s"] = session.stats.capture_wait_s - waits_before
    return parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftsup.bench._overhead_rank")
    p.add_argument("--params", type=int, required=True, help="rank 0's parameter count")
    p.add_argument("--steps", type=int, required=True, help="steps per variant per round")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per variant before the first round")
    p.add_argument("--out", type=pathlib.Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # ranks share the cores (as the example trainer)
    session = Session.from_env()
    done = args.out / "rank-0.json"
    model, optimizer = build(args.params if session.rank == 0 else WIDTH * WIDTH)
    batch = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))
    step = 0
    samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    if session.rank != 0:  # rank 0's buddy traffic lands on this node's agent; keep a snapshot of ours going
        while not done.exists():
            step += 1
            run_variant("level2", session, model, optimizer, batch, step)
            time.sleep(0.5)
        session.wait_for_snapshots()
        session.finish(step, "")
        session.close()
        return 0
    for variant in VARIANTS:
        for _ in range(args.warmup):
            step += 1
            run_variant(variant, session, model, optimizer, batch, step)
        session.wait_for_snapshots()
    for round_ in range(args.rounds):
        for variant in VARIANTS:
            for _ in range(args.steps):
                step += 1
                samples[variant].append(run_variant(variant, session, model, optimizer, batch, step))
            session.wait_for_snapshots()  # untimed: the next variant starts with nothing in flight
            print(f"round {round_} {variant}: {[round(s['step_s'], 3) for s in samples[variant][-args.steps:]]}",
                  file=sys.stderr, flush=True)
    digest = Digester.of(model)
    digest_s = []
    for _ in range(2):
        mark = time.monotonic()
        digest()
        digest_s.append(time.monotonic() - mark)
    result: dict[str, Any] = {
        "digest_s": digest_s,
        "steps_per_round": args.steps,
        "rank": session.rank,
        "params": sum(p.numel() for p in model.parameters()),
        "state_bytes": sum(p.numel() * p.element_size() for p in model.parameters()) * 2,  # + momentum
        "payload_bytes": session.stats.last_payload_bytes,
        "held_s": session.stats.last_held_s,
        "samples": samples,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.rename(done)
    session.finish(step, "")
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
