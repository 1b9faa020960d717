"""AgentPeer hardening (issue 16): reservations released on cancellation, the node authorizer,
deadlines and a stream cap on the peer server, lazily committed buffers, pinned blobs counted.

Real gRPC on loopback (and real mTLS certificates for the identity test); cancellation is made
deterministic by cancelling the call at a known point instead of relying on load.
"""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
import random
from collections.abc import Callable

import grpc
import pytest
import structlog

from ftsup.agent.grpc_options import message_options
from ftsup.agent.peer_auth import MAX_STEP_LEAD, PeerAuthority
from ftsup.agent.peer_service import PeerService
from ftsup.agent.peers import ACCEPTED, PeerClient, PeerIdentityUnknown, PeerUnavailable
from ftsup.agent.snapshots import Blob, SnapshotStore
from ftsup.agent.streams import add_peer_service
from ftsup.common import tls
from ftsup.common.backoff import Backoff
from ftsup.harness.certs import main as certs_main
from ftsup.v1 import agent_pb2, peer_pb2, peer_pb2_grpc

LOG = structlog.get_logger("test")
LIMIT = 64 * 1024
CHUNK = 16 * 1024
PAYLOAD = random.Random(3).randbytes(CHUNK * 4 + 7)
SHA = hashlib.sha256(PAYLOAD).hexdigest()
MIB = 1024 * 1024


class Sent:
    def __init__(self) -> None:
        self.messages: list[agent_pb2.AgentMessage] = []

    def send(self, message: agent_pb2.AgentMessage, *, sticky: bool = False) -> None:
        self.messages.append(message)


def directive(generation: int = 1, ranks: tuple[int, ...] = (1,), stores: dict[str, set[int]] | None = None,
              fetches: dict[str, set[int]] | None = None, retain_from_step: int = 0) -> agent_pb2.Directive:
    grants = [agent_pb2.PeerGrant(node_id=n, store_ranks=sorted(r)) for n, r in (stores or {}).items()]
    grants += [agent_pb2.PeerGrant(node_id=n, fetch_ranks=sorted(r)) for n, r in (fetches or {}).items()]
    return agent_pb2.Directive(generation=generation, action=agent_pb2.ACTION_RUN, ranks=list(ranks),
                               retain_from_step=retain_from_step, peer_grants=grants)


class Peer:
    """One agent's AgentPeer service (node "b", running rank 1) on loopback."""

    def __init__(self, store: SnapshotStore | None = None, files: tls.TlsFiles | None = None, **service_options) -> None:
        self.store = store or SnapshotStore()
        self.reports = Sent()
        self.authority = PeerAuthority("b")
        self.authority.apply(directive(stores={"a": {0}}, fetches={"a": {0}, "c": {0}}))
        self.service = PeerService("b", self.store, self.reports, LOG, self.authority, is_tls=files is not None,
                                   chunk_bytes=CHUNK, **service_options)
        self.server = grpc.aio.server(options=message_options(LIMIT))
        add_peer_service(self.service, self.server)  # as the agent registers it: the chunk codec
        if files is None:
            self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        else:
            self.address = f"localhost:{self.server.add_secure_port('localhost:0', tls.server_credentials(files))}"

    async def __aenter__(self) -> Peer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.address, options=message_options(LIMIT))

    def holds_nothing_in_flight(self) -> bool:
        return self.store.bytes_incoming == 0 and self.service.streams == 0


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


def header(rank: int = 0, step: int = 5, owner: str = "a", size: int = len(PAYLOAD), generation: int = 1):
    return peer_pb2.SnapshotHeader(generation=generation, rank=rank, step=step, owner_node_id=owner, size_bytes=size)


def client(node_id: str = "a", credentials: grpc.ChannelCredentials | None = None) -> PeerClient:
    return PeerClient(random.Random(1), credentials, chunk_bytes=CHUNK, options=message_options(LIMIT), node_id=node_id)


async def store(peer_address: str, hdr: peer_pb2.SnapshotHeader, payload: bytes = PAYLOAD,
                node_id: str = "a", credentials: grpc.ChannelCredentials | None = None, expect: str = "b",
                deadline_s: float = 5.0) -> str:
    from ftsup.agent.streams import held_pieces, ident_of
    from ftsup.common.backoff import Backoff

    blob = Blob(hdr.generation, hdr.rank, hdr.step, hdr.owner_node_id, payload, hashlib.sha256(payload).hexdigest())
    peers = client(node_id, credentials)
    try:
        return await peers.store(peer_address, ident_of(hdr), len(payload), lambda: held_pieces(blob, CHUNK),
                                 Backoff(initial_s=0.01, max_s=0.05, deadline_s=deadline_s), node_id=expect)
    finally:
        await peers.close()


# -- item 1: the reservation is released however the call ends ----------------------------------

