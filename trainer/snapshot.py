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

Two payload containers, both read by `load`: `serialize` writes torch.save's (checkpoints keep it);
`serialize_parts` writes the raw one snapshots travel in, which costs no pass over the tensors at
all: `RAW_MAGIC`, the length of a small torch.save'd skeleton (the state with each large plain
tensor replaced by None, beside a table of where each one goes: its path, dtype, shape and offset)
and then the tensors' bytes, each at a 64-byte aligned offset. The payload is handed out as that
list of buffers, the tensors' being views of the host buffers themselves: the agent link copies
each slice once, into its message, instead of torch.save copying the whole state into one more
buffer (and computing a CRC-32 of it) first.
"""

from __future__ import annotations

import collections
import hashlib
import io
import random
import struct
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ftsup.trainer.state import DTENSOR_KEY, dtensor_layout

FORMAT_VERSION = 2  # what Session writes: {"objects": {name: state dict}}
LEGACY_FORMAT = 1  # one model, one optimizer: still read (replays, old snapshots)
RAW_MAGIC = b"FTSUPRW1"  # a raw-container payload starts with it (torch.save's start with b"PK")
_RAW_PREFIX = struct.Struct("<8sQ")  # the magic, then the skeleton's length in bytes
RAW_ALIGN = 64  # every tensor's bytes (and the first one's start) at a multiple of this
RAW_MIN_BYTES = 64 * 1024  # smaller tensors travel inside the skeleton: fewer, larger slices
_RAW_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    *(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
      if isinstance(getattr(torch, name, None), torch.dtype)),
)}


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


def serialize_parts(state: Any) -> list[bytes | memoryview]:
    """The raw-container payload of `state` (see the module docstring) as buffers to be sent back
    to back: the prefix and skeleton, then each large tensor's bytes as a view of the tensor (no
    copy; valid while the tensors are: a captured state's until the next capture), with zero
    padding between them. Only plain, contiguous CPU tensors of a known dtype go raw; anything
    else stays in the skeleton, which torch.save writes as before."""
    raw: list[tuple[tuple[Any, ...], torch.Tensor]] = []
    skeleton_state = _strip(state, (), raw)
    table: list[tuple[tuple[Any, ...], str, list[int], int, int]] = []
    offset = 0
    for path, tensor in raw:
        offset = _aligned(offset)
        nbytes = tensor.numel() * tensor.element_size()
        table.append((path, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, nbytes))
        offset += nbytes
    out = io.BytesIO()
    torch.save({"state": skeleton_state, "tensors": table, "byteorder": sys.byteorder}, out)
    skeleton = out.getvalue()
    head = _RAW_PREFIX.pack(RAW_MAGIC, len(skeleton)) + skeleton
    parts: list[bytes | memoryview] = [head + bytes(_aligned(len(head)) - len(head))]
    end = 0
    for (_path, tensor), (_, _, _, start, nbytes) in zip(raw, table, strict=True):
        if start > end:
            parts.append(bytes(start - end))
        if nbytes:
            parts.append(_bytes_of(tensor))
        end = start + nbytes
    return parts


def _aligned(offset: int) -> int:
    return -(-offset // RAW_ALIGN) * RAW_ALIGN


def _is_raw(value: Any) -> bool:
    """A tensor whose bytes can travel as they lie in memory (and be read back by `_load_raw`)."""
    return (type(value) is torch.Tensor and value.layout == torch.strided and value.device.type == "cpu"
            and str(value.dtype).removeprefix("torch.") in _RAW_DTYPES and not value.is_quantized
            and not value.is_conj() and not value.is_neg() and value.is_contiguous()
            and value.numel() * value.element_size() >= RAW_MIN_BYTES)


def _strip(value: Any, path: tuple[Any, ...], raw: list[tuple[tuple[Any, ...], torch.Tensor]]) -> Any:
    """`value` with each raw tensor replaced by None, which `raw` gets with its path (the keys and
    indices that lead to it). Only plain dicts (keyed by str or int), lists and tuples are walked:
    any other object keeps its tensors and is written by torch.save as it is."""
    if _is_raw(value):
        raw.append((path, value.detach()))
        return None
    kind = type(value)
    if (kind is dict or kind is collections.OrderedDict) and all(type(k) in (str, int) for k in value):
        return kind((k, _strip(v, (*path, k), raw)) for k, v in value.items())
    if kind is list or kind is tuple:
        return kind(_strip(v, (*path, i), raw) for i, v in enumerate(value))
    return value


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, as a flat view of its memory (writable)."""
    array: Any = tensor.reshape(-1).view(torch.uint8).numpy()  # shares the tensor's memory
    return memoryview(array).cast("B")


