"""Parameter digests for silent-data-corruption checks, computed on the parameters' device.

Owns the one definition of "same parameters": replicas that hold the same bits report the same
string, and any single flipped bit changes it. Every parameter is read as integer words (its raw
bits, never its float value: a float sum hides flipped low mantissa bits and treats -0/+0 and NaN
payloads as equal) and reduced on the device to a 64-bit sum of each word times an odd 32-bit
multiplier that depends on its position (products wrap mod 2^32), plus the plain 64-bit sum of
the words. One flipped bit changes a word by +-2^b with b < 32, so its product changes by
+-2^b * odd != 0 mod 2^32 and the weighted sum's low 32 bits change: a single-bit flip always
changes the digest (the unit tests flip every bit position). Integer addition is associative,
so the result is exact whatever order the device reduces in, and only 16 bytes cross to the host
per device. int32 products keep the multiply in the device's fast path (int32 x int64 costs ~6x). Names, dtypes and shapes are hashed on the host;
which device holds the words is not part of the digest (the same bits on cuda:0, cuda:5 or the
CPU give the same string: checked on an H100 by tests/integration/test_cuda_paths.py).
A DTensor (FSDP2, TP) is digested over this rank's LOCAL shard (never gathered), its local shape
and placements in the header: ranks holding the same shard (trainer/replicas.py) agree.
Needs torch, hence outside `core/`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor

DIGEST_BYTES = 16
# Words reduced per pass: bounds the extra device memory to 12 bytes per word of this chunk
# (the cached int32 multipliers, the int32 products, the int32 words), whatever the model's size.
CHUNK_WORDS = 1 << 22

_MASK64 = (1 << 64) - 1
_multipliers: dict[tuple[str, int], torch.Tensor] = {}


def param_digest(module: torch.nn.Module) -> str:
    """Hex digest (16 bytes) of the parameter bits of `module`, reduced on their device."""
    return tensors_digest(module.named_parameters())


def tensors_digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The digest of `(name, tensor)` pairs, in order; `param_digest` over any tensors."""
    return Digester(named)()


class Digester:
    """The digest of a fixed list of tensors, planned once and recomputed cheaply every step.

    Planning (names hashed, word views cut into chunks, buffers allocated) costs more than the
    reduction itself for a small model; a trainer builds one Digester after the model is on its
    device and calls it after every optimizer step. In-place updates (optimizer steps,
    `load_state_dict`) are seen; a tensor whose storage moved is noticed and the plan rebuilt.
    """

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._named = list(named)  # the tensors themselves: `.data = ...` swaps must show
        self._plan()

    @classmethod
    def of(cls, module: torch.nn.Module) -> Digester:
        return cls(module.named_parameters())

    def _plan(self) -> None:
        header = hashlib.blake2b(digest_size=DIGEST_BYTES)
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for name, live in self._named:
            tensor = _local(live)
            layout = f"|{[str(p) for p in live.placements]}" if isinstance(live, DTensor) else ""
            header.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}{layout}\n".encode())
            words = _words(tensor)
            if words.numel():
                by_device.setdefault(words.device, []).append(words)
        self._header = header.digest()
        self._devices = [_DevicePlan(device, words) for device, words in by_device.items()]
        self._pointers = self._storage_key()
        # A non-contiguous tensor's words are a copy: re-read them on every call.
        self._is_live = all(_local(t).is_contiguous() for _, t in self._named)

    def _storage_key(self) -> tuple[int, ...]:
        return tuple(_local(t).data_ptr() for _, t in self._named)

    def __call__(self) -> str:
        if not self._is_live or self._storage_key() != self._pointers:
            self._plan()
        out = hashlib.blake2b(self._header, digest_size=DIGEST_BYTES)
        with torch.no_grad():
            # Each device's sums under its position in the plan, never its name: replicas of one
            # another sit on different devices (local rank 3's cuda:3 holds the same bits as
            # another node's cuda:5), and a replay may run on another device than the step it checks.
            for position, plan in enumerate(self._devices):
                low, high = plan.sums()
                out.update(f"{position}|{low:016x}{high:016x}".encode())
        return out.hexdigest()


