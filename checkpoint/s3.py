"""`S3Store`: the object store on AWS S3 or any S3-compatible server (MinIO, SeaweedFS), via boto3.

Owns the boto3 clients and a thread pool that uploads parts and small objects in parallel. Every
part carries its SHA-256 (`ChecksumSHA256`), so the server rejects a body that was corrupted in
flight. Those uploads go through a second client that does not SigV4-sign the payload (botocore
would otherwise hash every byte again over plain HTTP): the signed `x-amz-checksum-sha256` header
already binds the body, as botocore itself relies on over HTTPS. One hash pass per byte; every
other call (manifests' conditional puts included) signs its payload. Credentials come from
boto3's default chain (environment, profile, instance role); they are never logged. botocore's
retries are off: trainer.checkpoint.retry is the one retry loop, with the project's Backoff and a
deadline.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bx
import urllib3.exceptions
from botocore.config import Config

from ftsup.checkpoint import digest
from ftsup.checkpoint.errors import ObjectExists, ObjectNotFound, StoreError, StoreUnavailable
from ftsup.checkpoint.retry import DEFAULT_BACKOFF, Retrier
from ftsup.checkpoint.store import Buffer, ObjectInfo, PendingUpload, validate_key
from ftsup.common.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

_RETRYABLE_CODES = {"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "BadDigest",
                    "XAmzContentSHA256Mismatch", "ConditionalRequestConflict", "OperationAborted"}
_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
_EXISTS_CODES = {"PreconditionFailed", "412"}


@dataclass(frozen=True, slots=True)
class S3Config:
    """Where and how to talk to the store. `endpoint_url=None` means AWS itself."""

    bucket: str
    endpoint_url: str | None = None
    region: str | None = None
    chunking: digest.Chunking = field(default_factory=digest.Chunking)
    max_concurrency: int = 8
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    backoff: Backoff = DEFAULT_BACKOFF

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("S3Config.bucket must be set")
        if self.max_concurrency < 1:
            raise ValueError(f"S3Config.max_concurrency must be >= 1, got {self.max_concurrency}")
        for name in ("connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"S3Config.{name} must be > 0, got {getattr(self, name)!r}")


def _status(exc: bx.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: bx.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_retryable(exc: BaseException) -> bool:
    """5xx, throttling, corrupted-in-flight bodies, timeouts and dropped connections."""
    if isinstance(exc, bx.ClientError):
        return _status(exc) >= 500 or _code(exc) in _RETRYABLE_CODES
    return isinstance(exc, (bx.ConnectionError, bx.HTTPClientError, bx.ResponseStreamingError,
                            bx.IncompleteReadError, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


class S3Store:
    def __init__(self, config: S3Config, *, retrier: Retrier | None = None) -> None:
        self.config = config
        self._retrier = retrier or Retrier(config.backoff)
        session = boto3.session.Session()
        self._client = session.client("s3", endpoint_url=config.endpoint_url, region_name=config.region,
                                      config=self._botocore_config(payload_signing=True))
        self._data_client = session.client("s3", endpoint_url=config.endpoint_url, region_name=config.region,
                                           config=self._botocore_config(payload_signing=False))
        self._pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="ftsup-s3")

    def _botocore_config(self, *, payload_signing: bool) -> Config:
        s3: dict[str, Any] = {"payload_signing_enabled": payload_signing}
        if self.config.endpoint_url:
            s3["addressing_style"] = "path"
        return Config(retries={"total_max_attempts": 1}, connect_timeout=self.config.connect_timeout_s,
                      read_timeout=self.config.read_timeout_s, max_pool_connections=self.config.max_concurrency + 4,
                      s3=s3)

    @property
    def chunking(self) -> digest.Chunking:
        return self.config.chunking

    def describe(self) -> str:
        where = self.config.endpoint_url or "aws"
        return f"s3://{self.config.bucket} at {where}"

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()
        self._data_client.close()

    # -- the one place that retries and translates ------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return self._retrier.call(f"{what} on {self.describe()}", fn, is_retryable)
        except bx.ClientError as exc:
            code, status = _code(exc), _status(exc)
            if code in _NOT_FOUND_CODES or status == 404:
                raise ObjectNotFound(f"{what}: not found on {self.describe()}") from exc
            if code in _EXISTS_CODES or status == 412:
                raise ObjectExists(f"{what}: object already exists on {self.describe()}") from exc
            raise StoreError(f"{what} on {self.describe()} failed: {code} (HTTP {status}): {exc}") from exc
        except (bx.BotoCoreError, urllib3.exceptions.HTTPError) as exc:
            if isinstance(exc, bx.NoCredentialsError):
                raise StoreError(f"{what}: no S3 credentials in the environment for {self.describe()}") from exc
            raise StoreUnavailable(f"{what} on {self.describe()} failed: {exc}") from exc

    # -- writes ------------------------------------------------------------------------------
    def put(self, key: str, data: Buffer) -> ObjectInfo:
        return self.put_many([(key, data)])[0]

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> list[ObjectInfo]:
        """Upload several objects at once: small ones whole, large ones in parts, all in the pool."""
        uploads: list[_Multipart] = []
        futures: list[tuple[int, Future[Any]]] = []
        try:
            for index, (key, data) in enumerate(items):
                validate_key(key)
                view = memoryview(data).cast("B")
                ranges = self.chunking.part_ranges(len(view))
                if len(ranges) == 1:
                    futures.append((index, self._pool.submit(self._put_single, key, view)))
                    continue
                upload = _Multipart(index, key, view, ranges, self._call(
                    f"create multipart upload {key!r}",
                    functools.partial(self._client.create_multipart_upload,
                                      Bucket=self.config.bucket, Key=key, ChecksumAlgorithm="SHA256"))["UploadId"])
                uploads.append(upload)
                for number, (a, b) in enumerate(ranges, start=1):
                    futures.append((index, self._pool.submit(self._put_part, upload, number, view[a:b])))
            results: dict[int, ObjectInfo] = {}
            part_digests: dict[int, dict[int, tuple[str, bytes]]] = {u.index: {} for u in uploads}
            for index, fut in futures:
                value = fut.result()
                if isinstance(value, ObjectInfo):
                    results[index] = value
                else:
                    number, etag, raw = value
                    part_digests[index][number] = (etag, raw)
            for upload in uploads:
                results[upload.index] = self._complete(upload, part_digests[upload.index])
                upload.completed = True
            return [results[i] for i in range(len(items))]
        except BaseException:
            for _, fut in futures:
                fut.cancel()
            for _, fut in futures:
                if not fut.cancelled():
                    fut.exception()  # let running parts finish before aborting their upload
            for upload in uploads:
                if not upload.completed:
                    self._abort_quietly(upload)
            raise

    def _put_single(self, key: str, view: memoryview, **conditions: str) -> ObjectInfo:
        raw = digest.part_digest(view)
        body = bytes(view)
        client = self._client if conditions else self._data_client  # conditional puts (manifests) sign it all
        self._call(f"put {key!r}", lambda: client.put_object(
            Bucket=self.config.bucket, Key=key, Body=body, ChecksumSHA256=digest.to_s3_checksum(raw), **conditions))
        return ObjectInfo(key, len(body), raw.hex())

    def _put_part(self, upload: _Multipart, number: int, view: memoryview) -> tuple[int, str, bytes]:
        raw = digest.part_digest(view)
        body = bytes(view)
        response = self._call(f"upload part {number} of {upload.key!r}", lambda: self._data_client.upload_part(
            Bucket=self.config.bucket, Key=upload.key, UploadId=upload.upload_id, PartNumber=number, Body=body,
            ChecksumSHA256=digest.to_s3_checksum(raw)))
        return number, response["ETag"], raw

    def _complete(self, upload: _Multipart, parts: dict[int, tuple[str, bytes]]) -> ObjectInfo:
        numbers = sorted(parts)
        expected = ObjectInfo(upload.key, len(upload.view), digest.combine([parts[n][1] for n in numbers]))
        listing = [{"PartNumber": n, "ETag": parts[n][0], "ChecksumSHA256": digest.to_s3_checksum(parts[n][1])}
                   for n in numbers]
        try:
            self._call(f"complete multipart upload {upload.key!r}", lambda: self._client.complete_multipart_upload(
                Bucket=self.config.bucket, Key=upload.key, UploadId=upload.upload_id,
                MultipartUpload={"Parts": listing}))
        except ObjectNotFound:
            # NoSuchUpload after a retry: an earlier attempt completed it and its answer was lost.
            # Accept only if what is stored now is exactly what we uploaded.
            if self.head(upload.key) != expected:
                raise
        return expected

    def _abort_quietly(self, upload: _Multipart) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self.config.bucket, Key=upload.key, UploadId=upload.upload_id)
        except Exception as exc:  # best effort; gc() aborts leftovers later
            log.warning("could not abort multipart upload of %r: %s", upload.key, exc)

    def put_if_absent(self, key: str, data: Buffer) -> ObjectInfo:
        view = memoryview(data).cast("B")
        if len(self.chunking.part_ranges(len(view))) != 1:
            raise ValueError(f"put_if_absent is for single-part objects (manifests); {key!r} is {len(view)} bytes")
        return self._put_single(validate_key(key), view, IfNoneMatch="*")

    # -- reads -------------------------------------------------------------------------------
    def head(self, key: str) -> ObjectInfo:
        validate_key(key)
        response = self._call(f"head {key!r}", lambda: self._client.head_object(
            Bucket=self.config.bucket, Key=key, ChecksumMode="ENABLED"))
        size = int(response["ContentLength"])
        stored = response.get("ChecksumSHA256")
        if stored:
            return ObjectInfo(key, size, digest.from_s3_checksum(stored))
        # Written without a SHA-256 checksum (not by us): hash what is stored.
        return ObjectInfo(key, size, digest.object_digest(self.get(key), self.chunking))

    def get(self, key: str) -> bytearray:
        validate_key(key)
        size = self.head_size(key)
        ranges = self.chunking.part_ranges(size)
        out = bytearray(size)
        view = memoryview(out)
        if len(ranges) == 1:
            self._get_range(key, 0, size, view)
        else:
            list(self._pool.map(lambda r: self._get_range(key, r[0], r[1], view[r[0]:r[1]]), ranges))
        return out

    def head_size(self, key: str) -> int:
        response = self._call(f"head {key!r}", lambda: self._client.head_object(Bucket=self.config.bucket, Key=key))
        return int(response["ContentLength"])

    def _get_range(self, key: str, start: int, end: int, into: memoryview) -> None:
        if start == end:
            return

        def attempt() -> None:
            body = self._client.get_object(Bucket=self.config.bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
            data = body.read()
            if len(data) != end - start:
                raise bx.IncompleteReadError(actual_bytes=len(data), expected_bytes=end - start)
            into[:] = data

        self._call(f"get {key!r} bytes {start}-{end - 1}", attempt)

    def list(self, prefix: str) -> tuple[str, ...]:
        def attempt() -> tuple[str, ...]:
            keys: list[str] = []
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.config.bucket, Prefix=prefix):
                keys.extend(item["Key"] for item in page.get("Contents", ()))
            return tuple(sorted(keys))

        return self._call(f"list {prefix!r}", attempt)

    def delete(self, keys: Sequence[str]) -> None:
        keys = [validate_key(k) for k in keys]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            response = self._call(f"delete {len(batch)} objects", functools.partial(
                self._client.delete_objects, Bucket=self.config.bucket, Delete={"Objects": batch, "Quiet": True}))
            errors = [e for e in response.get("Errors", ()) if e.get("Code") not in _NOT_FOUND_CODES]
            if errors:
                raise StoreError(f"delete on {self.describe()} failed for {len(errors)} objects, first: {errors[0]}")

    def list_uploads(self, prefix: str) -> tuple[PendingUpload, ...]:
        """Multipart uploads under `prefix` that were neither completed nor aborted."""

        def attempt() -> tuple[PendingUpload, ...]:
            found: dict[tuple[str, str], PendingUpload] = {}
            markers: dict[str, str] = {}
            while True:
                page = self._client.list_multipart_uploads(Bucket=self.config.bucket, Prefix=prefix, **markers)
                before = len(found)
                for item in page.get("Uploads", ()):
                    upload = PendingUpload(item["Key"], item["UploadId"], item["Initiated"].timestamp())
                    found[(upload.key, upload.upload_id)] = upload
                # SeaweedFS 4.48 sends no NextKeyMarker and its markers skip uploads: stop on a page
                # that adds nothing; a gc pass aborts what it saw and the next pass sees the rest.
                if not page.get("IsTruncated") or len(found) == before:
                    return tuple(sorted(found.values(), key=lambda u: (u.key, u.upload_id)))
                last = page["Uploads"][-1]
                markers = {"KeyMarker": page.get("NextKeyMarker") or last["Key"],
                           "UploadIdMarker": page.get("NextUploadIdMarker") or last["UploadId"]}

        return self._call(f"list multipart uploads {prefix!r}", attempt)

    def abort_upload(self, upload: PendingUpload) -> None:
        """AbortMultipartUpload; NoSuchUpload (completed or aborted meanwhile) counts as done."""
        try:
            self._call(f"abort multipart upload {upload.key!r} ({upload.upload_id})",
                       lambda: self._client.abort_multipart_upload(
                           Bucket=self.config.bucket, Key=upload.key, UploadId=upload.upload_id))
        except ObjectNotFound:
            pass


@dataclass(eq=False)
class _Multipart:
    index: int
    key: str
    view: memoryview
    ranges: tuple[tuple[int, int], ...]
    upload_id: str
    completed: bool = False
