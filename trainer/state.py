"""Training state of any shape: what a snapshot captures from a rank's objects, and how it goes back.

A state is a mapping of names to objects: `nn.Module`s (plain, DDP, FSDP2 `fully_shard`, tensor
parallel), optimizers, and anything with `state_dict()`/`load_state_dict()` (DCP's `Stateful`: LR
schedulers, `GradScaler`, torchdata's `StatefulDataLoader`, a sampler). Modules and optimizers go
through torch's distributed state-dict API (`get_model_state_dict`, `get_optimizer_state_dict`,
and their `set_*` counterparts), so a wrapper's prefixes vanish and optimizer state is keyed by
parameter name. Sharded tensors stay sharded: a DTensor is captured as its LOCAL shard plus its
layout (global shape, placements, mesh shape), never gathered; restoring rebuilds it on the live
mesh, and refuses, naming the key, when the layout changed (resharding is the checkpoint's job).

`validate` runs at snapshot time on everything captured: a value that `torch.load(weights_only=
True)` cannot read back (a numpy array or scalar, a custom class, a lambda) is refused there with
its key path, never discovered during a recovery.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

# The key of the dict a captured DTensor becomes (the local shard); its layout sits beside it.
DTENSOR_KEY = "__dtensor_local__"

_LEAVES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


class StateError(ValueError):
    """A state that cannot be captured or restored; the message names the key path."""


class Kind(enum.Enum):
    MODULE = "module"
    OPTIMIZER = "optimizer"
    STATEFUL = "stateful"


def objects_of(model_or_state: Any, optimizer: Any = None) -> dict[str, Any]:
    """The named objects of a call: a mapping as given, or `(model, optimizer)` as
    {"model": ..., "optimizer": ...} (the two-argument form the example trainer uses)."""
    if isinstance(model_or_state, Mapping):
        if optimizer is not None:
            raise TypeError("pass either a state mapping or (model, optimizer), not both")
        objects = dict(model_or_state)
    else:
        if optimizer is None:
            raise TypeError("an optimizer is required with a model (or pass a state mapping)")
        objects = {"model": model_or_state, "optimizer": optimizer}
    if not objects:
        raise StateError("the state mapping is empty: nothing to snapshot")
    for name, obj in objects.items():
        if not isinstance(name, str) or not name:
            raise StateError(f"state names must be non-empty strings, got {name!r}")
        kind_of(name, obj)
    return objects


def kind_of(name: str, obj: Any) -> Kind:
    if isinstance(obj, torch.nn.Module):
        return Kind.MODULE
    if isinstance(obj, torch.optim.Optimizer):
        return Kind.OPTIMIZER
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
        return Kind.STATEFUL
    raise StateError(f"state[{name!r}] is a {type(obj).__qualname__}: expected an nn.Module, an optimizer or an"
                     " object with state_dict()/load_state_dict() (put plain values in `extra`)")


def optimizers(objects: Mapping[str, Any]) -> list[torch.optim.Optimizer]:
    return [o for o in objects.values() if isinstance(o, torch.optim.Optimizer)]


def first_module(objects: Mapping[str, Any]) -> torch.nn.Module | None:
    return next((o for o in objects.values() if isinstance(o, torch.nn.Module)), None)


def collect(objects: Mapping[str, Any]) -> dict[str, Any]:
    """Each object's state dict (tensors still alias the live ones), validated; names kept."""
    out: dict[str, Any] = {}
    for name, obj in objects.items():
        kind = kind_of(name, obj)
        if kind is Kind.MODULE:
            out[name] = get_model_state_dict(obj)
        elif kind is Kind.OPTIMIZER:
            out[name] = get_optimizer_state_dict(_owner(name, obj, objects), obj)
        else:
            out[name] = obj.state_dict()
        validate(out[name], f"state[{name!r}]")
    return out


