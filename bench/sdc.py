"""SDC detection: single-bit flips caught by the cross-replica digest vote, false positives, digest cost.

Four (`--ranks`) data-parallel gloo replicas (torch.multiprocessing) train the example GPT with
DDP and the deterministic gradient sync, computing `trainer.digest` after every optimizer step.
Injected: `--flips` single-bit parameter flips (after the optimizer step, at random steps, ranks,
tensors, elements, and bits drawn from sign, exponent and low mantissa), plus `--grad-flips`
low-mantissa gradient flips before the all-reduce (which every replica then shares: digests can
not see them; reported apart). A parameter flip is undone after its step's digest, as the
supervisor's restore to the snapshot before the flip would, so the run goes on and one run holds
all flips and >= `--clean-steps` clean steps. Every step's digests go through the real pure
policy (`supervisor.core.policies.sdc.vote_step`, through `vote_by_rank`): a flip is detected when a vote names its rank.
`median_steps_to_detect` counts steps from the flip to the vote that names it (0 = the same
step's reports). Overhead: the default example model, digest time over step time (median), with
the old host-side blake2b digest measured in the same run as the baseline.

The recompute check (docs/sdc.md) is measured on the same run: every rank also digests its local
gradients before the all-reduce (`trainer.digest.GradDigester`, as the example trainer reports
them), and rank 0 keeps the state before every gradient-flip step and before `--recompute-checks`
clean steps. Each such step is replayed in this process with `trainer.replay.replay_step` (every
rank, then the update: what a verifier's trainer computes) and judged by the real policy
(`supervisor.core.policies.recompute`): a grad flip counts as detected when the recompute names
its rank, a clean step with any mismatch as a false positive. The replay is deterministic, so a
third node's second opinion repeats it; the confirmation is the policy's `judge` over two
replays. Cost: the replay's compute on the example model (all ranks, and one rank) against one
training step, and the local-gradient digest's share of a step. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ftsup.harness import ports
from ftsup.supervisor.core.events import SdcRankDigests
from ftsup.supervisor.core.policies import recompute
from ftsup.supervisor.core.policies.sdc import SdcConfig, vote_by_rank
from ftsup.trainer import replay
from ftsup.trainer import snapshot as snap
from ftsup.trainer.core import data
from ftsup.trainer.ddp import DeterministicGradSync
from ftsup.trainer.digest import Digester, GradDigester
from ftsup.trainer.examples.gpt import GPT
from ftsup.trainer.sdc_inject import flip_bit_

BIT_CLASSES = {"sign": (31,), "exponent": tuple(range(23, 31)), "low_mantissa": (0, 1, 2, 3)}


@dataclass(frozen=True, slots=True)
class Flip:
    step: int
    rank: int
    target: str  # "param" | "grad"
    tensor: int  # index into named_parameters()
    index: int
    bit: int
    bit_class: str


@dataclass(frozen=True, slots=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    seq_len: int
    batch: int


SMALL = Shape(layers=1, d_model=16, heads=2, seq_len=8, batch=2)
EXAMPLE = Shape(layers=2, d_model=64, heads=4, seq_len=32, batch=8)  # trainer/examples/gpt.py defaults


def plan_flips(rng: random.Random, steps: int, ranks: int, sizes: list[int], flips: int, grad_flips: int) -> list[Flip]:
    chosen = rng.sample(range(2, steps + 1), flips + grad_flips)
    out = []
    for i, step in enumerate(sorted(chosen)):
        target = "param" if i < flips else "grad"
        bit_class = rng.choice(sorted(BIT_CLASSES)) if target == "param" else "low_mantissa"
        tensor = rng.randrange(len(sizes))
        out.append(Flip(step, rng.randrange(ranks), target, tensor, rng.randrange(sizes[tensor]),
                        rng.choice(BIT_CLASSES[bit_class]), bit_class))
    rng.shuffle(out)
    return sorted(out, key=lambda f: f.step)


def build(shape: Shape, device: torch.device) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(data.VOCAB_SIZE, shape.seq_len, shape.layers, shape.d_model, shape.heads).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def worker(rank: int, world: int, port: int, shape: Shape, steps: int, flips: list[Flip], out_dir: str,
           time_digests: bool, keep_before: frozenset[int] = frozenset()) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    device = torch.device("cpu")
    model, optimizer = build(shape, device)
    params = [p for _, p in model.named_parameters()]
    ddp = DistributedDataParallel(model)
    local = _TimedGradDigester(model)
    DeterministicGradSync.attach(ddp, grad_digester=local)
    digest = Digester.of(model)
    mine = {f.step: f for f in flips if f.rank == rank}
    pending: list[Flip] = []
    for index, param in enumerate(params):
        def on_grad(grad: torch.Tensor, index: int = index) -> torch.Tensor | None:
            if pending and pending[0].target == "grad" and pending[0].tensor == index:
                corrupted = grad.clone()
                flip_bit_(corrupted, pending[0].index, pending[0].bit)
                return corrupted
            return None
        param.register_hook(on_grad)
    tokens = torch.tensor(data.encode(data.generate_corpus(0)), dtype=torch.long)
    window = torch.arange(shape.seq_len + 1)
    digests: list[str] = []
    grad_digests: list[str] = []
    grad_digest_s: list[float] = []
    step_s: list[float] = []
    digest_s: list[float] = []
    blake_s: list[float] = []
    for step in range(1, steps + 1):
        pending[:] = [mine[step]] if step in mine else []
        if rank == 0 and step in keep_before:  # the snapshot of step - 1 a verifier would fetch
            payload, _ = snap.encode(snap.build_state(step - 1, model, optimizer))
            with open(os.path.join(out_dir, f"before-{step}.pt"), "wb") as f:
                f.write(payload)
        started = time.perf_counter()
        offsets = data.batch_offsets(0, step, rank, shape.batch, shape.seq_len, len(tokens))
        batch = tokens[torch.tensor(offsets)[:, None] + window]
        logits = ddp(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        stepped = time.perf_counter()
        flip = pending[0] if pending and pending[0].target == "param" else None
        if flip is not None:
            flip_bit_(params[flip.tensor].data, flip.index, flip.bit)
        digests.append(digest())
        digested = time.perf_counter()
        grad_digests.append(local())
        grad_digest_s.append(local.take_s + time.perf_counter() - digested)
        local.take_s = 0.0
        if flip is not None:
            flip_bit_(params[flip.tensor].data, flip.index, flip.bit)  # undone: the restore to before it
        step_s.append(stepped - started)
        digest_s.append(digested - stepped)
        if time_digests:
            before = time.perf_counter()
            _blake2b_digest(model)
            blake_s.append(time.perf_counter() - before)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as report:
        json.dump({"digests": digests, "grad_digests": grad_digests, "step_s": step_s, "digest_s": digest_s,
                   "blake_s": blake_s, "grad_digest_s": grad_digest_s}, report)
    dist.destroy_process_group()


class _TimedGradDigester(GradDigester):
    """Counts the time the sync hook spends copying gradients out (part of the digest's cost)."""

    take_s = 0.0

    def take_bucket(self, bucket: object) -> None:
        started = time.perf_counter()
        super().take_bucket(bucket)
        self.take_s += time.perf_counter() - started


def _blake2b_digest(model: torch.nn.Module) -> str:
    """The previous digest: every parameter's bytes copied to the host and hashed there."""
    h = hashlib.blake2b(digest_size=16)
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def run(world: int, shape: Shape, steps: int, flips: list[Flip], time_digests: bool,
        keep_before: frozenset[int] = frozenset()) -> tuple[list[dict], dict[int, bytes]]:
    """Every rank's digests and timings, and rank 0's state before each step in `keep_before`."""
    with tempfile.TemporaryDirectory() as out_dir:
        port = ports.reserve(1).first  # the rendezvous port, held machine-wide (harness/ports.py)
        mp.spawn(worker, args=(world, port, shape, steps, flips, out_dir, time_digests, keep_before), nprocs=world,
                 join=True)
        results = []
        for rank in range(world):
            with open(os.path.join(out_dir, f"{rank}.json")) as f:
                results.append(json.load(f))
        before = {}
        for step in keep_before:
            with open(os.path.join(out_dir, f"before-{step}.pt"), "rb") as f:
                before[step] = f.read()
        return results, before


def replayer(shape: Shape, world: int) -> Callable[[int, bytes, tuple[int, ...]], tuple[list[SdcRankDigests], float]]:
    """Replays one step from a kept state, as a verifier's trainer does: (digests per rank, seconds)."""
    torch.set_num_threads(1)
    tokens = torch.tensor(data.encode(data.generate_corpus(0)), dtype=torch.long)
    window = torch.arange(shape.seq_len + 1)

    def replay_one(step: int, payload: bytes, ranks: tuple[int, ...]) -> tuple[list[SdcRankDigests], float]:
        model, optimizer = build(shape, torch.device("cpu"))
        state = snap.decode(payload, hashlib.sha256(payload).hexdigest())
        request = replay.ReplayRequest("bench", step, 0, world, ranks, "", "", "")

        def loss_of(rank: int) -> torch.Tensor:
            offsets = data.batch_offsets(0, step, rank, shape.batch, shape.seq_len, len(tokens))
            batch = tokens[torch.tensor(offsets)[:, None] + window]
            logits = model(batch[:, :-1])
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))

        started = time.perf_counter()
        done = replay.replay_step(request, state, model, optimizer, loss_of)
        took = time.perf_counter() - started
        return [SdcRankDigests(r.rank, "verifier", r.grad_digest, r.param_digest) for r in done], took

    return replay_one


