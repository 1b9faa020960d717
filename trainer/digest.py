"""Parameter digests for silent-data-corruption checks.

Owns the one definition of "same parameters": an exact bit-level digest over every parameter's
name, dtype, shape and raw bytes in `named_parameters()` order, so a single flipped bit changes
it and data-parallel replicas can be compared by string. Needs torch, hence outside `core/`.
"""

from __future__ import annotations

import hashlib

import torch

DIGEST_BYTES = 16


def param_digest(module: torch.nn.Module) -> str:
    """Hex blake2b (16-byte) digest of the parameter bits of `module`."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    with torch.no_grad():
        for name, param in module.named_parameters():
            tensor = param.detach()
            header = f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n"
            h.update(header.encode())
            h.update(_raw_bytes(tensor))
    return h.hexdigest()


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    # Byte view of the values (works for every dtype, bfloat16 included, and 0-dim tensors).
    flat = tensor.to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()
