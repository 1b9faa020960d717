"""The peers' in-memory and async checkpoints, timed on the state `ftsup bench snapshot` snapshots.

Run by bench/snapshot.py once per baseline, each in a fresh process (so one peer's threads,
helper processes and memory do not weigh on the next), with the peers' venv's python when it has
one: `python -m ftsup.bench._snapshot_peers --baseline NAME --state-mb X --saves N --dir D`.
Prints one JSON object on its last stdout line: the timings, or `ran: false` and why (a missing
package, or the peer's own error, quoted).

Every baseline is timed the way ftsup's rank is (bench/_snapshot_rank.py): the same model and
AdamW state (`build_state_model`), one save per training step, and the pause is what the
training thread loses: the save call plus, for a peer that copies in the background, the wait of
the next `optimizer.step()` for that copy to finish (the parameters must not change under it).
With `--device cuda` the state is on GPU 0 and every step ends with a device synchronize (as
ftsup's rank does), so no save absorbs queued compute; DCP's async stager then uses pinned memory
and non-blocking copies, as its documentation recommends on an accelerator.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: the names above stay cheap to import
    import torch
    from torch import nn

BASELINES = ("dcp_async_save", "dcp_async_save_async_staging", "dlrover_flash_memory", "nvrx_local")
# The package each baseline needs beyond torch (from the bench-peers extra), checked before the
# model is built so that a missing one is reported at once.
REQUIRES = {"dlrover_flash_memory": "dlrover", "nvrx_local": "nvidia_resiliency_ext"}
PAGE = os.sysconf("SC_PAGE_SIZE")
NOT_REMOTE = "the copy is on this node only (local disk or this host's memory): lost with the node"


class PeerUnavailable(Exception):
    """The peer cannot run here; the message says why (a missing package, a device it needs)."""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@contextmanager
def peak_rss() -> Iterator[dict[str, int]]:
    """Samples this process's RSS every 5 ms; yields a dict that holds `peak` once the block ends."""
    box = {"before": _rss_bytes(), "peak": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            box["peak"] = max(box["peak"], _rss_bytes())
            stop.wait(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield box
    finally:
        stop.set()
        sampler.join()
        box["peak"] = max(box["peak"], _rss_bytes())


def forward_backward(model: nn.Module, optimizer: torch.optim.Optimizer, width: int) -> None:
    import torch

    from ftsup.bench._snapshot_rank import BATCH

    device = next(model.parameters()).device
    loss = model(torch.ones(BATCH, width, device=device)).pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    _synchronize(model)


def _synchronize(model: nn.Module) -> None:
    import torch

    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# A save returns (waiter, stored): `waiter` blocks until the parameters may change (called
# before the next optimizer.step); `stored` blocks until the copy is where the peer keeps it and
# returns the time.monotonic() at which it got there (not when we asked).
SaveFn = Callable[[int], tuple[Callable[[], None], Callable[[], float]]]


def stored_when_done(future: Any) -> Callable[[], float]:
    """For a concurrent Future: the time it completed, recorded by its own done-callback."""
    box: dict[str, float] = {}
    future.add_done_callback(lambda _: box.setdefault("at", time.monotonic()))

    def stored() -> float:
        future.result()  # raises the peer's error
        return box.get("at") or time.monotonic()

    return stored


def stored_now() -> Callable[[], float]:
    """For a save that has stored its copy when the call returns."""
    at = time.monotonic()
    return lambda: at


def time_saves(save: SaveFn, model: nn.Module, optimizer: torch.optim.Optimizer, width: int,
               saves: int) -> dict[str, Any]:
    """One save per step, `saves` times (after one untimed warm-up save): the pause and the wait."""
    samples = []
    with peak_rss() as memory:
        for step in range(saves + 1):
            started = time.monotonic()
            waiter, stored = save(step)
            call_s = time.monotonic() - started
            forward_backward(model, optimizer, width)
            wait_started = time.monotonic()
            waiter()
            wait_s = time.monotonic() - wait_started
            optimizer.step()
            _synchronize(model)
            stored_s = stored() - started
            if step > 0:
                samples.append({"call_s": call_s, "optimizer_wait_s": wait_s, "stored_s": stored_s})
    return {"samples": samples, "rss_before_bytes": memory["before"], "rss_peak_bytes": memory["peak"]}


def run_dcp(directory: pathlib.Path, model: nn.Module, optimizer: torch.optim.Optimizer, width: int,
            saves: int, async_staging: bool) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    # With async staging the stager is created once and reused where torch allows, as the DCP docs
    # recommend (its staging buffers are kept between saves); pinned and shared memory need an
    # accelerator.
    on_gpu = next(model.parameters()).is_cuda
    options = StagingOptions(use_pinned_memory=on_gpu, use_shared_memory=False, use_async_staging=True,
                             use_non_blocking_copy=on_gpu)
    stagers: list[DefaultStager] = []

    def stager_for_save() -> DefaultStager | None:
        if not async_staging:
            return None
        if not stagers or not _still_usable(stagers[-1]):
            stagers.append(DefaultStager(options))
        return stagers[-1]

    def save(step: int) -> tuple[Callable[[], None], Callable[[], float]]:
        writer = dcp.FileSystemWriter(str(directory / f"step-{step}"))  # sync_files=True: fsync'd
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        response = dcp.async_save(state, storage_writer=writer, no_dist=True, async_stager=stager_for_save())
        if isinstance(response, AsyncSaveResponse):  # staging in the background
            return response.staging_completion.result, stored_when_done(response.upload_completion)
        return (lambda: None), stored_when_done(response)

    try:
        return time_saves(save, model, optimizer, width, saves)
    finally:
        for stager in stagers:
            stager.close()


def _still_usable(stager: Any) -> bool:
    """Whether a DefaultStager can stage again: torch 2.11's cannot.

    torch 2.11's `DefaultStager._stage` closes its inner StateDictStager after every stage (to
    break a reference cycle), which empties its copy table: a second save through the same stager
    fails `KeyError: <class 'type'>` (seen on two GPU hosts). It keeps nothing between saves there,
    so a new stager per save costs DCP nothing; torch 2.13 keeps the stager and its buffers.
    """
    inner = getattr(stager, "_state_dict_stager", None)
    return bool(getattr(inner, "_deepcopy_dispatch", True))


def run_dlrover(directory: pathlib.Path, model: nn.Module, optimizer: torch.optim.Optimizer, width: int,
                saves: int) -> dict[str, Any]:
    try:
        from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType
    except ImportError as exc:
        raise PeerUnavailable(f"not installed: {exc} (the bench-peers extra)") from exc
    # Outside dlrover-run the engine starts its own saver process (daemonic; it dies with us)
    # and copies the state into shared memory on the training thread; replica_count 0: no copy on
    # another node. Its sockets (/tmp/ckpt_sock/) and shared memory are named per
    # TORCHELASTIC_RUN_ID: a run id of our own keeps a stale socket of an earlier run (or a
    # concurrent one) from answering for our saver.
    run_id = f"ftsup-bench-{os.getpid()}-{int(time.time())}"
    os.environ["TORCHELASTIC_RUN_ID"] = run_id
    checkpointer = None
    try:
        checkpointer = active = DdpCheckpointer(str(directory))

        def save(step: int) -> tuple[Callable[[], None], Callable[[], float]]:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            active.save_checkpoint(step, state, storage_type=StorageType.MEMORY)
            return (lambda: None), stored_now()  # in the node's shared memory once the call returns

        return time_saves(save, model, optimizer, width, saves)
    finally:  # also when its engine failed to start: its sockets are made before the wait that times out
        engine = getattr(checkpointer, "_engine", None)
        handler = getattr(engine, "_shm_handler", None)
        if handler is not None and getattr(handler, "shared_memory", None) is not None:
            handler.shared_memory.unlink()  # /dev/shm/*ckpt_shm_*: the saver would leave it behind
        import shutil

        shutil.rmtree(pathlib.Path("/tmp/ckpt_sock") / run_id, ignore_errors=True)


def run_nvrx(directory: pathlib.Path, model: nn.Module, optimizer: torch.optim.Optimizer, width: int,
             saves: int) -> dict[str, Any]:
    try:
        from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
        from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
    except ImportError as exc:
        raise PeerUnavailable(f"not installed: {exc} (the bench-peers extra)") from exc
    import torch.distributed as dist

    # Its manager coordinates through a process group: a one-rank gloo group over a file.
    dist.init_process_group("gloo", init_method=f"file://{directory / 'pg-init'}", rank=0, world_size=1)
    try:
        manager = LocalCheckpointManager(str(directory / "local"))

        def save(step: int) -> tuple[Callable[[], None], Callable[[], float]]:
            state = BasicTensorAwareStateDict(_on_cuda({"model": model.state_dict(), "optimizer": optimizer.state_dict()}))
            request = manager.save(state, step, is_async=True)

            def stored() -> float:
                if request is not None:
                    request.execute_sync()
                return time.monotonic()

            return (lambda: None), stored

        try:
            return time_saves(save, model, optimizer, width, saves)
        except AssertionError as exc:  # its state dict asserts every tensor is on a CUDA device
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            raise PeerUnavailable(
                f"CUDA-only: AssertionError at {pathlib.Path(frame.filename).name}:{frame.lineno}: {frame.line}"
            ) from exc
    finally:
        dist.destroy_process_group()


def _on_cuda(state: Any) -> Any:
    """NVRx's state dict asserts every tensor is on CUDA; AdamW keeps its `step` counters on the CPU
    (capturable=False). Those scalars are moved over (bytes, not the state): the rest is untouched."""
    import torch

    if isinstance(state, dict):
        return {k: _on_cuda(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_on_cuda(v) for v in state]
    if isinstance(state, torch.Tensor) and not state.is_cuda and torch.cuda.is_available():
        return state.cuda()
    return state


def run(name: str, directory: pathlib.Path, state_mb: float, saves: int, device: str = "cpu") -> dict[str, Any]:
    import importlib.util

    if name in REQUIRES and importlib.util.find_spec(REQUIRES[name]) is None:
        raise PeerUnavailable(f"not installed: no module named {REQUIRES[name]!r} in {sys.executable} "
                              "(the bench-peers extra; docs/peers.md)")
    import torch

    from ftsup.bench._snapshot_rank import build_state_model, state_bytes

    torch.set_num_threads(1)  # as the ftsup rank measured beside it
    model, optimizer, width = build_state_model(state_mb, device=device)
    directory.mkdir(parents=True, exist_ok=True)
    if name == "dcp_async_save":
        measured = run_dcp(directory, model, optimizer, width, saves, async_staging=False)
    elif name == "dcp_async_save_async_staging":
        measured = run_dcp(directory, model, optimizer, width, saves, async_staging=True)
    elif name == "dlrover_flash_memory":
        measured = run_dlrover(directory, model, optimizer, width, saves)
    elif name == "nvrx_local":
        measured = run_nvrx(directory, model, optimizer, width, saves)
    else:
        raise ValueError(f"unknown baseline {name!r}; one of {', '.join(BASELINES)}")
    return {"ran": True, "state_bytes": state_bytes(model, optimizer), "torch": torch.__version__, "device": device,
            **measured}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftsup.bench._snapshot_peers")
    parser.add_argument("--baseline", choices=BASELINES, required=True)
    parser.add_argument("--state-mb", type=float, required=True)
    parser.add_argument("--saves", type=int, required=True, help="timed saves (after one warm-up)")
    parser.add_argument("--dir", type=pathlib.Path, required=True, help="scratch directory on local disk")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    try:
        result = run(args.baseline, args.dir, args.state_mb, args.saves, args.device)
    except PeerUnavailable as exc:
        result = {"ran": False, "reason": str(exc)}
    except Exception as exc:  # the peer's own failure: reported as such (the bench's test fails on it)
        traceback.print_exc()
        print(json.dumps({"ran": False, "reason": f"its run failed: {type(exc).__name__}: {exc}"[:500]}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
