"""Example: a small GPT-style character model trained with DDP under an ftsup Session.

Run by the agent as every rank of a job: `python -m ftsup.trainer.examples.gpt --steps N`. Reads the
launch environment through `Session`, restores from the agent's snapshot when told to, reports
every step (loss, step and compute time, parameter digest), hands off a snapshot every
`--snapshot-every` steps and reports completion with the final digest. Bit-exact restarts rest
on deterministic data (`trainer.core.data`) and layout-independent gradient averaging
(`trainer.ddp`). The --crash-* flags make one rank die after a step, and the --sdc-flip-* flags
flip one bit on one rank (trainer/sdc_inject.py), for fault-injection tests. Started with
FTSUP_SDC_REPLAY (by a verifier's agent), it trains nothing: it replays one step of a snapshot
for an SDC recompute check (trainer/replay.py) and exits.
"""

from __future__ import annotations

import time

_STARTED = time.monotonic()  # restart cost is mostly start-up: measure its phases

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from ftsup.trainer import offline, replay, sdc_inject  # noqa: E402
from ftsup.trainer.core import data  # noqa: E402
from ftsup.trainer.ddp import ComputeClock, DeterministicGradSync  # noqa: E402
from ftsup.trainer.digest import Digester, GradDigester, param_digest  # noqa: E402
from ftsup.trainer.session import Session  # noqa: E402

_IMPORTED = time.monotonic()

CRASH_EXIT_CODE = 17


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
        future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer over characters; no dropout (determinism needs no RNG here)."""

    def __init__(self, vocab: int, max_len: int, layers: int, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by heads ({heads})")
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.size(1), device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ftsup.trainer.examples.gpt", description=__doc__)
    p.add_argument("--steps", type=int, required=True, help="total optimizer steps of the job")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--snapshot-every", type=_snapshot_every, default=1,
                   help="a RAM snapshot every N steps (0: none; 1, the default here: every step, at most one step"
                        " lost), or 'auto': the session's cadence (FTSUP_SNAPSHOT_EVERY_STEPS /"
                        " FTSUP_SNAPSHOT_INTERVAL_S; by default about one second of training between snapshots)")
    p.add_argument(
        "--grad-sync",
        choices=("deterministic", "allreduce"),
        default="deterministic",
        help="deterministic: the layout-independent comm hook, restarts bit-exact (each rank receives world x"
             " gradient bytes); allreduce: DDP's own all-reduce, no comm hook, restarts correct within float"
             " tolerance but not bit-exact (compute time from section timing)",
    )
    p.add_argument("--slow-rank", type=int, default=None, help="fault injection: this rank computes slower")
    p.add_argument("--slow-ms", type=float, default=50.0, help="extra compute time of --slow-rank per step")
    p.add_argument("--slow-generation", type=int, default=1,
                   help="...only in this generation (its node); 0: in every generation")
    p.add_argument("--crash-at-step", type=int, default=None)
    p.add_argument("--crash-rank", type=int, default=0)
    p.add_argument("--crash-generation", type=int, default=1)
    sdc_inject.add_flags(p.add_argument)
    # Object-store checkpoints are configured by the supervisor (FTSUP_CHECKPOINT_*); these bound
    # how long this rank's checkpoint write may take before it fails and the attempt is aborted.
    p.add_argument("--checkpoint-read-timeout-s", type=float, default=None,
                   help="object-store checkpoints: longest wait for one S3 answer before retrying (default 60)")
    p.add_argument("--checkpoint-retry-deadline-s", type=float, default=None,
                   help="object-store checkpoints: how long one store operation keeps retrying before this"
                        " rank's write fails and the supervisor aborts the attempt (default 120)")
    p.add_argument("--rejoin", action=argparse.BooleanOptionalAction, default=False,
                   help="ftsup's in-process fast path: when the process group breaks (a peer died), wait for the"
                        " next generation and join it in-process instead of exiting (default off: with gloo only"
                        " ranks that see the death take it; NCCL's abort wakes the rest)")
    p.add_argument("--offline", action="store_true",
                   help="run without an agent (torchrun-style env only) and print the final digest: a reference run")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "seq_len", "layers", "d_model", "heads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("checkpoint_read_timeout_s", "checkpoint_retry_deadline_s"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    return args


AUTO = None  # --snapshot-every auto: the session decides (Session.snapshot_due)


def _snapshot_every(raw: str) -> int | None:
    if raw == "auto":
        return AUTO
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a step count >= 0 or 'auto', got {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a step count >= 0 or 'auto', got {value}")
    return value


def _is_snapshot_step(args: argparse.Namespace, session: Session, step: int) -> bool:
    """Every --snapshot-every steps, or the session's cadence (collective at its snapshot steps)."""
    if args.snapshot_every is AUTO:
        return session.snapshot_due(step)
    return bool(args.snapshot_every) and step % args.snapshot_every == 0


