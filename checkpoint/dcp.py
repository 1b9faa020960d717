"""DCP storage layer over an ObjectStore: `torch.distributed.checkpoint` plans, we move the bytes.

DCP decides what each rank saves (deduplicating replicated tensors, splitting DTensor shards) and,
on load, which saved chunks each rank needs for *its* layout: that is what makes FSDP/sharded
state and load-time resharding work. This module only stores a rank's items as raw tensor bytes
in one or more objects (`__<rank>_<n>.distcp`, each item 64-byte aligned) uploaded in parallel
through the store, and the coordinator's `.metadata` (DCP's pickled plan, plus where each item
lives). The reader checks every object it downloads against the manifest's SHA-256 before any
byte reaches a tensor or an unpickler; even then (a rank may have written a poisoned object before
the commit recorded its digest honestly) `.metadata` is unpickled with an allow-list of DCP's own
metadata classes, and BYTE_IO items load with `torch.load(weights_only=True)` (verify.py has the
whole chain of trust). Committing is not done here: see catalog.commit.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._nested_dict import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import CheckpointNotCommitted, ObjectCorrupt
from ftsup.checkpoint.manifest import DCP_METADATA_NAME, Layout, Manifest, ShardIndex, validate_checkpoint_id
from ftsup.checkpoint.store import ObjectInfo, ObjectStore
from ftsup.checkpoint.verify import UntrustedCheckpoint

_ALIGN = 64


@dataclass(frozen=True)
class ItemLocation:
    """Where one saved item lives: object name within the checkpoint, byte range, and tensor dtype/shape."""

    name: str
    offset: int
    length: int
    dtype: str | None  # e.g. "float32"; None for pickled/bytes items
    shape: tuple[int, ...] | None


@dataclass(frozen=True)
class _Prefix:
    prefix: str


def _item_bytes(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    numel = 1
    for s in item.tensor_data.size:
        numel *= s
    return numel * int(item.tensor_data.properties.dtype.itemsize)


def _split(items: list[WriteItem], bins: int) -> list[list[WriteItem]]:
    """Largest first into the lightest bin, so a rank's objects are about equal in size."""
    buckets: list[list[WriteItem]] = [[] for _ in range(bins)]
    sizes = [0] * bins
    for item in sorted(items, key=_item_bytes, reverse=True):
        i = sizes.index(min(sizes))
        buckets[i].append(item)
        sizes[i] += _item_bytes(item)
    return [b for b in buckets if b] or [[]]


def _raw_view(data: Any) -> tuple[memoryview, str | None, tuple[int, ...] | None]:
    if isinstance(data, io.BytesIO):
        return data.getbuffer(), None, None
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    tensor = tensor.contiguous()
    shape = tuple(tensor.shape)
    if tensor.numel() == 0:
        return memoryview(b""), str(tensor.dtype).removeprefix("torch."), shape
    raw = tensor.reshape(-1).view(torch.uint8)
    return memoryview(raw.numpy()), str(tensor.dtype).removeprefix("torch."), shape


class ObjectStoreWriter(StorageWriter):
    """DCP StorageWriter that stores a rank's items as `objects_per_rank` objects through `store`."""

    def __init__(self, store: ObjectStore, layout: Layout, checkpoint_id: str, *, objects_per_rank: int = 1) -> None:
        super().__init__()
        if objects_per_rank < 1:
            raise ValueError(f"objects_per_rank must be >= 1, got {objects_per_rank}")
        self.store, self.layout = store, layout
        self.checkpoint_id = validate_checkpoint_id(checkpoint_id)
        self.objects_per_rank = objects_per_rank
        self.rank = 0
        self.is_coordinator = False
        self._written: list[ObjectInfo] = []

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.checkpoint_id = validate_checkpoint_id(str(checkpoint_id))
        self._written = []

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(p, storage_data=_Prefix(f"__{i}_")) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = plan.storage_data.prefix if isinstance(plan.storage_data, _Prefix) else f"__{self.rank}_"
        uploads: list[tuple[str, bytearray]] = []
        results: list[WriteResult] = []
        for n, bucket in enumerate(_split(list(plan.items), self.objects_per_rank)):
            name = f"{prefix}{n}.distcp"
            views, offset = [], 0
            for item in bucket:
                view, dtype, shape = _raw_view(planner.resolve_data(item))
                views.append((offset, view))
                results.append(WriteResult(index=item.index, size_in_bytes=len(view),
                                           storage_data=ItemLocation(name, offset, len(view), dtype, shape)))
                offset += -(-len(view) // _ALIGN) * _ALIGN
            buf = bytearray(offset)
            for start, view in views:
                buf[start:start + len(view)] = view
            uploads.append((self.layout.data_key(self.checkpoint_id, name), buf))
        self._written.extend(self.store.put_many(uploads))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rank_results in results for wr in rank_results}
        key = self.layout.data_key(self.checkpoint_id, DCP_METADATA_NAME)
        self._written.append(self.store.put(key, pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)))

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked automatically: callers pass the writer explicitly

    def shard_index(self) -> ShardIndex:
        """The objects this rank wrote (the coordinator's include `.metadata`); valid after dcp.save."""
        return ShardIndex(self.checkpoint_id, self.rank, tuple(sorted(self._written, key=lambda o: o.key)))