class StalledContext:
    """A servicer context whose go-ahead (initial metadata) never goes out: the call is cancelled there."""

    def __init__(self, messages: list[peer_pb2.SnapshotChunk]) -> None:
        self._messages = list(messages)
        self.metadata_sent = asyncio.Event()

    async def read(self):
        return self._messages.pop(0) if self._messages else await asyncio.Event().wait()

    async def send_initial_metadata(self, metadata) -> None:
        self.metadata_sent.set()
        await asyncio.Event().wait()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code, details):
        raise AssertionError(f"aborted {code}: {details}")


async def test_a_store_cancelled_between_its_reservation_and_its_data_returns_the_reservation():
    peer = Peer()
    context = StalledContext([peer_pb2.SnapshotChunk(header=header())])
    call = asyncio.create_task(peer.service.StoreSnapshot(None, context))
    await context.metadata_sent.wait()
    assert peer.store.bytes_incoming == len(PAYLOAD)  # reserved at the header
    call.cancel()  # the upstream agent died mid hand-off: CancelledError, a BaseException
    with pytest.raises(asyncio.CancelledError):
        await call
    assert peer.holds_nothing_in_flight() and len(peer.store) == 0


async def test_a_store_cancelled_mid_stream_by_its_sender_returns_the_reservation():
    async with Peer() as peer, peer.channel() as channel:
        call = peer_pb2_grpc.AgentPeerStub(channel).StoreSnapshot()
        await call.write(peer_pb2.SnapshotChunk(header=header()))
        assert (ACCEPTED, "1") in tuple(await call.initial_metadata())
        await call.write(peer_pb2.SnapshotChunk(data=PAYLOAD[:CHUNK]))
        await until(lambda: peer.store.bytes_incoming == len(PAYLOAD) and peer.service.streams == 1, "the chunk")
        call.cancel()
        await until(peer.holds_nothing_in_flight, "the buddy to return its reservation")
        assert len(peer.store) == 0 and peer.reports.messages == []


# -- item 3: bounded memory, deadlines, a stream cap ----------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def test_a_header_only_stream_declaring_200_mib_commits_no_memory():
    declared = 200 * MIB
    async with Peer(SnapshotStore(memory_limit_bytes=declared + MIB)) as peer, peer.channel() as channel:
        before = rss_bytes()
        call = peer_pb2_grpc.AgentPeerStub(channel).StoreSnapshot()
        await call.write(peer_pb2.SnapshotChunk(header=header(size=declared)))
        assert (ACCEPTED, "1") in tuple(await call.initial_metadata())
        assert peer.store.bytes_incoming == declared  # reserved against the limit...
        grown = rss_bytes() - before
        assert grown < 32 * MIB, f"a header alone raised RSS by {grown / MIB:.0f} MiB"  # ...but not committed
        call.cancel()
        await until(peer.holds_nothing_in_flight, "the reservation to be returned")


async def test_a_stream_that_sends_no_header_or_stalls_is_cut_off_and_returns_what_it_held():
    async with Peer(header_timeout_s=0.2, idle_timeout_s=0.2) as peer, peer.channel() as channel:
        silent = peer_pb2_grpc.AgentPeerStub(channel).StoreSnapshot()
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            await silent
        assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "sent no header" in cut.value.details()
        stalled = peer_pb2_grpc.AgentPeerStub(channel).StoreSnapshot()
        await stalled.write(peer_pb2.SnapshotChunk(header=header(), data=PAYLOAD[:CHUNK]))
        with pytest.raises(grpc.aio.AioRpcError) as cut:
            await stalled
        assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert f"stalled after {CHUNK} bytes" in cut.value.details()
        await until(peer.holds_nothing_in_flight, "the stalled stream's reservation to be returned")


async def test_streams_beyond_the_cap_are_refused_at_once():
    async with Peer(max_streams=1) as peer, peer.channel() as channel:
        first = peer_pb2_grpc.AgentPeerStub(channel).StoreSnapshot()
        await first.write(peer_pb2.SnapshotChunk(header=header()))
        await first.initial_metadata()
        with pytest.raises(PeerUnavailable, match="RESOURCE_EXHAUSTED .*serves 1 snapshot streams already"):
            await store(peer.address, header(step=6))
        first.cancel()
        await until(peer.holds_nothing_in_flight, "the first stream to end")
        assert await store(peer.address, header(step=6)) == "b"  # the slot is free again