def _abort_process_group() -> None:
    """Abort the default process group. From the session's watch thread when the agent replaced
    this generation (with NCCL that fails a collective this rank is blocked in), and when this
    rank leaves a broken group."""
    from torch.distributed import distributed_c10d

    abort = getattr(distributed_c10d, "_abort_process_group", None)
    if abort is None or not dist.is_initialized():
        return
    try:
        abort()
    except Exception as exc:
        print(f"abort of the replaced generation's process group: {exc}", file=sys.stderr, flush=True)


def _leave_process_group() -> None:
    """Abort the broken group, then forget it. Aborting closes this rank's connections at once,
    which fails the peers still blocked on it (with gloo only a dead rank's direct neighbours see
    the death): every rank of the group gets out sooner than at the timeout. A failure here
    changes nothing (the group is broken anyway)."""
    _abort_process_group()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:
            print(f"destroy of the broken process group: {exc}", file=sys.stderr, flush=True)


def build(args: argparse.Namespace, device: torch.device) -> tuple[torch.Tensor, GPT, torch.optim.Optimizer]:
    """The corpus, the model (same initial parameters on every rank) and its optimizer."""
    tokens = torch.tensor(data.encode(data.generate_corpus(args.seed)), dtype=torch.long)
    torch.manual_seed(args.seed)
    model = GPT(data.VOCAB_SIZE, args.seq_len, args.layers, args.d_model, args.heads).to(device)
    return tokens, model, torch.optim.AdamW(model.parameters(), lr=args.lr)


def batch_of(args: argparse.Namespace, tokens: torch.Tensor, step: int, rank: int, device: torch.device) -> torch.Tensor:
    """Rank `rank`'s sequences of step `step` (inputs and targets): a pure function of both."""
    offsets = data.batch_offsets(args.seed, step, rank, args.batch_size, args.seq_len, len(tokens))
    window = torch.arange(args.seq_len + 1)
    return tokens[torch.tensor(offsets)[:, None] + window].to(device)