def _load_raw(payload: bytes | memoryview) -> Any:
    """The state in a raw-container payload; SnapshotCorrupt when any part of it does not add up."""
    view = memoryview(payload).cast("B")
    if len(view) < _RAW_PREFIX.size:
        raise SnapshotCorrupt(f"raw snapshot of {len(view)} bytes is shorter than its prefix")
    _magic, skeleton_bytes = _RAW_PREFIX.unpack_from(view, 0)
    skeleton_end = _RAW_PREFIX.size + skeleton_bytes
    if skeleton_end > len(view):
        raise SnapshotCorrupt(f"raw snapshot's skeleton of {skeleton_bytes} bytes runs past its {len(view)} bytes")
    try:
        skeleton = torch.load(io.BytesIO(view[_RAW_PREFIX.size:skeleton_end]), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SnapshotCorrupt(f"raw snapshot's skeleton could not be loaded: {exc}") from exc
    if not isinstance(skeleton, dict) or not {"state", "tensors", "byteorder"} <= skeleton.keys():
        raise SnapshotCorrupt("raw snapshot's skeleton is not a dict of state, tensors and byteorder")
    if skeleton["byteorder"] != sys.byteorder:
        raise SnapshotCorrupt(f"raw snapshot was written {skeleton['byteorder']}-endian; this host is {sys.byteorder}")
    data_start = _aligned(skeleton_end)
    tensors: dict[tuple[Any, ...], torch.Tensor] = {}
    try:
        for path, dtype_name, shape, offset, nbytes in skeleton["tensors"]:
            dtype = _RAW_DTYPES[dtype_name]
            tensor = torch.empty([int(n) for n in shape], dtype=dtype)
            start = data_start + int(offset)
            if tensor.numel() * tensor.element_size() != nbytes or offset < 0 or start + nbytes > len(view):
                raise ValueError(f"{dtype_name}{list(shape)} at {offset} (+{nbytes} bytes) does not fit")
            if nbytes:
                _bytes_of(tensor)[:] = view[start:start + nbytes]
            tensors[tuple(path)] = tensor
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise SnapshotCorrupt(f"raw snapshot's tensor table is malformed: {exc!r}") from exc
    state = _fill(skeleton["state"], (), tensors)
    if tensors:
        raise SnapshotCorrupt(f"raw snapshot's tensors at {sorted(map(str, tensors))[:3]} have no place in its state")
    return state


def _fill(value: Any, path: tuple[Any, ...], tensors: dict[tuple[Any, ...], torch.Tensor]) -> Any:
    """`_strip` undone: the tensor of each path put back where its None stands."""
    if path in tensors:
        if value is not None:
            raise SnapshotCorrupt(f"raw snapshot's tensor at {path} would replace a {type(value).__name__}")
        return tensors.pop(path)
    kind = type(value)
    if (kind is dict or kind is collections.OrderedDict) and all(type(k) in (str, int) for k in value):
        return kind((k, _fill(v, (*path, k), tensors)) for k, v in value.items())
    if kind is list or kind is tuple:
        return kind(_fill(v, (*path, i), tensors) for i, v in enumerate(value))
    return value


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
    """The state in a payload whose SHA-256 was already checked (e.g. while it streamed in), in
    either container (the raw one of `serialize_parts` or torch.save's)."""
    if bytes(payload[:len(RAW_MAGIC)]) == RAW_MAGIC:
        state = _load_raw(payload)
    else:
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
