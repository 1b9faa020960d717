"""An aetcd client that talks TLS (with a client certificate) to etcd.

aetcd 1.0 only opens plaintext channels (`Client.connect` calls grpc.aio.insecure_channel), so
this subclass opens the channel itself with mTLS credentials and builds the same stubs on it.
Everything else (deadlines, keepalive, the multi-endpoint target) comes from
supervisor.eventlog.etcd.make_client, so the TLS and plaintext clients behave alike.

Hostname check: one multi-endpoint gRPC channel has one target name, so every etcd member's
server certificate must be valid for the first endpoint's host (or for `server_name`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import aetcd
import grpc
from aetcd import rpc, watcher

from ftsup.common.tls import TlsFiles, channel_credentials
from ftsup.supervisor.eventlog.etcd import DEFAULT_OP_TIMEOUT_S, client_target, make_client


class TlsClient(aetcd.Client):
    def __init__(self, credentials: grpc.ChannelCredentials, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        """Opens the TLS channel once; no await inside, so concurrent callers cannot race."""
        if self._connected.is_set():
            return
        options = list(self._options.items())
        self.channel = grpc.aio.secure_channel(f"{self._host}:{self._port}", self._credentials, options=options)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


def make_tls_client(endpoints: Sequence[str], files: TlsFiles, *, timeout_s: float = DEFAULT_OP_TIMEOUT_S,
                    server_name: str = "") -> TlsClient:
    plain = make_client(endpoints, timeout_s=timeout_s)  # the target and channel options to reuse
    host, port = client_target(endpoints)
    options = dict(plain._options)
    options["grpc.ssl_target_name_override"] = server_name or endpoints[0].rpartition(":")[0].strip("[]")
    return TlsClient(channel_credentials(files), host=host, port=port, timeout=timeout_s, options=options)


def sync_channel_factory(endpoints: Sequence[str], files: TlsFiles | None = None, *,
                         server_name: str = "") -> Callable[[], grpc.Channel]:
    """A maker of synchronous gRPC channels to the same etcd members, with the same options (and
    mTLS when `files`), for the leader's keepalive thread (supervisor/lease_keeper.py), which
    must not share the event loop's channel."""
    plain = make_client(endpoints)
    host, port = client_target(endpoints)
    options = dict(plain._options)
    if files is None:
        return lambda: grpc.insecure_channel(f"{host}:{port}", options=list(options.items()))
    options["grpc.ssl_target_name_override"] = server_name or endpoints[0].rpartition(":")[0].strip("[]")
    credentials = channel_credentials(files)
    return lambda: grpc.secure_channel(f"{host}:{port}", credentials, options=list(options.items()))
