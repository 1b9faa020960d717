"""A faster `dataclasses.replace` for the core's frozen, slotted state types.

Replay folds a million records at start-up and every fold replaces the ClusterState; the
standard `replace` rebuilds keyword arguments and runs the frozen `__init__` (~1.9 us). Copying
the slots directly costs about half. Only for dataclasses without `__post_init__` checks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

T = TypeVar("T")
_set = object.__setattr__


@functools.cache
def _names(cls: type) -> tuple[tuple[str, ...], frozenset[str]]:
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} validates in __post_init__: use dataclasses.replace")
    names = tuple(f.name for f in dataclasses.fields(cls))
    return names, frozenset(names)


def replace(obj: T, **changes: Any) -> T:
    kind: type = type(obj)
    names, known = _names(kind)
    for name in changes:
        if name not in known:
            raise TypeError(f"{type(obj).__name__} has no field {name!r}")
    new = object.__new__(type(obj))
    for name in names:
        _set(new, name, changes[name] if name in changes else getattr(obj, name))
    return new
