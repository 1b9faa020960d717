"""Capture and restore of a rank's training state, to and from snapshot bytes.

Owns the snapshot format: the named objects' state dicts (trainer/state.py collects them: modules,
optimizers, any `Stateful`; format 2; format 1 held one model and one optimizer), every RNG state (torch CPU, CUDA when
in use, python `random`), the data cursor and the step, kept to tensors, numbers, strings, None,
dicts, lists and tuples so `torch.load(weights_only=True)` can read it back (no pickled code).
Capture copies into pre-allocated host buffers (`HostBuffers`), allocated on the first snapshot
and reused while the layout holds (pinned when the source is on a GPU); a DTensor is copied as its local shard beside its layout,
never gathered; `Session` runs it off the
training thread, and encoding happens after it, also in the background. A snapshot handed to the
agent is hashed while it streams out (trainer/agent_client.py); a restored one was checked while it
streamed in, and `decode` checks the SHA-256 of any other payload first: a corrupt snapshot must
never be loaded silently.
"""

from __future__ import annotations

import hashlib
import io
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ftsup.trainer.state import DTENSOR_KEY, dtensor_layout

FORMAT_VERSION = 2  # what Session writes: {"objects": {name: state dict}}
LEGACY_FORMAT = 1  # one model, one optimizer: still read (replays, old snapshots)


class SnapshotCorrupt(Exception):
    """The payload does not match its SHA-256 or is not a readable snapshot; not retryable."""


@dataclass(frozen=True, slots=True)
class RestoredState:
    step: int
    data_cursor: int
    extra: Any


def build_objects_state(step: int, objects: dict[str, Any], extra: Any = None) -> dict[str, Any]:
    """The live state after `step` optimizer steps from collected state dicts (state.collect)."""
    return {
        "format": FORMAT_VERSION,
        "step": int(step),
        "data_cursor": int(step),
        "objects": objects,
        "rng": _rng_state(),
        "extra": extra,
    }


def build_state(
    step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: Any = None
) -> dict[str, Any]:
    """The live format-1 state after `step` optimizer steps (tensors still alias the model's)."""
    return {
        "format": LEGACY_FORMAT,
        "step": int(step),
        # Batches are a pure function of (seed, step, rank): the cursor is the batches consumed.
        "data_cursor": int(step),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": _rng_state(),
        "extra": extra,
    }


class HostBuffers:
    """Host copies of a state's tensors, allocated once and reused while the layout holds."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def capture(self, state: Any) -> Any:
        """Copy of `state` whose tensors live in this object's host buffers.

        The returned structure stays valid until the next `capture`; the caller must not start
        a new capture while the previous one is still being encoded.
        """
        has_cuda = False

        def copy(path: str, value: Any) -> Any:
            nonlocal has_cuda
            if isinstance(value, DTensor):
                # This rank's shard only, beside the layout a restore checks it against.
                local = copy(f"{path}/{DTENSOR_KEY}", value.to_local())
                return {DTENSOR_KEY: local, **dtensor_layout(value)}
            if isinstance(value, torch.Tensor):
                buf = self._buffers.get(path)
                if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                    buf = torch.empty(
                        value.shape, dtype=value.dtype, device="cpu", pin_memory=value.is_cuda
                    )
                    self._buffers[path] = buf
                has_cuda = has_cuda or value.is_cuda
                buf.copy_(value.detach(), non_blocking=value.is_cuda)
                return buf
            if isinstance(value, dict):
                return {k: copy(f"{path}/{k}", v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                items = [copy(f"{path}/{i}", v) for i, v in enumerate(value)]
                return items if isinstance(value, list) else tuple(items)
            return value

        captured = copy("", state)
        if has_cuda:
            # non_blocking copies must land before anyone reads them. Only the stream they were
            # queued on is waited for (a side stream when called from Session's background copy),
            # never the whole device, so the training stream keeps running.
            torch.cuda.current_stream().synchronize()
        return captured


def serialize(state: Any) -> bytes:
    """The snapshot payload of `state` (no hash: the hand-off computes it while streaming)."""
    out = io.BytesIO()
    torch.save(state, out)
    return out.getvalue()  # the buffer itself, not a copy, when nothing else holds a view of it


def encode(state: Any) -> tuple[bytes, str]:
    """Serialized payload and its hex SHA-256 (for checkpoints, which record the hash)."""
    payload = serialize(state)
    return payload, hashlib.sha256(payload).hexdigest()


def decode(payload: bytes | memoryview, sha256_hex: str) -> dict[str, Any]:
    """The state in `payload`, after checking it against `sha256_hex`."""
    actual = hashlib.sha256(payload).hexdigest()
    if actual != sha256_hex:
        raise SnapshotCorrupt(
            f"snapshot payload of {len(payload)} bytes has sha256 {actual}, expected {sha256_hex}"
        )
    return load(payload)


def load(payload: bytes | memoryview) -> dict[str, Any]:
    """The state in a payload whose SHA-256 was already checked (e.g. while it streamed in)."""
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SnapshotCorrupt(f"snapshot payload could not be loaded: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") not in (FORMAT_VERSION, LEGACY_FORMAT):
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise SnapshotCorrupt(f"snapshot format {found!r} is not {FORMAT_VERSION} (or {LEGACY_FORMAT})")
    return state


def apply_state(
    state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> RestoredState:
    """Load `state` into `model`, `optimizer` and the process RNGs."""
    if state["format"] == FORMAT_VERSION:
        return apply_objects(state, {"model": model, "optimizer": optimizer})
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"])
    return RestoredState(step=state["step"], data_cursor=state["data_cursor"], extra=state["extra"])


def apply_objects(state: dict[str, Any], objects: dict[str, Any]) -> RestoredState:
    """Load a decoded snapshot into named objects (trainer/state.py) and the process RNGs."""
    if state["format"] == LEGACY_FORMAT:
        if set(objects) != {"model", "optimizer"}:
            raise SnapshotCorrupt(f"a format-{LEGACY_FORMAT} snapshot holds one model and one optimizer,"
                                  f" the restore was given {sorted(objects)}")
        return apply_state(state, objects["model"], objects["optimizer"])
    from ftsup.trainer import state as state_module

    state_module.apply(objects, state["objects"])
    _set_rng_state(state["rng"])
    return RestoredState(step=state["step"], data_cursor=state["data_cursor"], extra=state["extra"])


def restore_rng(state: dict[str, Any]) -> None:
    """Set the process RNGs to those of a decoded snapshot `state` (again, e.g. per replayed rank)."""
    _set_rng_state(state["rng"])


def _rng_state() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    return {
        "torch_cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "python": [version, list(internal), gauss_next],
    }


def _set_rng_state(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch_cpu"])
    if rng["cuda"]:
        torch.cuda.set_rng_state_all(rng["cuda"])
    version, internal, gauss_next = rng["python"]
    random.setstate((version, tuple(internal), gauss_next))