def score_recompute(results: list[dict], before: dict[int, bytes], flips: list[Flip], world: int,
                    shape: Shape) -> dict:
    """Replays each kept step and judges it with the real policy (see the module docstring)."""
    replay_one = replayer(shape, world)
    by_step = {f.step: f for f in flips}
    grad_flips = [f for f in flips if f.target == "grad"]
    detected = named = confirmed = false_positives = clean = 0
    for step, payload in sorted(before.items()):
        reported = [SdcRankDigests(r, f"node-{r}", results[r]["grad_digests"][step - 1], results[r]["digests"][step - 1])
                    for r in range(world)]
        first, _ = replay_one(step, payload, tuple(range(world)))
        second, _ = replay_one(step, payload, tuple(range(world)))  # the third node's second opinion
        comparison = recompute.compare(reported, first)
        judgement = recompute.judge(tuple(reported), tuple(first), tuple(second))
        flip = by_step.get(step)
        if flip is not None and flip.target == "grad":
            detected += not comparison.is_match
            named += comparison.culprits == (flip.rank,)
            confirmed += judgement.outcome is recompute.Outcome.CONVICTED and comparison.culprits == (flip.rank,)
        elif flip is None:
            clean += 1
            false_positives += not comparison.is_match
    return {
        "grad_flips_detected_fraction": detected / len(grad_flips) if grad_flips else None,
        "grad_flip_culprit_correct_fraction": named / len(grad_flips) if grad_flips else None,
        "grad_flips_confirmed_fraction": confirmed / len(grad_flips) if grad_flips else None,
        "recompute_clean_checks": clean,
        "recompute_false_positives": false_positives,
    }


