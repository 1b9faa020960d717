"""A rank's snapshots on their way to its agent: copy into host buffers, encode, stream, count.

Owns the background half of `Session.snapshot`: one worker thread copies the state into reused
host buffers (on GPU a device-to-host copy on a side stream), encodes it and streams it to the
agent, which answers once it and the rank's buddy hold it (the payload in snapshot.py's raw
container, streamed from the host buffers themselves). Rules it enforces: at most one
snapshot is in flight (a new one waits for the previous, and the wait is counted); the state a
snapshot copies is not changed under it: `optimizer.step()` waits (a step pre-hook) until the
copy has landed, the only place a training loop mutates parameters and optimizer state (code
that mutates them elsewhere calls `wait_for_capture()` first, or copies on the training thread
with `background_capture = False`). Imports no daemon code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from ftsup.trainer import snapshot as snap
from ftsup.trainer import state as state_module
from ftsup.v1 import peer_pb2


class SnapshotSink(Protocol):
    """Where a snapshot's bytes go: the agent link (`AgentClient.put_snapshot`) or a stand-in.

    A sink that also has `put_snapshot_parts(header, parts)` is given the payload as the buffers
    `snapshot.serialize_parts` returns, never joined (the agent link streams them as they lie);
    any other gets them joined into one `bytes`.
    """

    def put_snapshot(self, header: peer_pb2.SnapshotHeader, payload: bytes | memoryview) -> str: ...


@dataclass(slots=True)
class SnapshotStats:
    """Counters of the snapshot path, for logs and benchmarks."""

    handed_off: int = 0  # snapshots acknowledged by the agent
    waits: int = 0  # snapshot() calls that had to wait for the previous hand-off
    wait_s: float = 0.0  # total time the training thread spent in those waits
    capture_s: float = 0.0  # total time the training thread spent in snapshot() collecting/copying state
    capture_waits: int = 0  # optimizer steps that had to wait for a background copy to land
    capture_wait_s: float = 0.0  # total time those optimizer steps waited
    last_copy_s: float = 0.0  # the last snapshot's copy into host buffers, wherever it ran
    last_held_s: float = 0.0  # the last snapshot: from the snapshot() call to the agent's ack
    last_payload_bytes: int = 0
    host_buffer_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Ready:
    device: torch.device
    event: Any  # torch.cuda.Event recorded on the training stream


class Handoff:
    """The in-flight snapshot of one rank and everything that waits for it."""

    def __init__(self, sink: SnapshotSink, header: Callable[[int], peer_pb2.SnapshotHeader]) -> None:
        self._sink = sink
        self._header = header  # step -> the header naming this rank's snapshot (generation, rank, node)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="ftsup-snapshot")
        self._inflight: Future[None] | None = None
        self._buffers = snap.HostBuffers()
        self._copied: threading.Event | None = None  # set once the in-flight copy has landed
        self._guarded: list[tuple[torch.optim.Optimizer, RemovableHandle]] = []
        self._side_stream: Any = None  # CUDA stream for device-to-host copies, made on first use
        self.stats = SnapshotStats()

    def start(self, step: int, objects: dict[str, Any], extra: Any, background: bool) -> None:
        """Collects the state of `objects` after `step` and hands it off (see the module docstring)."""
        self.await_inflight(count_wait=True)
        started = time.monotonic()
        state = snap.build_objects_state(step, state_module.collect(objects), extra)
        if not background:
            captured = self._buffers.capture(state)
            self.stats.last_copy_s = time.monotonic() - started
            self.stats.capture_s += self.stats.last_copy_s
            self.stats.host_buffer_bytes = self._buffers.nbytes
            self._inflight = self._worker.submit(self._hand_off, step, captured, started)
            return
        for each in state_module.optimizers(objects):
            self._guard(each)
        copied = threading.Event()
        self._copied = copied
        # The copy must see the state as of now: on GPU the side stream waits for this point of
        # the training stream; on CPU nothing changes it before optimizer.step() (guarded).
        ready = _record_ready_event(state_module.first_module(objects))
        self._inflight = self._worker.submit(self._capture_and_hand_off, step, state, copied, ready, started)
        self.stats.capture_s += time.monotonic() - started

    def wait_for_capture(self) -> float:
        """Blocks until the in-flight snapshot's copy has landed; returns the seconds waited."""
        copied = self._copied
        if copied is None or copied.is_set():
            return 0.0
        started = time.monotonic()
        copied.wait()
        waited = time.monotonic() - started
        self.stats.capture_waits += 1
        self.stats.capture_wait_s += waited
        return waited

    def await_inflight(self, count_wait: bool) -> None:
        """Until the in-flight hand-off (if any) is acknowledged; raises its error."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        if count_wait and not inflight.done():
            started = time.monotonic()
            inflight.exception()  # back-pressure: the host buffers are still being encoded
            self.stats.waits += 1
            self.stats.wait_s += time.monotonic() - started
        inflight.result()  # re-raises the hand-off's error, if any

    def drop(self, timeout_s: float) -> None:
        """Forgets the in-flight hand-off (of a generation that broke), waiting at most `timeout_s`."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            try:
                inflight.result(timeout=timeout_s)
            except Exception:
                pass  # sent or not, the old generation's snapshot no longer matters

    def close(self) -> None:
        """Finishes queued work, stops the worker and removes the optimizer hooks."""
        self._worker.shutdown(wait=True)
        for _optimizer, handle in self._guarded:
            handle.remove()
        self._guarded.clear()

    def _guard(self, optimizer: torch.optim.Optimizer) -> None:
        """Makes `optimizer.step()` wait for the in-flight copy (registered once per optimizer)."""
        if any(known is optimizer for known, _ in self._guarded):
            return

        def before_step(_optimizer: object, _args: object, _kwargs: object) -> None:
            self.wait_for_capture()  # a pre-hook must return None (or new arguments)

        self._guarded.append((optimizer, optimizer.register_step_pre_hook(before_step)))

    def _capture_and_hand_off(self, step: int, state: Any, copied: threading.Event, ready: _Ready | None,
                              started: float) -> None:
        try:
            copy_started = time.monotonic()
            if ready is not None:
                if self._side_stream is None:
                    self._side_stream = torch.cuda.Stream(device=ready.device)
                with torch.cuda.stream(self._side_stream):
                    self._side_stream.wait_event(ready.event)
                    captured = self._buffers.capture(state)
            else:
                captured = self._buffers.capture(state)
            self.stats.last_copy_s = time.monotonic() - copy_started
            self.stats.host_buffer_bytes = self._buffers.nbytes
        finally:
            copied.set()  # on failure too: the error surfaces through the future, never a hang
        del state  # the live references: only the host copy travels on
        self._hand_off(step, captured, started)

    def _hand_off(self, step: int, captured: Any, started: float) -> None:
        # The raw container: a small skeleton, then views of the host buffers (no copy here).
        parts = snap.serialize_parts(captured)
        size = sum(memoryview(part).nbytes for part in parts)
        # Streamed in chunks, hashed as they go out; returns once the agent and its buddy hold it.
        put_parts = getattr(self._sink, "put_snapshot_parts", None)
        if put_parts is not None:
            put_parts(self._header(step), parts)
        else:
            self._sink.put_snapshot(self._header(step), b"".join(parts))
        self.stats.last_held_s = time.monotonic() - started
        self.stats.last_payload_bytes = size
        self.stats.handed_off += 1


def _record_ready_event(model: torch.nn.Module | None) -> _Ready | None:
    """A CUDA event at the current point of the training stream, or None for a CPU model."""
    first = None if model is None else next(iter(model.parameters()), None)
    if first is None or not first.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(first.device))
    return _Ready(first.device, event)