async def test_a_fetch_that_stops_reading_keeps_its_blob_counted_until_it_is_cut_off():
    big = random.Random(4).randbytes(16 * MIB)  # far beyond what gRPC buffers for a reader that stalls
    async with Peer(deadline_s=lambda size: 1.0) as peer, peer.channel() as channel:
        peer.store.put(Blob(1, 0, 5, "a", big, hashlib.sha256(big).hexdigest()))
        call = peer_pb2_grpc.AgentPeerStub(channel).FetchSnapshot(
            peer_pb2.FetchSnapshotRequest(rank=0, step=5, generation=1, node_id="a"))
        assert (await call.read()).header.step == 5  # one chunk, then the reader stalls
        peer.store.set_retain_from_step(6)  # retention drops the blob while it is being streamed
        assert peer.store.keys() == [] and peer.store.bytes_held == len(big) == peer.store.bytes_pinned
        await until(lambda: peer.store.bytes_held == 0 and peer.service.streams == 0, "the stalled fetch to be cut off")
        call.cancel()


# -- item 2: the node authorizer --------------------------------------------------------------------

async def test_the_buddy_takes_its_owners_ranks_and_reports_their_sha256():
    async with Peer() as peer:
        assert await store(peer.address, header()) == "b"
        assert bytes(peer.store.get(0, 5).payload) == PAYLOAD
        report = peer.reports.messages[-1].snapshot_report
        assert (report.rank, report.step, report.sha256) == (0, 5, SHA)


@pytest.mark.parametrize(("node_id", "hdr", "code", "reason"), [
    ("c", header(owner="c"), "PERMISSION_DENIED", "node 'c'.*not node 'c''s buddy|is not node 'c'"),
    ("a", header(rank=1), "PERMISSION_DENIED", "rank 1 is run by node b itself"),
    ("a", header(rank=2), "PERMISSION_DENIED", "not node 'a''s buddy for rank 2"),
    ("a", header(step=2**64 - 1), "INVALID_ARGUMENT", "beyond this generation's progress"),
    ("a", header(generation=0), "FAILED_PRECONDITION", "generation 0 is over"),
], ids=["not-a-buddy", "own-rank", "other-rank", "absurd-step", "old-generation"])
async def test_a_store_the_directive_does_not_grant_is_refused_and_replaces_nothing(node_id, hdr, code, reason):
    async with Peer() as peer:
        mine = Blob(1, hdr.rank, hdr.step, "b", b"the node's own", hashlib.sha256(b"the node's own").hexdigest())
        peer.store.put(mine)
        kept = peer.store.keys()
        with pytest.raises(PeerUnavailable, match=f"refused: {code} .*({reason})"):
            await store(peer.address, hdr, node_id=node_id)
        assert peer.store.keys() == kept and peer.store.get(hdr.rank, hdr.step) is mine
        # The refusal's status reaches the sender before the handler has unwound its slot.
        await until(peer.holds_nothing_in_flight, "the refused call to end")
        assert peer.store.bytes_incoming == 0 and peer.reports.messages == []


async def test_steps_up_to_the_lead_past_the_progress_reached_are_taken():
    async with Peer() as peer:
        peer.authority.apply(directive(stores={"a": {0}}, retain_from_step=100))
        assert await store(peer.address, header(step=100 + MAX_STEP_LEAD)) == "b"
        with pytest.raises(PeerUnavailable, match="INVALID_ARGUMENT .*step 1125 is beyond"):
            await store(peer.address, header(step=101 + MAX_STEP_LEAD))


async def test_a_store_for_a_generation_the_buddy_has_not_applied_yet_is_retried_until_it_has():
    async with Peer() as peer:
        early: list[object] = []
        denial = peer.authority.store_denial
        peer.authority.store_denial = lambda *args: early.append(args) or denial(*args)  # type: ignore[method-assign]
        attempt = asyncio.create_task(store(peer.address, header(generation=2)))
        await until(lambda: early, "the first (early) attempt")
        peer.authority.apply(directive(generation=2, stores={"a": {0}}))
        assert await attempt == "b" and len(early) >= 2


async def test_a_fetch_needs_a_grant_for_that_rank():
    async with Peer() as peer:
        peer.store.put(Blob(1, 0, 5, "a", PAYLOAD, SHA))
        peer.store.put(Blob(1, 1, 5, "b", PAYLOAD, SHA))
        peers = client("c")
        try:
            assert bytes((await peers.fetch(peer.address, 0, 5, generation=1)).payload) == PAYLOAD
            with pytest.raises(PeerUnavailable, match="PERMISSION_DENIED .*node 'c' neither restores nor verifies rank 1"):
                await peers.fetch(peer.address, 1, 5, generation=1)
        finally:
            await peers.close()
        stranger = client("d")
        try:
            with pytest.raises(PeerUnavailable, match="PERMISSION_DENIED"):
                await stranger.fetch(peer.address, 0, 5, generation=1)
        finally:
            await stranger.close()