def recompute_cost(world: int, steps: int) -> dict:
    """The replay's compute on the example model against a training step (same process, one thread)."""
    results, before = run(world, EXAMPLE, steps, [], time_digests=False, keep_before=frozenset({steps}))
    replay_one = replayer(EXAMPLE, world)
    full = statistics.median(replay_one(steps, before[steps], tuple(range(world)))[1] for _ in range(3))
    one = statistics.median(replay_one(steps, before[steps], (0,))[1] for _ in range(3))
    step = statistics.median(s for r in results for s in r["step_s"][2:])
    grad_digest = statistics.median(s for r in results for s in r["grad_digest_s"][2:])
    return {
        "recompute_full_step_ms": full * 1e3,
        "recompute_one_rank_ms": one * 1e3,
        "recompute_full_step_cost_steps": full / step,
        "grad_digest_ms": grad_digest * 1e3,
        "grad_digest_overhead_fraction": grad_digest / step,
    }


def score(results: list[dict], flips: list[Flip], world: int) -> dict:
    config = SdcConfig()
    by_step = {f.step: f for f in flips}
    steps = len(results[0]["digests"])
    detected: list[int] = []
    culprit_ok = 0
    grad_seen = 0
    false_positives = 0
    clean_steps = 0
    for step in range(1, steps + 1):
        vote = vote_by_rank(step, {r: results[r]["digests"][step - 1] for r in range(world)}, world, config)
        flip = by_step.get(step)
        if flip is None or flip.target == "grad":
            clean_steps += flip is None
            if vote.is_diverged:
                if flip is None:
                    false_positives += 1
                else:
                    grad_seen += 1
            continue
        if vote.is_diverged:
            detected.append(0)  # the vote of the flip's own step
            culprit_ok += [m.rank for m in vote.minorities] == [flip.rank]
    param_flips = [f for f in flips if f.target == "param"]
    by_class = {c: sum(1 for f in param_flips if f.bit_class == c) for c in BIT_CLASSES}
    return {
        "detected_fraction": len(detected) / len(param_flips) if param_flips else None,
        "median_steps_to_detect": statistics.median(detected) if detected else None,
        "culprit_correct_fraction": culprit_ok / len(param_flips) if param_flips else None,
        "false_positives": false_positives,
        "param_flips": len(param_flips),
        "param_flips_by_bit_class": by_class,
        "param_flips_detected": len(detected),
        "grad_flips": len(flips) - len(param_flips),
        "grad_flips_seen_by_digest": grad_seen,
        "clean_steps": clean_steps,
        "steps": steps,
    }


