"""Session-wide fixtures. The etcd cluster is expensive: one per test session, started on first use;
tests stay independent by using distinct key prefixes (`etcd_prefix`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.etcd_cluster import EtcdCluster, tmpfs_root
from tests.support.s3_server import S3Server


@pytest.fixture(scope="session")
def etcd_cluster() -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmpfs_root())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def etcd(etcd_cluster: EtcdCluster) -> Iterator[EtcdCluster]:
    """The session cluster, healed (every member running and healthy) after a test that broke it."""
    yield etcd_cluster
    etcd_cluster.heal()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One real S3-compatible server (SeaweedFS) per session; tests use their own key prefixes."""
    server = S3Server(tmpfs_root("s3"))
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def etcd_prefix() -> str:
    return f"/ftsup-test/{uuid.uuid4().hex[:12]}"