async def test_with_mtls_the_callers_certificate_decides_not_its_claims(tmp_path: pathlib.Path):
    assert certs_main(["--out", str(tmp_path), "--nodes", "a,b,c"]) == 0

    def files(node: str) -> tls.TlsFiles:
        return tls.TlsFiles(tmp_path / f"node-{node}.pem", tmp_path / f"node-{node}.key", tmp_path / "ca.pem")

    async with Peer(files=files("b")) as peer:
        as_a, as_c = tls.channel_credentials(files("a")), tls.channel_credentials(files("c"))
        assert await store(peer.address, header(), credentials=as_a) == "b"
        # Node c's certificate, claiming to be a (the header's owner and the fetch's node id):
        with pytest.raises(PeerUnavailable, match="PERMISSION_DENIED .*node 'c' may store only its own"):
            await store(peer.address, header(step=6), node_id="a", credentials=as_c)
        liar = PeerClient(random.Random(1), as_c, chunk_bytes=CHUNK, options=message_options(LIMIT), node_id="a")
        try:
            with pytest.raises(PeerUnavailable, match="claims node 'a' but its certificate is node/c"):
                await liar.fetch(peer.address, 0, 5, generation=1, node_id="b")
        finally:
            await liar.close()
        assert peer.store.keys() == [(0, 5)]


async def test_with_mtls_a_peer_presenting_another_nodes_certificate_is_refused(tmp_path: pathlib.Path):
    """The client pins the node it expects at the address (the directive's buddy, a restore's or
    an SDC check's source): node c answering where b was expected never gets a snapshot."""
    assert certs_main(["--out", str(tmp_path), "--nodes", "a,b,c"]) == 0

    def files(node: str) -> tls.TlsFiles:
        return tls.TlsFiles(tmp_path / f"node-{node}.pem", tmp_path / f"node-{node}.key", tmp_path / "ca.pem")

    as_a = tls.channel_credentials(files("a"))
    async with Peer(files=files("c")) as impostor:
        with pytest.raises(PeerUnavailable, match="UNAVAILABLE"):
            await store(impostor.address, header(), credentials=as_a, expect="b", deadline_s=0.3)
        assert impostor.store.keys() == [] and impostor.holds_nothing_in_flight()
        fetcher = client("a", as_a)
        impostor.store.put(Blob(1, 0, 5, "a", PAYLOAD, SHA))
        try:
            with pytest.raises(PeerUnavailable, match="UNAVAILABLE"):
                await fetcher.fetch(impostor.address, 0, 5, generation=1, node_id="b",
                                    backoff=Backoff(initial_s=0.01, max_s=0.05, deadline_s=0.3))
            with pytest.raises(PeerIdentityUnknown, match="must name the node expected"):
                await fetcher.fetch(impostor.address, 0, 5, generation=1)
            # the same address, pinned to the node whose certificate it presents, is served
            await store(impostor.address, header(step=6, owner="a"), credentials=as_a, expect="c")
            assert (0, 6) in impostor.store.keys()
        finally:
            await fetcher.close()


def test_a_pinned_blob_is_counted_until_its_last_reader_lets_go_and_a_foreign_one_never():
    store = SnapshotStore()
    held = Blob(1, 0, 5, "a", PAYLOAD, SHA)
    store.put(held)
    with store.pin(held), store.reading(0, 5) as again:
        assert again is held
        store.set_retain_from_step(6)  # dropped while two readers stream it
        assert store.keys() == [] and store.bytes_held == store.bytes_pinned == len(PAYLOAD)
        with store.pin(held):  # a third reader of the pinned blob
            pass
        assert store.bytes_held == len(PAYLOAD)
    assert store.bytes_held == store.bytes_pinned == 0
    with store.pin(Blob(1, 0, 7, "a", PAYLOAD, SHA)):  # never held here: nothing to count
        assert store.bytes_held == 0


def test_a_rank_s_snapshot_may_not_declare_far_more_than_its_largest_and_the_default_limit_is_half_the_ram():
    from ftsup.agent.snapshots import SIZE_GROWTH_LIMIT, SnapshotId, physical_memory_bytes
    from ftsup.common.chunks import OversizedStream

    store = SnapshotStore()
    assert store.memory_limit_bytes == physical_memory_bytes() // 2
    store.put(Blob(1, 0, 5, "a", PAYLOAD, SHA))
    store.receive(SnapshotId(1, 0, 6, "a"), SIZE_GROWTH_LIMIT * len(PAYLOAD)).truncated()  # grows within the bound
    with pytest.raises(OversizedStream, match=f"over {SIZE_GROWTH_LIMIT}x the largest snapshot of rank 0"):
        store.receive(SnapshotId(1, 0, 7, "a"), SIZE_GROWTH_LIMIT * len(PAYLOAD) + 1)
    store.receive(SnapshotId(1, 1, 7, "a"), 200 * MIB).truncated()  # another rank's first: the limit alone
    assert store.bytes_incoming == 0
