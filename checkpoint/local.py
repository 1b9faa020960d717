"""`LocalDirStore`: the embedded default object store, a directory on a local or shared file system.

Atomic puts by write-to-temp + fsync + rename (+ fsync of the directory, so a crash cannot leave
the rename unrecorded); `put_if_absent` by link(2), which fails with EEXIST instead of replacing,
the file-system twin of S3's `If-None-Match: *`. `head` re-reads and hashes the file: a directory
keeps no checksum, and the commit protocol wants the digest of the bytes actually stored.
A writer that dies before its rename leaves its `.ftsup-tmp-*` file behind: never listed as an
object, it is this store's pending upload (`list_uploads`, `abort_upload`), aged by its mtime.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import ObjectExists, ObjectNotFound, StoreError
from ftsup.checkpoint.store import Buffer, ObjectInfo, PendingUpload, validate_key

_TMP_PREFIX = ".ftsup-tmp-"


class LocalDirStore:
    def __init__(self, root: str | os.PathLike[str], *, chunking: digest.Chunking | None = None,
                 max_concurrency: int = 4, fsync: bool = True) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.root = pathlib.Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._chunking = chunking or digest.Chunking()
        self._fsync = fsync
        # Two pools: put_many's writers wait on part hashing, which must not queue behind them.
        self._io_pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="ftsup-localstore-io")
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="ftsup-localstore-hash")

    @property
    def chunking(self) -> digest.Chunking:
        return self._chunking

    def describe(self) -> str:
        return f"file://{self.root}"

    def close(self) -> None:
        self._io_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)

    def _path(self, key: str) -> pathlib.Path:
        return self.root / validate_key(key)

    def _digest(self, data: Buffer) -> str:
        view = memoryview(data)
        ranges = self._chunking.part_ranges(len(view))
        parts = list(self._pool.map(lambda r: digest.part_digest(view[r[0]:r[1]]), ranges))
        return digest.combine(parts)

    def _write_temp(self, path: pathlib.Path, data: Buffer) -> pathlib.Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self._fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def _sync_dir(self, directory: pathlib.Path) -> None:
        if self._fsync:
            fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def put(self, key: str, data: Buffer) -> ObjectInfo:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            os.replace(tmp, path)
            self._sync_dir(path.parent)
        except OSError as exc:
            raise StoreError(f"cannot write {key!r} under {self.root}: {exc}") from exc
        return ObjectInfo(key, len(memoryview(data)), self._digest(data))

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> list[ObjectInfo]:
        return list(self._io_pool.map(lambda item: self.put(*item), items))

    def put_if_absent(self, key: str, data: Buffer) -> ObjectInfo:
        path = self._path(key)
        try:
            tmp = self._write_temp(path, data)
            try:
                os.link(tmp, path)  # EEXIST instead of replacing: never overwrite
            except FileExistsError as exc:
                raise ObjectExists(f"object {key!r} already exists under {self.root}") from exc
            finally:
                tmp.unlink(missing_ok=True)
            self._sync_dir(path.parent)
        except OSError as exc:
            raise StoreError(f"cannot create {key!r} under {self.root}: {exc}") from exc
        return ObjectInfo(key, len(memoryview(data)), self._digest(data))

    def get(self, key: str) -> bytearray:
        try:
            with open(self._path(key), "rb") as f:
                out = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(out) != len(out):
                    raise StoreError(f"{key!r} under {self.root} changed size while being read")
                return out
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"no object {key!r} under {self.root}") from exc
        except OSError as exc:
            raise StoreError(f"cannot read {key!r} under {self.root}: {exc}") from exc

    def head(self, key: str) -> ObjectInfo:
        data = self.get(key)
        return ObjectInfo(key, len(data), self._digest(data))

    def list(self, prefix: str) -> tuple[str, ...]:
        keys = []
        for dirpath, _dirs, files in os.walk(self.root):
            rel_dir = pathlib.Path(dirpath).relative_to(self.root)
            for name in files:
                if name.startswith(_TMP_PREFIX):
                    continue
                key = (rel_dir / name).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return tuple(sorted(keys))

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._remove(self._path(key), key)

    def _remove(self, path: pathlib.Path, key: str) -> None:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {key!r} under {self.root}: {exc}") from exc
        parent = path.parent
        while parent != self.root:  # prune directories the deletes emptied
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list_uploads(self, prefix: str) -> tuple[PendingUpload, ...]:
        """Temp files of writes that have not been renamed into place (yet, or ever)."""
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            rel_dir = pathlib.Path(dirpath).relative_to(self.root)
            for name in files:
                key = (rel_dir / name).as_posix()
                if not name.startswith(_TMP_PREFIX) or not key.startswith(prefix):
                    continue
                try:
                    mtime = os.stat(pathlib.Path(dirpath) / name).st_mtime
                except FileNotFoundError:
                    continue  # renamed into place or removed while we looked
                found.append(PendingUpload(key, name, mtime))
        return tuple(sorted(found, key=lambda u: u.key))

    def abort_upload(self, upload: PendingUpload) -> None:
        """Removes a temp file; refuses any other key, so an abort can never delete an object. A
        writer still running then fails its rename (FileNotFoundError): its put raises, nothing is
        half-written."""
        name = upload.key.rpartition("/")[2]
        if not name.startswith(_TMP_PREFIX) or name != upload.upload_id:
            raise ValueError(f"{upload.key!r} is not a pending upload of this store (temp files are {_TMP_PREFIX}*)")
        self._remove(self._path(upload.key), upload.key)
