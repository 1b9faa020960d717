"""One trainer rank of `ftsup bench snapshot`: trains a large MLP and times its Session snapshots.

Run by a real agent (argv of the bench job). Rank 0 holds `--state-mb`, the other ranks
`--peer-state-mb` (they only have to hand off their own snapshots for a step to commit). Each rank takes `--snapshots` snapshots with the
copy on the training thread (`background_capture` off: the old path) and as many with the copy in
the background, one training step after each, and writes its timings as JSON to
`--out/rank-N.json`. The model and its AdamW state are built by `build_state_model`, which the
bench also calls for its torch.save baseline, so both measure the same bytes. With `--device cuda`
the state lives on the GPU (every rank on device 0: no collective runs, so ranks may share it) and
each training step ends with a device synchronize, so a snapshot never absorbs queued compute.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch
from torch import nn

from ftsup.trainer.session import Session

BATCH = 8


def build_state_model(state_mb: float, seed: int = 0,
                      device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer, int]:
    """A stack of square Linear layers whose weights + AdamW moments come to about `state_mb` MB.

    Returns the model (on `device`), its optimizer after one step (so the moments exist) and the width.
    """
    width = 2048 if state_mb >= 100 else 512
    # params + exp_avg + exp_avg_sq, float32: 12 bytes per parameter
    layers = max(1, round(state_mb * 1e6 / (12 * width * width)))
    torch.manual_seed(seed)
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers))).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, optimizer, width)
    return model, optimizer, width


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, width: int) -> float:
    started = time.monotonic()
    device = next(model.parameters()).device
    batch = torch.ones(BATCH, width, device=device)
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the step's time, not its launch's
    return time.monotonic() - started


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for per_param in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in per_param.values() if isinstance(v, torch.Tensor))
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ftsup.bench._snapshot_rank")
    p.add_argument("--state-mb", type=float, required=True, help="rank 0's model + AdamW state")
    p.add_argument("--peer-state-mb", type=float, required=True, help="the other ranks' state")
    p.add_argument("--snapshots", type=int, required=True, help="per mode")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the state lives (default cpu)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as the example trainer: ranks share the cores
    session = Session.from_env()
    model, optimizer, width = build_state_model(args.state_mb if session.rank == 0 else args.peer_state_mb,
                                                device=args.device)
    step = 1
    session.report_step(step, 0.0, 0.0, 0.0, "")
    samples = []
    for mode in ("sync", "background"):
        session.background_capture = mode == "background"
        for _ in range(args.snapshots):
            session.wait_for_snapshots()  # the interval is longer than the hand-off: no back-pressure
            waits_before = session.stats.capture_wait_s
            called_at = time.time()
            started = time.monotonic()
            session.snapshot(step, model, optimizer)
            call_s = time.monotonic() - started
            step_s = train_step(model, optimizer, width)  # the next step: its optimizer waits for the copy
            step += 1
            session.report_step(step, step_s, step_s, 0.0, "")
            session.wait_for_snapshots()
            samples.append({
                "mode": mode,
                "step": step - 1,
                "called_at_unix_s": called_at,
                "snapshot_call_s": call_s,
                "optimizer_wait_s": session.stats.capture_wait_s - waits_before,
                "copy_s": session.stats.last_copy_s,
                "held_s": session.stats.last_held_s,
                "next_step_s": step_s,
            })
            print(f"snapshot {mode} step {step - 1}: {samples[-1]}", file=sys.stderr, flush=True)
    result = {
        "rank": session.rank,
        "device": str(next(model.parameters()).device),
        "state_bytes": state_bytes(model, optimizer),
        "payload_bytes": session.stats.last_payload_bytes,
        "host_buffer_bytes": session.stats.host_buffer_bytes,
        "samples": samples,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{session.rank}.json").write_text(json.dumps(result))
    session.finish(step, "")
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
