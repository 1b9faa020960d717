"""A FileOps twin that simulates power loss: what was not made durable is lost, zeroed or torn.

The model (supervisor/eventlog/fileops.py states the rules the log relies on):
  - File data: each file remembers its content as of its last sync. At a crash, bytes appended
    since then survive as a random prefix, possibly followed by zeros up to the written length
    (a size that reached the disk before the data did: ext4 data=writeback, some virtual disks),
    or not at all; content rewritten or truncated since the sync is either the old or the new.
  - Names: mkdir, create, rename and remove are journaled in order. At a crash, the operations a
    later sync of their directory covered survive, plus a random prefix of the rest (an ordered
    metadata journal that got some way). An entry whose parent directory did not survive is gone.
  - Every mutating call counts as one operation; the call numbered `crash_at` crashes: a write
    lands a random part first, then that call and every later one raise `SimulatedCrash`, until
    `crash()` picks what survived and the "machine" restarts.
Not modelled: writeback out of order within a file (a hole followed by later unsynced data), bit
rot, or a sync that returns without persisting (a lying disk).
"""

from __future__ import annotations

import pathlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ftsup.supervisor.eventlog.api import LogLocked

_DIR = "dir"


class SimulatedCrash(OSError):
    """The simulated machine lost power at this call (an OSError: the log treats it as an I/O error)."""


@dataclass(slots=True)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass(slots=True)
class _MetaOp:
    kind: str  # mkdir | create | rename | remove
    path: pathlib.PurePath
    target: pathlib.PurePath | None = None
    inode: _Inode | None = None
    synced: bool = False

    @property
    def dirs(self) -> tuple[pathlib.PurePath, ...]:
        return (self.path.parent,) if self.target is None else (self.path.parent, self.target.parent)


_Entry = _Inode | str


class _File:
    def __init__(self, fs: PowerLossFs, inode: _Inode) -> None:
        self._fs, self._inode = fs, inode

    def write(self, data: bytes | memoryview) -> int:
        blob = bytes(data)
        if self._fs.tick():
            self._inode.data += blob[: self._fs.rng.randint(0, len(blob))]
            raise SimulatedCrash("power lost during write()")
        self._inode.data += blob
        return len(blob)

    def sync(self) -> None:
        self._fs.checked_tick("fsync()")
        self._inode.durable = bytes(self._inode.data)

    def close(self) -> None:
        pass