def loss_on(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


def replay_main(args: argparse.Namespace, request: replay.ReplayRequest) -> int:
    """SDC recompute: step `request.step` of the asked ranks from the snapshot of the step before."""
    started = time.monotonic()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # as in training: the reduction order of the CPU kernels
    tokens, model, optimizer = build(args, device)
    state = request.load()

    def loss_of(rank: int) -> torch.Tensor:
        batch = batch_of(args, tokens, request.step, rank, device)
        return loss_on(model(batch[:, :-1]), batch)

    replayed = replay.replay_step(request, state, model, optimizer, loss_of)
    replay.write_result(request, replayed, started)
    print(f"replayed step {request.step} of rank(s) {list(request.ranks)}: "
          + " ".join(f"{r.rank}:{r.grad_digest[:12]}" for r in replayed), file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    request = replay.ReplayRequest.from_env()
    if request is not None:
        return replay_main(args, request)
    session = offline.offline_session(os.environ) if args.offline else Session.from_env()
    if args.checkpoint_read_timeout_s is not None or args.checkpoint_retry_deadline_s is not None:
        session.checkpoints = dataclasses.replace(session.checkpoints, read_timeout_s=args.checkpoint_read_timeout_s,
                                                  retry_deadline_s=args.checkpoint_retry_deadline_s)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        device = torch.device("cuda", session.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # many ranks share few cores; also fixes the reduction order
    phases = {"import_s": _IMPORTED - _STARTED}
    mark = time.monotonic()
    dist.init_process_group(
        "nccl" if use_cuda else "gloo", rank=session.rank, world_size=session.world_size
    )
    phases["process_group_s"], mark = time.monotonic() - mark, time.monotonic()

    tokens, model, optimizer = build(args, device)
    phases["model_s"], mark = time.monotonic() - mark, time.monotonic()
    if args.rejoin and not args.offline:
        session.on_generation_replaced(_abort_process_group)
    grad_sync: DeterministicGradSync | ComputeClock | None = None
    ddp: DistributedDataParallel | None = None
    cadence = 0  # the session's snapshot cadence last printed (--snapshot-every auto)
    while True:  # once, unless this rank rejoins a new generation in-process (the fast path)
        try:
            done = session.restore(model, optimizer)
            phases["restore_s"], mark = time.monotonic() - mark, time.monotonic()
            if done > args.steps:
                raise SystemExit(f"restored step {done} is past --steps {args.steps}")
            ddp = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)
            local_grads = GradDigester(model)  # this rank's gradients before the sync: for SDC recomputes
            grad_sync = (
                DeterministicGradSync.attach(ddp, grad_digester=local_grads) if args.grad_sync == "deterministic"
                else ComputeClock.attach(ddp, grad_digester=local_grads))
            digest = Digester.of(model)  # after restore: planned once, recomputed on the device each step
            injector = sdc_inject.Injector(sdc_inject.from_flags(args), session.rank, session.generation, model)
            phases["ddp_s"] = time.monotonic() - mark

            for step in range(done + 1, args.steps + 1):
                started = time.monotonic()
                grad_sync.reset()
                # The local gradients serve only an SDC recompute, which replays a step from the
                # snapshot of the step before: copy and digest them for such steps only.
                wants_grads = session.wants_grad_digest(step)
                grad_sync.grad_digester = local_grads if wants_grads else None
                injector.begin_step(step)
                optimizer.zero_grad(set_to_none=True)
                # Micro-batches: one per full-world rank this rank stands in for (one unless an elastic
                # job runs shrunk); gradients add up locally and are synchronised with the last one.
                micro = session.accumulation
                loss = torch.zeros((), device=device)
                waited_s = 0.0
                tokens_done = 0
                for index, data_rank in enumerate(session.data_ranks):
                    batch = batch_of(args, tokens, step, data_rank, device)
                    last = index == micro - 1
                    with contextlib.nullcontext() if last else ddp.no_sync():
                        logits = ddp(batch[:, :-1])
                        if args.slow_rank == session.rank and args.slow_generation in (0, session.generation):
                            time.sleep(args.slow_ms / 1000)  # fault injection: a slow GPU, inside the compute phase
                        part = loss_on(logits, batch) if micro == 1 else loss_on(logits, batch) / micro
                        if last:
                            # Step S-1's snapshot must be held twice before this step's gradient sync
                            # completes: a failure then loses at most one step. Waiting is not compute.
                            waited_s = session.snapshot_barrier()
                        part.backward()
                    loss = loss + part.detach()
                    tokens_done += batch.size(0) * (batch.size(1) - 1)
                # The averaged gradients' norm, for the metrics users watch (spikes precede divergence).
                grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
                optimizer.step()
                injector.after_optimizer_step(step)  # fault injection: a flipped parameter bit
                if use_cuda:
                    torch.cuda.synchronize(device)
                ended = time.monotonic()
                ready = grad_sync.last_ready_s if grad_sync.last_ready_s is not None else ended
                loss_value = loss.item()
                compute_s = max(0.0, ready - started - waited_s)
                session.report_step(step, ended - started, compute_s, loss_value, digest(),
                                    grad_norm=float(grad_norm), tokens=tokens_done,
                                    local_grad_digest=local_grads() if wants_grads else "")
                if session.checkpoint_due(step):  # object-store checkpoint (FTSUP_CHECKPOINT_*), synchronous
                    session.save_checkpoint(step, model, optimizer)
                if _is_snapshot_step(args, session, step):
                    session.snapshot(step, model, optimizer)
                    if session.rank == 0 and args.snapshot_every is AUTO and session.snapshot_every != cadence:
                        cadence = session.snapshot_every
                        print(f"snapshot cadence: every {cadence} step(s) from step {step}", file=sys.stderr, flush=True)
                if step == done + 1:
                    phases["first_step_s"] = time.monotonic() - started
                    timings = " ".join(f"{k}={v:.2f}" for k, v in phases.items())
                    print(f"rank {session.rank} start-up: {timings}", file=sys.stderr, flush=True)
                if session.rank == 0:
                    print(
                        f"step {step} loss {loss_value:.4f} world {session.world_size} t {time.time():.4f}"
                        f" step_ms {(ended - started) * 1e3:.1f}",
                        file=sys.stderr,
                        flush=True,
                    )
                if (
                    step == args.crash_at_step
                    and session.rank == args.crash_rank
                    and session.generation == args.crash_generation
                ):
                    os._exit(CRASH_EXIT_CODE)  # fault injection: die without cleanup, like a real crash
            break
        except RuntimeError as exc:  # gloo/NCCL: a peer is gone; or the agent refused the old generation
            if args.offline or not args.rejoin:
                raise
            broken = str(exc).splitlines()[0][:300]
        # Out of the except block: its traceback held the old DDP and, through it, the process
        # group. Dropping them closes this rank's connections, which fails the peers still blocked
        # waiting on it (only a dead rank's direct neighbours see the death), so every rank of the
        # broken group reaches this point within moments.
        print(f"rank {session.rank} generation {session.generation}: the process group broke ({broken});"
              " asking the agent for the next generation", file=sys.stderr, flush=True)
        if isinstance(grad_sync, ComputeClock):
            grad_sync.remove()
        ddp = grad_sync = None
        _leave_process_group()
        gc.collect()
        if not session.rejoin():
            raise SystemExit(f"rank {session.rank}: the process group broke ({broken}) and no new generation came")
        mark = time.monotonic()
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=session.rank, world_size=session.world_size)
        print(f"rank {session.rank} rejoined as generation {session.generation} (world {session.world_size})"
              f" in-process; process group in {time.monotonic() - mark:.2f}s", file=sys.stderr, flush=True)

    final_digest = param_digest(model)
    session.finish(args.steps, final_digest)
    if args.offline and session.rank == 0:
        print(f"final digest {final_digest}", flush=True)
    session.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