def apply(objects: Mapping[str, Any], saved: Mapping[str, Any]) -> None:
    """Load captured state dicts (`collect` then a host copy, or a decoded snapshot) into `objects`."""
    missing = sorted(set(objects) - set(saved))
    unexpected = sorted(set(saved) - set(objects))
    if missing or unexpected:
        raise StateError(f"the snapshot holds state {sorted(saved)}, the restore was given {sorted(objects)}"
                         f" (missing from the snapshot: {missing}; not given: {unexpected})")
    order = {Kind.MODULE: 0, Kind.OPTIMIZER: 1, Kind.STATEFUL: 2}
    for name, obj in sorted(objects.items(), key=lambda item: order[kind_of(*item)]):
        kind = kind_of(name, obj)
        if kind is Kind.MODULE:
            state = _rebuild_model(saved[name], f"state[{name!r}]", get_model_state_dict(obj))
            set_model_state_dict(obj, state)
        elif kind is Kind.OPTIMIZER:
            owner = _owner(name, obj, objects)
            state = _rebuild_optimizer(saved[name], f"state[{name!r}]", get_model_state_dict(owner))
            set_optimizer_state_dict(owner, obj, state)
        else:
            obj.load_state_dict(saved[name])


def validate(value: Any, path: str) -> None:
    """Raise StateError naming the first value under `path` a weights-only load cannot restore."""
    if isinstance(value, (torch.Tensor, *_LEAVES)):
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise StateError(f"{path} has a key {key!r} of type {type(key).__qualname__}: only str and int"
                                 " keys can be restored")
            validate(item, f"{path}[{key!r}]")
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            validate(item, f"{path}[{i}]")
        return
    kind = type(value)
    module = kind.__module__ or ""
    if module == "numpy" or module.startswith("numpy."):
        hint = "convert it: torch.from_numpy(x) for an array, x.item() for a scalar"
    elif callable(value):
        hint = "functions and lambdas are code, not state: rebuild them at start"
    else:
        hint = "store its state_dict() (or plain tensors, numbers, strings, lists and dicts) instead"
    raise StateError(f"{path} is a {module}.{kind.__qualname__}, which a restore cannot load"
                     f" (snapshots load with torch.load(weights_only=True)): {hint}")


def dtensor_layout(tensor: DTensor) -> dict[str, Any]:
    """What a captured shard records about its tensor: enough to refuse a mismatched restore."""
    return {"global_shape": list(tensor.shape), "placements": [str(p) for p in tensor.placements],
            "mesh_shape": list(tensor.device_mesh.shape)}


def _owner(name: str, optimizer: torch.optim.Optimizer, objects: Mapping[str, Any]) -> torch.nn.Module:
    """The module of `objects` holding every parameter of `optimizer` (its names key the state)."""
    wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for obj in objects.values():
        if isinstance(obj, torch.nn.Module) and wanted <= {id(p) for p in obj.parameters()}:
            return obj
    raise StateError(f"state[{name!r}] optimizes parameters of no single module in the state: add the model"
                     " that holds them (its parameter names key the optimizer state)")


def _rebuild_model(saved: Mapping[str, Any], path: str, live: Mapping[str, Any]) -> dict[str, Any]:
    """A module's captured state dict with each captured shard a DTensor on the live mesh again."""
    return {k: _rebuild(v, f"{path}[{k!r}]", live.get(k)) for k, v in saved.items()}


def _rebuild_optimizer(saved: Mapping[str, Any], path: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The same for an optimizer's: state -> parameter name -> entries laid out like that parameter."""
    out = dict(saved)
    out["state"] = {fqn: _rebuild(entry, f"{path}['state'][{fqn!r}]", params.get(fqn))
                    for fqn, entry in saved.get("state", {}).items()}
    return out


def _rebuild(value: Any, path: str, live: Any) -> Any:
    if isinstance(value, dict) and DTENSOR_KEY in value:
        return _to_dtensor(value, live, path)
    if isinstance(value, dict):
        return {k: _rebuild(v, f"{path}[{k!r}]", live) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebuild(v, f"{path}[{i}]", live) for i, v in enumerate(value)]
    return value


def _to_dtensor(captured: dict[str, Any], live: Any, path: str) -> DTensor:
    if not isinstance(live, DTensor):
        raise StateError(f"{path} was captured as a shard of a DTensor, but the live tensor is "
                         f"{'missing' if live is None else 'not a DTensor'}: the model's sharding changed")
    saved_layout = {k: captured[k] for k in ("global_shape", "placements", "mesh_shape")}
    if saved_layout != dtensor_layout(live):
        raise StateError(f"{path} was captured with layout {saved_layout}, the job now has {dtensor_layout(live)}:"
                         " a RAM snapshot restores into the same layout only (a checkpoint reshards)")
    local = captured[DTENSOR_KEY]
    device = live.to_local().device
    return DTensor.from_local(local.to(device), live.device_mesh, live.placements, run_check=False,
                              shape=live.shape, stride=live.stride())
