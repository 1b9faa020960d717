"""The CUDA and NCCL paths, on a real GPU: skipped where torch sees none (CI has no GPU).

What only a GPU exercises: digests reduced on the device (must equal the CPU digest of the same
bits), a snapshot's device-to-host copy into pinned buffers on a side stream (must see the state
at the point of the `snapshot()` call, whatever the training stream still had queued, and must
land before `optimizer.step()` changes it), FSDP2 over NCCL restored from a RAM snapshot bit for
bit, and the example trainer under `ftsup run` on NCCL resuming from its node's RAM. One GPU is
enough: every process group here has one rank (NCCL refuses two ranks on one device).
scripts/gpu_check.sh runs this module and the GPU benches on a GPU machine.
"""

from __future__ import annotations

import json
import pathlib
import threading

import pytest
import torch

from ftsup.trainer import snapshot as snap
from ftsup.trainer.digest import Digester
from ftsup.trainer.handoff import Handoff
from ftsup.v1 import peer_pb2
from tests.integration import test_ftsup_run as run_helpers
from tests.integration import test_state_fsdp as fsdp

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU paths run on a GPU machine"),
]

GPU = torch.device("cuda", 0)


def digest_cases() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(11)
    return [
        ("f32", torch.randn(1000, generator=gen)),
        ("bf16", torch.randn(33, 7, generator=gen).to(torch.bfloat16)),
        ("f16", torch.randn(257, generator=gen).to(torch.float16)),
        ("f64", torch.randn(9, 5, generator=gen, dtype=torch.float64)),
        ("i64", torch.randint(-(2**62), 2**62, (77,), generator=gen)),
        ("transposed", torch.randn(40, 24, generator=gen).t()),  # non-contiguous
    ]


def test_the_gpu_digest_equals_the_cpu_digest_and_sees_every_flipped_bit() -> None:
    on_cpu = digest_cases()
    on_gpu = [(name, tensor.to(GPU)) for name, tensor in on_cpu]
    digest = Digester(on_gpu)
    clean = digest()
    assert clean == Digester(on_cpu)()  # reduced on the device, the same 16 bytes as on the host
    words = {"f32": (on_gpu[0][1], torch.int32, 32), "bf16": (on_gpu[1][1], torch.int16, 16)}
    for name, (tensor, as_int, bits) in words.items():
        raw = tensor.view(as_int).view(-1)
        for bit in range(bits):
            flip = torch.tensor(1 << bit, dtype=torch.int64).to(as_int).to(GPU)  # wraps: the sign bit
            raw[5] ^= flip
            assert digest() != clean, (name, bit)
            raw[5] ^= flip
        assert digest() == clean, name