def overhead(results: list[dict]) -> dict:
    step = statistics.median(s for r in results for s in r["step_s"][2:])
    digest = statistics.median(s for r in results for s in r["digest_s"][2:])
    blake = statistics.median(s for r in results for s in r["blake_s"][2:])
    return {
        "overhead_fraction": digest / step,
        "step_ms": step * 1e3,
        "digest_ms": digest * 1e3,
        "baseline_blake2b_host_ms": blake * 1e3,
        "baseline_blake2b_overhead_fraction": blake / step,
    }


def cuda_overhead(steps: int) -> dict:
    """The example model on one GPU (when there is one): digest time over step time, both synced."""
    if not torch.cuda.is_available():
        return {}
    device = torch.device("cuda")
    model, optimizer = build(EXAMPLE, device)
    digest = Digester.of(model)
    tokens = torch.tensor(data.encode(data.generate_corpus(0)), dtype=torch.long)
    window = torch.arange(EXAMPLE.seq_len + 1)
    step_s, digest_s, blake_s = [], [], []
    for step in range(1, steps + 1):
        offsets = data.batch_offsets(0, step, 0, EXAMPLE.batch, EXAMPLE.seq_len, len(tokens))
        batch = tokens[torch.tensor(offsets)[:, None] + window].to(device)
        torch.cuda.synchronize()
        started = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        stepped = time.perf_counter()
        digest()  # ends with its device-to-host copy: synchronized
        digested = time.perf_counter()
        _blake2b_digest(model)
        step_s.append(stepped - started)
        digest_s.append(digested - stepped)
        blake_s.append(time.perf_counter() - digested)
    step_time, dig, blake = (statistics.median(x[5:]) for x in (step_s, digest_s, blake_s))
    return {"cuda_overhead_fraction": dig / step_time, "cuda_step_ms": step_time * 1e3, "cuda_digest_ms": dig * 1e3,
            "cuda_baseline_blake2b_overhead_fraction": blake / step_time, "cuda_device": torch.cuda.get_device_name()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ftsup bench sdc", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="accepted for symmetry: the output is always JSON")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--flips", type=int, default=50)
    p.add_argument("--grad-flips", type=int, default=10)
    p.add_argument("--clean-steps", type=int, default=10_000)
    p.add_argument("--overhead-steps", type=int, default=60)
    p.add_argument("--recompute-checks", type=int, default=50,
                   help="clean steps also replayed by the recompute check (its false positives)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.ranks < 3:
        p.error(f"--ranks must be >= 3 for a majority, got {args.ranks}")
    started = time.monotonic()
    world = args.ranks
    model, _ = build(SMALL, torch.device("cpu"))
    sizes = [t.numel() for _, t in model.named_parameters()]
    steps = args.clean_steps + args.flips + args.grad_flips
    flips = plan_flips(random.Random(args.seed), steps, world, sizes, args.flips, args.grad_flips)
    flip_steps = {f.step for f in flips}
    clean = random.Random(args.seed + 1).sample([s for s in range(2, steps + 1) if s not in flip_steps],
                                                min(args.recompute_checks, steps - len(flip_steps) - 1))
    keep = frozenset({f.step for f in flips if f.target == "grad"} | set(clean))
    results, before = run(world, SMALL, steps, flips, time_digests=False, keep_before=keep)
    detection = score(results, flips, world)
    checks = score_recompute(results, before, flips, world, SMALL)
    cost = overhead(run(world, EXAMPLE, args.overhead_steps, [], time_digests=True)[0])
    result = {
        **detection,
        **checks,
        **cost,
        **recompute_cost(world, args.overhead_steps),
        **cuda_overhead(args.overhead_steps),
        "ranks": world,
        "detection_model_params": sum(sizes),
        "overhead_model_params": sum(t.numel() for t in build(EXAMPLE, torch.device("cpu"))[0].parameters()),
        "device": "cpu (gloo)",
        "flips": [asdict(f) for f in flips[:3]],
        "wall_s": time.monotonic() - started,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
