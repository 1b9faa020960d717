"""Opening a checkpoint location from one string: `s3://bucket/prefix` or a local directory.

The S3 endpoint (AWS when absent; MinIO, SeaweedFS, ... otherwise) and region are separate
settings, credentials come only from boto3's default chain (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY, a profile, an instance role) and are never part of the location, so a
location string is safe to log.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from ftsup.checkpoint.manifest import Layout
from ftsup.checkpoint.store import ObjectStore


@dataclass(frozen=True, slots=True)
class Location:
    scheme: str  # "s3" or "file"
    bucket_or_dir: str
    prefix: str


def parse_location(url: str) -> Location:
    """`s3://bucket[/prefix]`, `file:///dir[...]` or a plain path; ValueError naming the value otherwise."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"checkpoint location {url!r} has no bucket (expected s3://bucket/prefix)")
        return Location("s3", parsed.netloc, parsed.path.strip("/"))
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme == "file" else url
        if not path:
            raise ValueError("checkpoint location is empty")
        return Location("file", path, "")
    raise ValueError(f"checkpoint location {url!r}: scheme {parsed.scheme!r} is not s3:// or file://")


def open_location(url: str, *, endpoint_url: str | None = None, region: str | None = None,
                  max_concurrency: int = 8, read_timeout_s: float | None = None,
                  retry_deadline_s: float | None = None) -> tuple[ObjectStore, Layout]:
    """The store and the layout of checkpoints under `url` (local directories hold them at the root).

    `read_timeout_s` and `retry_deadline_s` (S3 only; None: S3Config's and DEFAULT_BACKOFF's) bound
    how long one answer and one operation with its retries may take before the write fails.
    """
    location = parse_location(url)
    if location.scheme == "s3":
        import dataclasses

        from ftsup.checkpoint.retry import DEFAULT_BACKOFF
        from ftsup.checkpoint.s3 import S3Config, S3Store

        config = S3Config(bucket=location.bucket_or_dir, endpoint_url=endpoint_url, region=region,
                          max_concurrency=max_concurrency)
        if read_timeout_s is not None:
            config = dataclasses.replace(config, read_timeout_s=read_timeout_s)
        if retry_deadline_s is not None:
            if not retry_deadline_s > 0:
                raise ValueError(f"retry_deadline_s must be > 0, got {retry_deadline_s!r}")
            config = dataclasses.replace(config, backoff=dataclasses.replace(DEFAULT_BACKOFF,
                                                                             deadline_s=retry_deadline_s))
        return S3Store(config), Layout(location.prefix)
    from ftsup.checkpoint.local import LocalDirStore

    return LocalDirStore(location.bucket_or_dir, max_concurrency=max_concurrency), Layout("")