def big_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """~200 MB of parameters + AdamW moments on the GPU: a copy that takes visible time."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(2048, 2048, bias=False) for _ in range(4))).to(GPU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(8, 2048, device=GPU)).pow(2).mean().backward()
    optimizer.step()
    torch.cuda.synchronize()
    return model, optimizer


class Collect:
    """A snapshot sink that keeps the payloads (the agent link has its own tests)."""

    def __init__(self) -> None:
        self.payloads: dict[int, bytes] = {}
        self.lock = threading.Lock()

    def put_snapshot(self, header: peer_pb2.SnapshotHeader, payload: bytes | memoryview) -> str:
        with self.lock:
            self.payloads[header.step] = bytes(payload)
        return ""


def queue_updates(params: list[torch.Tensor], rounds: int) -> None:
    """In-place updates queued on the current stream and not waited for (as a training step's)."""
    for _ in range(rounds):
        for p in params:
            p.mul_(1.0001).add_(1e-4)


@pytest.mark.parametrize("background", [True, False], ids=["side-stream", "training-thread"])
def test_a_snapshot_holds_the_state_at_its_call_despite_queued_kernels_and_the_next_step(background: bool) -> None:
    model, optimizer = big_model()
    params = [p.detach() for p in model.parameters()]
    expected = [p.clone() for p in params]  # queued before the updates: the same start
    queue_updates(params, 20)  # still running when the snapshot is called
    sink = Collect()
    handoff = Handoff(sink, lambda step: peer_pb2.SnapshotHeader(step=step))
    try:
        handoff.start(7, {"model": model, "optimizer": optimizer}, None, background=background)
        moments = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]
        # The next step at once: its optimizer.step() must wait for the copy (a step pre-hook).
        model(torch.ones(8, 2048, device=GPU)).pow(2).mean().backward()
        optimizer.step()
        handoff.await_inflight(count_wait=False)
    finally:
        handoff.close()
    queue_updates(expected, 20)
    torch.cuda.synchronize()
    state = snap.load(sink.payloads[7])
    weights = state["objects"]["model"]
    for index, reference in enumerate(expected):
        assert torch.equal(weights[f"{index}.weight"], reference.cpu()), index
    held_moments = state["objects"]["optimizer"]["state"]
    for index, reference in enumerate(moments):
        assert torch.equal(held_moments[f"{index}.weight"]["exp_avg"], reference.cpu()), index  # keyed by name
    assert not torch.equal(params[0].cpu(), expected[0].cpu())  # the step did change them afterwards


def test_fsdp2_on_nccl_restores_a_ram_snapshot_bit_identical(tmp_path: pathlib.Path) -> None:
    lost_after = fsdp.LOST_AFTER
    reference = tmp_path / "reference"
    reference.mkdir()
    with fsdp.serve_fake_agent(reference) as agent:
        fsdp.finish(fsdp.start(agent, reference, 1, 0, None, "--device", "cuda", "--dump-at", str(lost_after)))
        expected = agent.digests(0)
    run = tmp_path / "run"
    run.mkdir()
    with fsdp.serve_fake_agent(run) as agent:
        procs = fsdp.start(agent, run, 1, 1, None, "--device", "cuda", "--lose-rank", "0",
                           "--lose-rank-after", str(lost_after))
        assert procs[0].wait(timeout=fsdp.RUN_DEADLINE_S) == 17
        assert agent.latest_complete_step(1) == lost_after
        agent.restore_step = lost_after
        fsdp.finish(fsdp.start(agent, run, 1, 2, lost_after, "--device", "cuda"))
        restored = agent.digests(2)
    fsdp.assert_same_state(reference / f"full-0-{lost_after}.pt", run / f"full-2-{lost_after}.pt")
    assert fsdp.batches(reference, 0, 1)[0] == {**fsdp.batches(run, 1, 1)[0], **fsdp.batches(run, 2, 1)[0]}
    for step in range(lost_after + 1, fsdp.STEPS + 1):
        assert restored[step] == expected[step], step


def test_the_example_trainer_on_nccl_resumes_from_its_nodes_ram_bit_identical(tmp_path: pathlib.Path) -> None:
    digests = {}
    for name, crash in (("clean", ()), ("crashed", ("--crash-at-step", "12", "--crash-rank", "0"))):
        where = tmp_path / name
        where.mkdir()
        process, run_dir = run_helpers.ftsup_run(
            where, "--nproc-per-node", "1", "--max-restarts", "1", "-m",
            script="ftsup.trainer.examples.gpt", script_args=("--steps", "30", "--snapshot-every", "1", *crash))
        outcome = run_helpers.finish(process, where)
        assert outcome["exit_code"] == 0 and outcome["restarts"] == len(crash) // 4, outcome
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        done = [e for e in events if e["kind"] == "job_completed"]
        digests[name] = done[-1]["param_digest"]
        if crash:
            assert "restoring step 11: rank(s) 0 from their own node's RAM" in (where / "stderr.txt").read_text()
        assert "world 1" in (where / "stdout.txt").read_text()
    assert digests["crashed"] == digests["clean"]
