"""The file calls the embedded log makes, behind one small seam, so power loss can be simulated.

A SIGKILL keeps the page cache: a crash test that kills the process cannot see a missing fsync.
The log therefore does every file and directory operation through `FileOps`; `OS_FILE_OPS` is the
real thing, and the tests' fault-injecting twin (tests/support/powerloss_fs.py) forgets, zeroes or
tears what was written but not yet made durable. The durability rules the log relies on are the
POSIX ones, stated here once:
  - file data is durable after `WritableFile.sync()` (fsync) returns;
  - a name (a new file, a new directory, a rename, a removal) is durable after its directory is
    synced (`sync_dir`), which is why `make_dirs` syncs each parent it adds an entry to.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
from collections.abc import Callable
from typing import Protocol

from ftsup.supervisor.eventlog.api import LogLocked


class WritableFile(Protocol):
    def write(self, data: bytes | memoryview) -> int:
        """Writes some of `data` at the end; returns how many bytes (possibly fewer)."""
        ...

    def sync(self) -> None:
        """fsync: everything written so far is durable when this returns."""
        ...

    def close(self) -> None: ...


class FileOps(Protocol):
    def lock(self, path: pathlib.Path) -> Callable[[], None]:
        """Takes an exclusive lock named by `path` (LogLocked if held); returns its release."""
        ...

    def read(self, path: pathlib.Path) -> bytes: ...

    def exists(self, path: pathlib.Path) -> bool: ...

    def names(self, directory: pathlib.Path) -> list[str]:
        """The entries of `directory` (unordered)."""
        ...

    def mkdir(self, directory: pathlib.Path) -> None:
        """Creates one directory (FileExistsError if it exists); durable once its parent is synced."""
        ...

    def create(self, path: pathlib.Path) -> WritableFile:
        """Opens `path` for writing from empty (created or truncated)."""
        ...

    def open_append(self, path: pathlib.Path) -> WritableFile: ...

    def truncate(self, path: pathlib.Path, size: int) -> None:
        """Cuts the file to `size` bytes, durably."""
        ...

    def rename(self, source: pathlib.Path, target: pathlib.Path) -> None:
        """Atomic replace; durable once the directory is synced."""
        ...

    def remove(self, path: pathlib.Path) -> None: ...

    def sync_dir(self, directory: pathlib.Path) -> None: ...


class _OsFile:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes | memoryview) -> int:
        return os.write(self._fd, data)

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsFileOps:
    """The real file system."""

    def lock(self, path: pathlib.Path) -> Callable[[], None]:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LogLocked(
                f"{path.parent} is in use by another process (pid {holder}): two supervisors must not share"
                " an event log; stop the other one or use another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return lambda: os.close(fd)

    def read(self, path: pathlib.Path) -> bytes:
        return path.read_bytes()

    def exists(self, path: pathlib.Path) -> bool:
        return path.exists()

    def names(self, directory: pathlib.Path) -> list[str]:
        return os.listdir(directory)

    def mkdir(self, directory: pathlib.Path) -> None:
        directory.mkdir()

    def create(self, path: pathlib.Path) -> WritableFile:
        return _OsFile(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))

    def open_append(self, path: pathlib.Path) -> WritableFile:
        return _OsFile(os.open(path, os.O_WRONLY | os.O_APPEND))

    def truncate(self, path: pathlib.Path, size: int) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, source: pathlib.Path, target: pathlib.Path) -> None:
        os.replace(source, target)

    def remove(self, path: pathlib.Path) -> None:
        path.unlink()

    def sync_dir(self, directory: pathlib.Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


OS_FILE_OPS: FileOps = OsFileOps()


def make_dirs(ops: FileOps, directory: pathlib.Path) -> None:
    """Creates `directory` and its missing parents, syncing each parent it adds an entry to: an
    unsynced new directory can vanish at power loss with everything later written inside it."""
    if ops.exists(directory):
        return
    make_dirs(ops, directory.parent)
    try:
        ops.mkdir(directory)
    except FileExistsError:
        return
    ops.sync_dir(directory.parent)


def write_all(file: WritableFile, blob: bytes | memoryview) -> None:
    """write() may write less than asked (a file size limit, a signal): loop, or fail loudly.

    Treating a short write as done would acknowledge bytes that are not on disk.
    """
    view = memoryview(blob)
    while view:
        written = file.write(view)
        if written <= 0:
            raise OSError(f"write() wrote {written} bytes")
        view = view[written:]


def write_durably(ops: FileOps, path: pathlib.Path, blob: bytes) -> None:
    """`path` holds `blob` whole or is as it was: temporary file, fsync, rename, directory fsync."""
    temporary = path.with_name(path.name + ".tmp")
    handle = ops.create(temporary)
    try:
        write_all(handle, blob)
        handle.sync()
    finally:
        handle.close()
    ops.rename(temporary, path)
    ops.sync_dir(path.parent)
