"""GrowOnly: an immutable sequence whose append costs O(1), for state that only grows.

A pending checkpoint lists the ranks that wrote their shard, in arrival order: up to 100,000 at
100k GPUs, one event each. As a tuple, every event copied the whole tuple and checked membership
by scanning it, so one checkpoint cost O(ranks^2) on the leader, on every follower and at replay
(3.6 s for the first 20,000 of 100,000 shards, ~90 s for all; bench/checkpoint_fold.py).

Each GrowOnly is a view: the first `length` items of a list it may share with the views appended
from it, plus an index from item to position. Appending to the newest view (its length is the
list's) extends the shared list in place; older views still see only their prefix, so every view
stays immutable to its readers. Appending to an older view (a branch: a replayed or rejected
state) copies. Membership is one dict lookup: an item is in a view when its first position is
within the view. Items must be hashable. Equal to the tuple of its items, and hashes as one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast, overload

T = TypeVar("T")


class GrowOnly(Sequence[T]):
    __slots__ = ("_items", "_first", "_length")

    def __init__(self, items: Iterable[T] = ()) -> None:
        self._items: list[T] = list(items)
        self._first: dict[T, int] = {}
        for position, item in enumerate(self._items):
            self._first.setdefault(item, position)
        self._length = len(self._items)

    def append(self, item: T) -> GrowOnly[T]:
        """A new view with `item` at the end; this one is unchanged."""
        if self._length != len(self._items):  # a later view grew the list: branch off a copy
            grown = GrowOnly(self._items[: self._length])
        else:
            grown = object.__new__(GrowOnly)
            grown._items, grown._first = self._items, self._first
        grown._first.setdefault(item, len(grown._items))
        grown._items.append(item)
        grown._length = len(grown._items)
        return grown

    def __contains__(self, item: object) -> bool:
        position = self._first.get(cast(T, item))  # (an unhashable item raises TypeError, as a set's would)
        return position is not None and position < self._length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[T]:
        items = self._items
        for position in range(self._length):
            yield items[position]

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            return tuple(self._items[: self._length][index])
        if not -self._length <= index < self._length:
            raise IndexError(f"GrowOnly index {index} out of range (length {self._length})")
        return self._items[index % self._length]

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, GrowOnly):
            return self._length == other._length and (
                (self._items is other._items) or self._items[: self._length] == other._items[: other._length])
        if isinstance(other, tuple):
            return self._length == len(other) and self._items[: self._length] == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"GrowOnly({tuple(self)!r})"