class PowerLossFs:
    """In-memory directory tree under `root` (which always exists) with simulated power loss."""

    def __init__(self, root: pathlib.Path, rng: random.Random, crash_at: int | None = None) -> None:
        self.root = pathlib.PurePath(root)
        self.rng = rng
        self.crash_at = crash_at
        self.ops = 0
        self.crashed = False
        self._entries: dict[pathlib.PurePath, _Entry] = {}
        self._base: dict[pathlib.PurePath, _Entry] = {}
        self._journal: list[_MetaOp] = []
        self._locks: set[pathlib.PurePath] = set()

    # -- the crash -----------------------------------------------------------------------------
    def tick(self) -> bool:
        """Counts one mutating call; True when it is the one that crashes."""
        if self.crashed:
            raise SimulatedCrash("the machine is down")
        self.ops += 1
        if self.crash_at is not None and self.ops >= self.crash_at:
            self.crashed = True
            return True
        return False

    def checked_tick(self, what: str) -> None:
        if self.tick():
            raise SimulatedCrash(f"power lost at {what}")

    def crash(self) -> None:
        """Power loss now: keep what was durable plus a random part of the rest; then restart."""
        keep = self.rng.randint(0, len(self._journal))
        names = dict(self._base)
        for index, op in enumerate(self._journal):
            if op.synced or index < keep:
                self._replay(names, op)
        for entry in {id(e): e for e in names.values() if isinstance(e, _Inode)}.values():
            entry.data = bytearray(self._torn(entry.durable, bytes(entry.data)))
            entry.durable = bytes(entry.data)
        self._entries, self._base, self._journal = names, dict(names), []
        self._locks.clear()
        self.crashed, self.crash_at = False, None

    def _parent_exists(self, names: dict[pathlib.PurePath, _Entry], path: pathlib.PurePath) -> bool:
        return path.parent == self.root or names.get(path.parent) == _DIR

    def _replay(self, names: dict[pathlib.PurePath, _Entry], op: _MetaOp) -> None:
        if op.kind == "remove":
            names.pop(op.path, None)
        elif op.kind == "rename":
            assert op.target is not None
            if op.path in names and self._parent_exists(names, op.target):
                names[op.target] = names.pop(op.path)
        elif self._parent_exists(names, op.path):
            names[op.path] = _DIR if op.kind == "mkdir" else op.inode  # type: ignore[assignment]

    def _torn(self, durable: bytes, current: bytes) -> bytes:
        if current == durable:
            return current
        if not current.startswith(durable):  # rewritten or truncated since its last sync
            return self.rng.choice([durable, current, bytes(len(current))])
        extra = current[len(durable) :]
        kept = extra[: self.rng.randint(0, len(extra))]
        match self.rng.randrange(4):
            case 0:
                return durable
            case 1:
                return durable + kept
            case 2:  # the size reached the disk, the data did not
                return durable + kept + bytes(len(extra) - len(kept))
            case _:
                return current

    # -- FileOps -------------------------------------------------------------------------------
    def lock(self, path: pathlib.Path) -> Callable[[], None]:
        key = pathlib.PurePath(path)
        if key in self._locks:
            raise LogLocked(f"{path.parent} is in use (simulated lock)")
        self._locks.add(key)
        return lambda: self._locks.discard(key)

    def _inode(self, path: pathlib.Path) -> _Inode:
        entry = self._entries.get(pathlib.PurePath(path))
        if not isinstance(entry, _Inode):
            raise FileNotFoundError(str(path))
        return entry

    def read(self, path: pathlib.Path) -> bytes:
        if self.crashed:
            raise SimulatedCrash("the machine is down")
        return bytes(self._inode(path).data)

    def exists(self, path: pathlib.Path) -> bool:
        key = pathlib.PurePath(path)
        return key == self.root or key in self._entries

    def names(self, directory: pathlib.Path) -> list[str]:
        key = pathlib.PurePath(directory)
        if key != self.root and self._entries.get(key) != _DIR:
            raise FileNotFoundError(str(directory))
        return [path.name for path in self._entries if path.parent == key]

    def _journaled(self, op: _MetaOp) -> None:
        self.checked_tick(op.kind)
        if not self._parent_exists(self._entries, op.path):
            raise FileNotFoundError(str(op.path.parent))
        self._journal.append(op)
        self._replay(self._entries, op)

    def mkdir(self, directory: pathlib.Path) -> None:
        if pathlib.PurePath(directory) in self._entries:
            raise FileExistsError(str(directory))
        self._journaled(_MetaOp("mkdir", pathlib.PurePath(directory)))

    def create(self, path: pathlib.Path) -> _File:
        key = pathlib.PurePath(path)
        existing = self._entries.get(key)
        if isinstance(existing, _Inode):
            self.checked_tick("truncating open")
            existing.data = bytearray()
            return _File(self, existing)
        inode = _Inode()
        self._journaled(_MetaOp("create", key, inode=inode))
        return _File(self, inode)

    def open_append(self, path: pathlib.Path) -> _File:
        if self.crashed:
            raise SimulatedCrash("the machine is down")
        return _File(self, self._inode(path))

    def truncate(self, path: pathlib.Path, size: int) -> None:
        inode = self._inode(path)
        self.checked_tick("truncate")
        del inode.data[size:]
        inode.durable = bytes(inode.data)

    def rename(self, source: pathlib.Path, target: pathlib.Path) -> None:
        self._inode(source)
        self._journaled(_MetaOp("rename", pathlib.PurePath(source), pathlib.PurePath(target)))

    def remove(self, path: pathlib.Path) -> None:
        self._inode(path)
        self._journaled(_MetaOp("remove", pathlib.PurePath(path)))

    def sync_dir(self, directory: pathlib.Path) -> None:
        self.checked_tick("directory fsync")
        key = pathlib.PurePath(directory)
        for op in self._journal:
            if key in op.dirs:
                op.synced = True
