"""Silent-data-corruption injection for tests, benchmarks and chaos runs: one flipped bit.

Owns the three places a faulty GPU can corrupt a step without raising anything, each reachable
on one rank at one step:
- `param`: a parameter element after the optimizer step (a bad HBM cell or a bad update). Only
  this rank's replica changes, so the cross-replica digest vote catches it the same step.
- `grad`: the rank's local gradient before the gradient all-reduce (a bad backward). The
  all-reduce averages it into every replica: all digests still agree. Only a recompute of the
  rank's step on another node can catch it (docs/sdc.md).
- `compute`: an activation in the forward pass (a bad matmul). Same as `grad`: it reaches every
  replica through the averaged gradient.
The flip is exact (an integer view of the element's bits), so tests know which bit changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

TARGETS = ("param", "grad", "compute")
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, slots=True)
class BitFlip:
    """Flip bit `bit` of element `index` of `tensor` (a parameter name, or for `compute` a module
    name whose output is hit) on `rank` at `step` of `generation`."""

    step: int
    rank: int
    target: str = "param"
    bit: int = 30
    tensor: str = ""  # "" = the first parameter (param, grad) or the first submodule (compute)
    index: int = 0
    generation: int = 1

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"flip target must be one of {TARGETS}, got {self.target!r}")
        if self.step < 1 or self.rank < 0 or self.index < 0 or self.generation < 1:
            raise ValueError(f"flip step/generation must be >= 1 and rank/index >= 0, got {self}")
        if not 0 <= self.bit < 64:
            raise ValueError(f"flip bit must be within [0, 63], got {self.bit}")


def flip_bit_(tensor: torch.Tensor, index: int, bit: int) -> None:
    """Flips bit `bit` of flat element `index` of `tensor`, in place, whatever its dtype."""
    size = tensor.element_size()
    if bit >= 8 * size:
        raise ValueError(f"bit {bit} is out of range for {tensor.dtype} ({8 * size} bits)")
    if not 0 <= index < tensor.numel():
        raise ValueError(f"element {index} is out of range for a tensor of {tensor.numel()} elements")
    if not tensor.is_contiguous():
        raise ValueError("flip_bit_ needs a contiguous tensor")
    with torch.no_grad():
        words = tensor.view(-1).view(_INT_VIEW[size])
        mask = -(1 << bit) if bit == 8 * size - 1 and size > 1 else 1 << bit  # the sign bit, signed
        words[index] ^= mask


class Injector:
    """Arms one `BitFlip` on a model; inert on every other rank, step and generation."""

    def __init__(self, flip: BitFlip | None, rank: int, generation: int, model: torch.nn.Module) -> None:
        self.flip = flip if flip is not None and flip.rank == rank and flip.generation == generation else None
        self.fired_at: int | None = None
        self._step = 0
        self._model = model
        if self.flip is None:
            return
        if self.flip.target == "grad":
            self._param(self.flip.tensor).register_hook(self._on_grad)
        elif self.flip.target == "compute":
            self._module(self.flip.tensor).register_forward_hook(self._on_output)

    def begin_step(self, step: int) -> None:
        self._step = step

    def after_optimizer_step(self, step: int) -> None:
        flip = self.flip
        if flip is not None and flip.target == "param" and step == flip.step:
            flip_bit_(self._param(flip.tensor).data, flip.index, flip.bit)
            self.fired_at = step

    def _armed(self, target: str) -> BitFlip | None:
        flip = self.flip
        if flip is None or flip.target != target or self._step != flip.step or self.fired_at is not None:
            return None
        return flip

    def _on_grad(self, grad: torch.Tensor) -> torch.Tensor | None:
        flip = self._armed("grad")
        if flip is None:
            return None
        corrupted = grad.clone()
        flip_bit_(corrupted, flip.index, flip.bit)
        self.fired_at = self._step
        return corrupted

    def _on_output(self, _module: torch.nn.Module, _inputs: Any, output: Any) -> Any:
        flip = self._armed("compute")
        if flip is None or not isinstance(output, torch.Tensor):
            return None
        corrupted = output.clone()
        flip_bit_(corrupted, flip.index, flip.bit)
        self.fired_at = self._step
        return corrupted

    def _param(self, name: str) -> torch.nn.Parameter:
        params = dict(self._model.named_parameters())
        if not name:
            return next(iter(params.values()))
        if name not in params:
            raise ValueError(f"no parameter {name!r}; have {sorted(params)[:10]}...")
        return params[name]

    def _module(self, name: str) -> torch.nn.Module:
        modules: dict[str, torch.nn.Module] = dict(self._model.named_modules())
        if not name:
            return next(m for n, m in modules.items() if n)
        if name not in modules:
            raise ValueError(f"no module {name!r}; have {sorted(n for n in modules if n)[:10]}...")
        return modules[name]


def add_flags(add: Callable[..., Any]) -> None:
    """Registers the --sdc-flip-* flags on an argparse `add_argument`."""
    add("--sdc-flip-step", type=int, default=None, help="SDC injection: flip one bit at this step")
    add("--sdc-flip-rank", type=int, default=0, help="...on this rank")
    add("--sdc-flip-target", choices=TARGETS, default="param", help="...in a parameter, a gradient or an activation")
    add("--sdc-flip-bit", type=int, default=30, help="...this bit (float32: 31 sign, 23-30 exponent, 0-22 mantissa)")
    add("--sdc-flip-tensor", default="", help="...of this parameter (param/grad) or module (compute)")
    add("--sdc-flip-index", type=int, default=0, help="...at this flat element index")
    add("--sdc-flip-generation", type=int, default=1, help="...only in this generation (its node)")


def from_flags(args: Any) -> BitFlip | None:
    if args.sdc_flip_step is None:
        return None
    return BitFlip(args.sdc_flip_step, args.sdc_flip_rank, args.sdc_flip_target, args.sdc_flip_bit,
                   args.sdc_flip_tensor, args.sdc_flip_index, args.sdc_flip_generation)