_METADATA_CLASSES = frozenset({
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
        "ChunkStorageMetadata", "StorageMeta", "_MEM_FORMAT_ENCODING",
    )
} | {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
     (__name__, "ItemLocation")})


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's `.metadata` with only the classes it is made of (and torch dtypes): a pickle
    naming anything else (`os.system`, `builtins.exec`) is refused before that name is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UntrustedCheckpoint(f"DCP metadata names {module}.{name}, which is not part of DCP metadata;"
                                  " refusing to unpickle it")


def load_metadata(data: bytes | bytearray, where: str) -> Metadata:
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UntrustedCheckpoint:
        raise
    except Exception as exc:
        raise ObjectCorrupt(f"{where}: DCP metadata does not decode: {exc}") from exc
    if not isinstance(metadata, Metadata):
        raise ObjectCorrupt(f"{where}: holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def load_item_safely(value: io.BytesIO, where: str) -> Any:
    """A BYTE_IO item through torch's weights-only unpickler (tensors, containers, primitives)."""
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UntrustedCheckpoint(f"{where} needs an unrestricted unpickle (it names code to run or"
                                  f" classes beyond plain data); refusing to load it: {exc}") from exc


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that BYTE_IO items load with `weights_only=True` (the
    default planner of torch 2.x uses `weights_only=False`, i.e. runs whatever the pickle says)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        obj = load_item_safely(value, f"checkpoint item {fqn!r}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


class ObjectStoreReader(StorageReader):
    """DCP StorageReader for a committed checkpoint: reads only objects its manifest lists, verified."""

    def __init__(self, store: ObjectStore, layout: Layout, manifest: Manifest, *, max_concurrency: int = 4) -> None:
        super().__init__()
        self.store, self.layout, self.manifest = store, layout, manifest
        self._expected = {o.key: o for o in manifest.objects}
        self._max_concurrency = max_concurrency
        self.storage_data: dict[Any, ItemLocation] = {}
        self._metadata: Metadata | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id and str(checkpoint_id) != self.manifest.checkpoint_id:
            raise ValueError(f"reader is bound to checkpoint {self.manifest.checkpoint_id!r}, not {checkpoint_id!r}")
        self.storage_data = {}

    def _fetch(self, name: str) -> bytearray:
        key = self.layout.data_key(self.manifest.checkpoint_id, name)
        expected = self._expected.get(key)
        if expected is None:
            raise CheckpointNotCommitted(f"{key!r} is not listed in the manifest of {self.manifest.checkpoint_id!r}")
        data = self.store.get(key)
        observed = ObjectInfo(key, len(data), digest.object_digest(data, self.manifest.chunking))
        if observed != expected:
            raise ObjectCorrupt(f"{key!r} read from {self.store.describe()} is {observed.size_bytes} bytes with"
                                f" SHA-256 {observed.sha256}; the manifest records {expected.size_bytes} bytes,"
                                f" {expected.sha256}")
        return data

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.verified_metadata()

    def verified_metadata(self) -> Metadata:
        """DCP's metadata, checked against the manifest, then unpickled with the allow-list; cached.
        Call it before dcp.load to get its errors as raised (DCP reports them as an AssertionError)."""
        if self._metadata is None:
            where = self.layout.data_key(self.manifest.checkpoint_id, DCP_METADATA_NAME)
            metadata = load_metadata(self._fetch(DCP_METADATA_NAME), where)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            self._metadata = metadata
        return self._metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise ObjectCorrupt(f"DCP metadata of {self.manifest.checkpoint_id!r} has no storage data")
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_object: dict[str, list[Any]] = {}
        for item in plan.items:
            per_object.setdefault(self.storage_data[item.storage_index].name, []).append(item)
        with ThreadPoolExecutor(self._max_concurrency, thread_name_prefix="ftsup-dcp-read") as pool:
            fetched = dict(zip(per_object, pool.map(self._fetch, per_object), strict=True))
        for name, items in per_object.items():
            data = fetched[name]
            for item in items:
                loc = self.storage_data[item.storage_index]
                if item.type == LoadItemType.BYTE_IO:
                    raw = io.BytesIO(bytes(data[loc.offset:loc.offset + loc.length]))
                    if not isinstance(planner, SafeLoadPlanner):
                        # Another planner may unpickle without restriction: prove the bytes load
                        # through the weights-only unpickler first (pass SafeLoadPlanner to skip this).
                        load_item_safely(raw, f"checkpoint item {item.dest_index.fqn!r} in {name!r}")
                        raw.seek(0)
                    planner.load_bytes(item, raw)
                    continue
                tensor = _tensor_at(data, loc)
                tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                if target.size() != tensor.size():
                    raise ObjectCorrupt(f"{item.storage_index} has size {tuple(tensor.size())} in"
                                        f" {name!r}, the plan expects {tuple(target.size())}")
                target.copy_(tensor)
                planner.commit_tensor(item, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


def _tensor_at(data: bytearray, loc: ItemLocation) -> torch.Tensor:
    if loc.dtype is None or loc.shape is None:
        raise ObjectCorrupt(f"item at {loc.name}@{loc.offset} has no dtype/shape")
    dtype = getattr(torch, loc.dtype)
    if loc.length == 0:
        return torch.empty(loc.shape, dtype=dtype)
    numel = loc.length // dtype.itemsize
    return torch.frombuffer(data, dtype=dtype, count=numel, offset=loc.offset).reshape(loc.shape)