class _DevicePlan:
    """The words of one device, cut into chunks of at most CHUNK_WORDS, with reused buffers."""

    def __init__(self, device: torch.device, words: list[torch.Tensor]) -> None:
        self.device = device
        total = sum(w.numel() for w in words)
        chunk = min(total, CHUNK_WORDS)
        self._chunks = [(pieces, sum(p.numel() for p in pieces)) for pieces in _chunks(words, chunk)]
        self._multipliers = _cached_multipliers(device, chunk)
        self._buffer = torch.empty(chunk, dtype=torch.int32, device=device)
        self._product = torch.empty(chunk, dtype=torch.int32, device=device)
        # Chunk c's sums are weighted by its own odd constant: a word moved to another chunk (same
        # offset) gets another effective multiplier, and a flipped bit still changes the result.
        weights = [_mix(c) | 1 for c in range(len(self._chunks))]
        self._weights = _signed_tensor(weights, device).view(-1, 1)

    def sums(self) -> tuple[int, int]:
        """The position-weighted and the plain sum, mod 2^64, of all words (in order)."""
        sums: list[torch.Tensor] = []
        for pieces, n in self._chunks:
            view, product = self._buffer[:n], self._product[:n]
            if len(pieces) > 1:
                torch.cat(pieces, out=view)
            else:
                view.copy_(pieces[0])
            torch.mul(view, self._multipliers[:n], out=product)
            sums.append(product.sum(dtype=torch.int64))
            sums.append(view.sum(dtype=torch.int64))
        stacked = torch.stack(sums).view(-1, 2)
        low, high = (stacked * self._weights).sum(dim=0).tolist()  # the one device-to-host copy
        return low & _MASK64, high & _MASK64


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or this rank's shard of a DTensor (no communication, no copy)."""
    if isinstance(tensor, DTensor):
        return tensor.to_local().detach()
    return tensor.detach()


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as a flat int32 (4- and 8-byte dtypes) or narrower integer view.

    Narrower views are widened by `torch.cat` into the int32 chunk: sign extension is a
    bijection, and a flipped bit still moves the word by +-2^b.
    """
    flat = tensor.contiguous().reshape(-1)
    size = flat.element_size()
    if size in (4, 8):
        return flat.view(torch.int32)
    if size == 2:
        return flat.view(torch.int16)
    return flat.view(torch.uint8)


def _chunks(words: list[torch.Tensor], chunk: int) -> Iterable[list[torch.Tensor]]:
    pieces: list[torch.Tensor] = []
    room = chunk
    for w in words:
        start = 0
        while start < w.numel():
            take = min(room, w.numel() - start)
            pieces.append(w[start : start + take])
            start += take
            room -= take
            if room == 0:
                yield pieces
                pieces, room = [], chunk
    if pieces:
        yield pieces


def _cached_multipliers(device: torch.device, length: int) -> torch.Tensor:
    """Odd, position-dependent int32 multipliers (splitmix64 of the position), kept per device."""
    key = (str(device), length)
    cached = _multipliers.get(key)
    if cached is None:
        for old in [k for k in _multipliers if k[0] == key[0]]:
            del _multipliers[old]  # one length per device: the model's size does not change
        x = torch.arange(1, length + 1, dtype=torch.int64, device=device)
        x = x * _signed(0x9E3779B97F4A7C15)  # int64 products wrap mod 2^64 on every backend
        x = (x ^ _logical_shift(x, 30)) * _signed(0xBF58476D1CE4E5B9)
        x = (x ^ _logical_shift(x, 27)) * _signed(0x94D049BB133111EB)
        cached = ((x ^ _logical_shift(x, 31)) | 1).to(torch.int32)  # keeps the low 32 bits
        _multipliers[key] = cached
    return cached


def _logical_shift(x: torch.Tensor, bits: int) -> torch.Tensor:
    # torch shifts signed ints arithmetically; masking the sign-filled bits makes it logical.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(value: int) -> int:
    x = (value + 1) * 0x9E3779B97F4A7C15 & _MASK64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _signed_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([_signed(v) for v in values], dtype=torch.int64, device=device)


class GradDigester:
    """The digest of a model's local gradients, per parameter, in the model's parameter order.

    The gradient-sync hook copies each bucket's gradients here *before* the all-reduce
    (`take_bucket`): the rank's own gradients, which every replica then averages, so a corrupt
    one cannot be seen in any parameter digest. A recompute on another node fills it from `.grad`
    after a plain backward (`take_grads`). Same names, shapes and bits give the same digest, so
    the two are comparable bit for bit, whatever DDP's bucket layout (it changes after the first
    step). A parameter without a gradient in a step counts as zeros.

    Sharded parameters (FSDP2, TP: DTensors) are digested over this rank's LOCAL shard of the
    gradient (never gathered): its buffers have the local shard's shape, and a DTensor gradient is
    taken through `to_local()`. Under FSDP2 that shard is the reduce-scattered gradient the rank
    owns (FSDP2 never holds a rank's whole unreduced gradient); a recompute of the same rank with
    the same world yields the same shard.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._by_param = {id(p): n for n, p in named}
        self._buffers = {n: torch.zeros(_local(p).shape, dtype=p.dtype, device=_local(p).device) for n, p in named}
        self._filled: set[str] = set()
        self._digest = Digester(self._buffers.items())

    def take(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        name = self._by_param.get(id(param))
        if name is not None:
            buffer = self._buffers[name]
            local = _local(grad)  # a DTensor gradient: this rank's shard
            if local.numel() != buffer.numel():
                raise ValueError(f"gradient of {name!r} has {local.numel()} local elements, its parameter's local"
                                 f" shard {buffer.numel()}: a gradient sharded unlike its parameter")
            with torch.no_grad():
                buffer.copy_(local.reshape(buffer.shape))
            self._filled.add(name)

    def take_bucket(self, bucket: object) -> None:
        """From a DDP GradBucket, in a comm hook before any communication."""
        for param, grad in zip(bucket.parameters(), bucket.gradients()):  # type: ignore[attr-defined]
            self.take(param, grad)

    def take_grads(self, module: torch.nn.Module) -> None:
        """From `.grad` of every parameter of `module` (the same module the digester was built on)."""
        for param in module.parameters():
            if param.grad is not None:
                self.take(param, param.grad)

    def __call__(self) -> str:
        """The digest of the gradients taken since the last call; then starts over."""
        with torch.no_grad():
            for name in self._buffers.keys() - self._filled:
                self._buffers[name].zero_()
        self._filled.clear()
        return self._digest()
