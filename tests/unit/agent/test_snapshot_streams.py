"""Snapshot chunk streams through real in-process gRPC endpoints: trainer -> agent -> buddy, and back.

Each endpoint runs with a 64 KiB per-message limit and 16 KiB chunks, so a 1 MiB snapshot is the
same path as a multi-GiB one under the real 8 MiB limit (the one-message design refused anything
over its limit): cheap to run, and the tests show the limit is real. Covered: the payload arrives
byte-identical at the agent and its buddy, the buddy starts receiving before the trainer has sent
the rest (pipelined), and a truncated, oversized, short, repeated-header or mismatched stream is
refused with the reason while neither agent keeps or reserves anything of it; a full store refuses
before the bytes come; restores stream from the buddy into a new node's store and on to a trainer.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
from collections.abc import Callable
from types import SimpleNamespace

import grpc
import pytest
import structlog

from ftsup.agent.grpc_options import message_options
from ftsup.agent.peer_auth import PeerAuthority
from ftsup.agent.peer_service import PeerService
from ftsup.agent.peers import PeerClient, PeerUnavailable, SnapshotMissing
from ftsup.agent.restore import RestoreBook, RestoreSource
from ftsup.agent.snapshots import SnapshotId, SnapshotStore
from ftsup.agent.streams import add_peer_service, add_trainer_link
from ftsup.agent.trainer_api import TrainerLinkService
from ftsup.common.chunks import InvalidSnapshot, TruncatedStream
from ftsup.trainer.agent_client import AgentClient, AgentLinkError, HeldSnapshot, _assemble
from ftsup.v1 import agent_pb2, events_pb2, peer_pb2, peer_pb2_grpc

LOG = structlog.get_logger("test")
LIMIT = 64 * 1024  # per message
CHUNK = 16 * 1024
SIZE = 1024 * 1024 + 123  # 16x the message limit, the last chunk partial
PAYLOAD = random.Random(0).randbytes(SIZE)
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class Sent:
    """Stands in for the supervisor link's report queue."""

    def __init__(self) -> None:
        self.messages: list = []

    def send(self, message, *, sticky: bool = False) -> None:
        self.messages.append(message)

    def holdings(self) -> list[tuple[int, int, list[str], int]]:
        return [(m.snapshot_report.rank, m.snapshot_report.step, list(m.snapshot_report.holder_node_ids),
                 m.snapshot_report.size_bytes) for m in self.messages if m.WhichOneof("kind") == "snapshot_report"]


class Node:
    """One agent's snapshot endpoints (AgentPeer and TrainerLink) on loopback."""

    def __init__(self, node_id: str, memory_limit_bytes: int = 0) -> None:
        self.node_id = node_id
        self.store = SnapshotStore(memory_limit_bytes=memory_limit_bytes)
        self.reports = Sent()
        self.peers = PeerClient(random.Random(1), chunk_bytes=CHUNK, options=message_options(LIMIT), node_id=node_id)
        self.authority = PeerAuthority(node_id)
        self.restores = RestoreBook(node_id, self.store, self.peers, LOG)
        self.run = SimpleNamespace(generation=1, ranks=(0,), buddy_address="", buddy_node_id="", checkpoint_steps=(),
                                   replaced=asyncio.Event())
        self.server = grpc.aio.server(options=message_options(LIMIT))
        self.address = ""

    async def start(self) -> Node:
        # As the agent registers them: their snapshot streams through the chunk codec.
        add_peer_service(PeerService(self.node_id, self.store, self.reports, LOG, self.authority, chunk_bytes=CHUNK),
                         self.server)
        launcher = SimpleNamespace(run=self.run, mark_attached=lambda generation, rank: None)
        link = TrainerLinkService(self.node_id, launcher, self.store, self.restores,
                                  self.peers, self.reports, LOG, chunk_bytes=CHUNK)
        add_trainer_link(link, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        await self.server.start()
        return self

    def grant(self, generation: int = 1, stores: dict[str, set[int]] | None = None,
              fetches: dict[str, set[int]] | None = None) -> None:
        """What the supervisor's directive would let other nodes store here and fetch from here."""
        grants = [agent_pb2.PeerGrant(node_id=node, store_ranks=sorted(ranks)) for node, ranks in (stores or {}).items()]
        grants += [agent_pb2.PeerGrant(node_id=node, fetch_ranks=sorted(ranks)) for node, ranks in (fetches or {}).items()]
        self.authority.apply(agent_pb2.Directive(generation=generation, action=agent_pb2.ACTION_RUN,
                                                 ranks=list(self.run.ranks), peer_grants=grants))

    async def stop(self) -> None:
        self.restores.cancel()
        await self.peers.close()
        await self.server.stop(0)

    def holds_nothing(self) -> bool:
        return len(self.store) == 0 and self.store.bytes_held == 0 and self.store.bytes_incoming == 0


async def until(predicate: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def pair():
    a, b = await Node("a").start(), await Node("b").start()
    a.run.buddy_address = b.address
    a.run.buddy_node_id = "b"
    b.run.ranks = (1,)
    b.grant(stores={"a": {0}}, fetches={"a": {0}, "spare": {0}})
    yield a, b
    await a.stop()
    await b.stop()


def header(step: int = 5, size: int = SIZE, rank: int = 0) -> peer_pb2.SnapshotHeader:
    return peer_pb2.SnapshotHeader(generation=1, rank=rank, step=step, owner_node_id="a", size_bytes=size)


def chunk(data: bytes = b"", sha256: str = "", head: peer_pb2.SnapshotHeader | None = None) -> peer_pb2.SnapshotChunk:
    return peer_pb2.SnapshotChunk(header=head, data=data, sha256=sha256)


def client(node: Node) -> AgentClient:
    return AgentClient(node.address, chunk_bytes=CHUNK, max_message_bytes=LIMIT)


async def put_raw(node: Node, messages: list[peer_pb2.SnapshotChunk], *, close: bool = True) -> grpc.aio.AioRpcError:
    """Sends `messages` on TrainerLink.PutSnapshot; returns the error the agent answered with."""
    async with grpc.aio.insecure_channel(node.address, options=message_options(LIMIT)) as channel:
        call = peer_pb2_grpc.TrainerLinkStub(channel).PutSnapshot()
        for message in messages:
            await call.write(message)
        if close:
            await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        return refused.value


async def test_a_snapshot_16_times_the_message_limit_reaches_the_agent_and_its_buddy_intact(pair):
    a, b = pair
    sha = await asyncio.to_thread(client(a).put_snapshot, header(), PAYLOAD)
    assert sha == SHA
    for node in (a, b):
        held = node.store.get(0, 5)
        assert held is not None and bytes(held.payload) == PAYLOAD and held.sha256 == SHA
        assert node.store.bytes_held == SIZE and node.store.bytes_incoming == 0
    assert a.reports.holdings() == [(0, 5, ["a"], SIZE)]
    assert b.reports.holdings() == [(0, 5, ["b"], SIZE)]


async def test_the_per_message_limit_is_real_a_snapshot_in_one_message_is_refused(pair):
    a, b = pair
    whole = AgentClient(a.address, chunk_bytes=SIZE, max_message_bytes=2 * SIZE)  # one chunk: the old design
    with pytest.raises(AgentLinkError, match="PutSnapshot failed with RESOURCE_EXHAUSTED"):
        await asyncio.to_thread(whole.put_snapshot, header(), PAYLOAD)
    assert a.holds_nothing() and b.holds_nothing()


async def test_the_buddy_receives_the_first_chunks_before_the_trainer_sent_the_last(pair):
    a, b = pair
    async with grpc.aio.insecure_channel(a.address, options=message_options(LIMIT)) as channel:
        call = peer_pb2_grpc.TrainerLinkStub(channel).PutSnapshot()
        await call.write(chunk(PAYLOAD[:CHUNK], head=header()))
        # Pipelined: the buddy reserved the snapshot (its header came with the first chunk) while
        # the trainer has sent one chunk of 65.
        await until(lambda: b.store.bytes_incoming == SIZE, "the buddy to start receiving")
        assert a.store.get(0, 5) is None and b.store.get(0, 5) is None
        for start in range(CHUNK, SIZE, CHUNK):
            end = min(start + CHUNK, SIZE)
            await call.write(chunk(PAYLOAD[start:end], SHA if end == SIZE else ""))
        await call.done_writing()
        await call
    assert bytes(a.store.get(0, 5).payload) == PAYLOAD and bytes(b.store.get(0, 5).payload) == PAYLOAD


async def test_a_trainer_that_stops_mid_stream_leaves_nothing_on_either_agent(pair):
    a, b = pair
    async with grpc.aio.insecure_channel(a.address, options=message_options(LIMIT)) as channel:
        call = peer_pb2_grpc.TrainerLinkStub(channel).PutSnapshot()
        await call.write(chunk(PAYLOAD[:CHUNK], head=header()))
        await call.write(chunk(PAYLOAD[CHUNK:3 * CHUNK]))
        await until(lambda: b.store.bytes_incoming == SIZE, "the buddy to start receiving")
        call.cancel()  # the trainer died
    await until(lambda: a.holds_nothing() and b.holds_nothing(), "both agents to discard the partial snapshot")


async def test_a_stream_closed_without_its_last_chunk_is_refused_as_truncated(pair):
    a, b = pair
    refused = await put_raw(a, [chunk(PAYLOAD[:CHUNK], head=header()), chunk(PAYLOAD[CHUNK:2 * CHUNK])])
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"stream ended after {2 * CHUNK} of the declared {SIZE} bytes, without its last chunk" in refused.details()
    await until(lambda: a.holds_nothing() and b.holds_nothing(), "both agents to discard the partial snapshot")


async def test_a_hash_mismatch_is_refused_and_the_buddy_drops_its_complete_copy(pair):
    a, b = pair
    wrong = hashlib.sha256(b"something else").hexdigest()
    messages = [chunk(PAYLOAD[s:s + CHUNK], head=header() if s == 0 else None) for s in range(0, SIZE, CHUNK)]
    messages[-1].sha256 = wrong
    refused = await put_raw(a, messages)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"sha256 mismatch (claimed {wrong}, payload has {SHA})" in refused.details()
    # Every byte had reached the buddy; the owner never forwarded the sha256, and cancelled.
    await until(lambda: a.holds_nothing() and b.holds_nothing(), "both agents to discard the snapshot")
    assert a.reports.holdings() == [] and b.reports.holdings() == []


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([chunk(b"x" * 11, hashlib.sha256(b"x" * 11).hexdigest(), header(size=10))],
         "stream carries more than the declared 10 bytes"),
        ([chunk(b"x" * 4, hashlib.sha256(b"x" * 4).hexdigest(), header(size=10))],
         "stream closed after 4 of the declared 10 bytes"),
        ([chunk(b"x" * 4, head=header(size=8)), chunk(b"x" * 4, hashlib.sha256(b"x" * 8).hexdigest(), header(size=8))],
         "a second header in the stream"),
        ([chunk(b"x" * 8, hashlib.sha256(b"x" * 8).hexdigest(), header(size=8)), chunk(b"y")],
         "a chunk arrived after the one carrying the sha256"),
        ([chunk(b"x" * 8, hashlib.sha256(b"x" * 8).hexdigest())], "first chunk carries no header"),
        ([chunk(b"", hashlib.sha256(b"").hexdigest(), header(size=0))], "empty payload"),
        ([], "snapshot stream ended before its first chunk"),
    ],
    ids=["oversized", "size-mismatch", "second-header", "data-after-end", "no-header", "empty", "no-chunk"],
)
async def test_malformed_streams_are_refused_with_the_reason_and_nothing_is_kept(pair, messages, reason):
    a, b = pair
    refused = await put_raw(a, messages)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in refused.details()
    await until(lambda: a.holds_nothing() and b.holds_nothing(), "both agents to hold nothing")


async def test_a_snapshot_over_the_memory_limit_is_refused_before_its_bytes_come():
    limit = SIZE + SIZE // 2
    a = await Node("a", memory_limit_bytes=limit).start()
    try:
        await asyncio.to_thread(client(a).put_snapshot, header(step=5), PAYLOAD)  # no buddy: held here only
        refused = await put_raw(a, [chunk(PAYLOAD[:CHUNK], head=header(step=6))], close=False)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # room may come: retention drops old steps
        assert f"{SIZE} bytes held + 0 arriving + {SIZE} > the limit of {limit} bytes" in refused.details()
        with pytest.raises(AgentLinkError, match="PutSnapshot failed with RESOURCE_EXHAUSTED: .* > the limit"):
            await asyncio.to_thread(client(a).put_snapshot, header(step=6), PAYLOAD)
        refused = await put_raw(a, [chunk(PAYLOAD[:CHUNK], head=header(step=7, size=limit + 1))], close=False)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT  # can never fit
        assert f"declared size {limit + 1} bytes is over the limit of {limit} bytes" in refused.details()
        assert a.store.keys() == [(0, 5)] and a.store.bytes_held == SIZE and a.store.bytes_incoming == 0
    finally:
        await a.stop()


async def test_a_buddy_without_room_refuses_its_copy_and_the_trainer_is_still_answered():
    a, b = await Node("a").start(), await Node("b", memory_limit_bytes=SIZE // 2).start()
    a.run.buddy_address = b.address
    a.run.buddy_node_id = "b"
    b.run.ranks = (1,)
    b.grant(stores={"a": {0}})
    attempts = []
    receive = b.store.receive
    b.store.receive = lambda *args: attempts.append(args) or receive(*args)
    try:
        await asyncio.to_thread(client(a).put_snapshot, header(), PAYLOAD)
        assert bytes(a.store.get(0, 5).payload) == PAYLOAD
        assert b.holds_nothing() and b.reports.holdings() == []  # the step stays uncommitted
        assert len(attempts) == 1  # a refusal is not retried (nor misread as a transport error)
    finally:
        await a.stop()
        await b.stop()


async def test_a_restore_streams_from_the_buddy_into_a_new_node_and_on_to_its_trainer(pair):
    a, b = pair
    await asyncio.to_thread(client(a).put_snapshot, header(), PAYLOAD)
    spare = await Node("spare").start()
    try:
        source = RestoreSource(0, events_pb2.RESTORE_KIND_PEER_SNAPSHOT, "b", b.address)
        b.grant(generation=2, fetches={"spare": {0}})  # generation 2: the spare restores rank 0 from b
        spare.restores.begin(2, [0], 5, [source])
        held = await asyncio.to_thread(client(spare).get_restore, 0, 2)
        assert isinstance(held, HeldSnapshot) and (held.rank, held.step, held.owner_node_id) == (0, 5, "a")
        assert bytes(held.payload) == PAYLOAD and held.sha256 == SHA
        assert bytes(spare.store.get(0, 5).payload) == PAYLOAD and spare.store.bytes_incoming == 0
        spare.restores.begin(3, [0], None, [])
        assert await asyncio.to_thread(client(spare).get_restore, 0, 3) is None  # fresh: no chunk at all
    finally:
        await spare.stop()


class CorruptPeer(peer_pb2_grpc.AgentPeerServicer):
    """Streams a snapshot whose last chunk never comes or whose sha256 is wrong."""

    def __init__(self, sha256: str) -> None:
        self.sha256 = sha256

    async def FetchSnapshot(self, request, context):
        await context.write(chunk(PAYLOAD[:CHUNK], head=header()))
        if self.sha256:
            await context.write(chunk(PAYLOAD[CHUNK:], self.sha256))


@pytest.mark.parametrize(("sha256", "error", "reason"), [
    ("", TruncatedStream, "without its last chunk"),
    ("0" * 64, InvalidSnapshot, "sha256 mismatch"),
])
async def test_a_fetched_stream_that_is_truncated_or_mismatched_is_never_stored(sha256, error, reason):
    server = grpc.aio.server(options=message_options(2 * SIZE))
    peer_pb2_grpc.add_AgentPeerServicer_to_server(CorruptPeer(sha256), server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    store = SnapshotStore()
    peers = PeerClient(chunk_bytes=CHUNK, options=message_options(2 * SIZE))
    try:
        with pytest.raises(error, match=reason):
            await peers.fetch(address, 0, 5, store)
        assert len(store) == 0 and store.bytes_incoming == 0
    finally:
        await peers.close()
        await server.stop(0)


async def test_fetching_a_snapshot_the_peer_does_not_hold_names_what_it_holds(pair):
    a, b = pair
    await asyncio.to_thread(client(a).put_snapshot, header(), PAYLOAD)
    with pytest.raises(SnapshotMissing, match=r"holds no snapshot of rank 0 step 6 \(holds rank@step: 0@5\)"):
        await a.peers.fetch(b.address, 0, 6)


async def test_a_follower_reads_an_incoming_snapshot_as_it_lands_and_fails_when_it_is_discarded():
    store = SnapshotStore()
    ident = SnapshotId(1, 0, 5, "a")
    incoming = store.receive(ident, 20)
    got: list[tuple[bytes, str]] = []

    async def follow() -> None:
        async for piece, sha in incoming.follow(8):
            got.append((bytes(piece), sha))

    follower = asyncio.create_task(follow())
    incoming.add(b"a" * 10)
    await asyncio.sleep(0)
    assert got == [(b"a" * 8, "")]  # a full chunk goes at once; the 2 extra bytes wait
    incoming.add(b"b" * 10)
    incoming.finish(hashlib.sha256(b"a" * 10 + b"b" * 10).hexdigest())
    await follower
    assert got == [(b"a" * 8, ""), (b"aabbbbbb", ""), (b"bbbb", hashlib.sha256(b"a" * 10 + b"b" * 10).hexdigest())]
    assert store.get(0, 5) is not None and store.bytes_incoming == 0

    doomed = store.receive(SnapshotId(1, 0, 6, "a"), 20)
    follower = asyncio.create_task(anext(aiter(doomed.follow(8))))
    doomed.add(b"c" * 4)
    doomed.truncated()
    with pytest.raises(InvalidSnapshot, match="discarded while forwarded: .*without its last chunk"):
        await follower
    assert store.get(0, 6) is None and store.bytes_incoming == 0


@pytest.mark.parametrize(("messages", "reason"), [
    ([chunk(b"ab", head=header(size=4))], "without its last chunk"),
    ([chunk(b"ab")], "first chunk carries no header"),
    ([chunk(b"ab", head=header(size=4)), chunk(b"cd", "0" * 64, header(size=4))], "a second header"),
    ([chunk(b"abcd", hashlib.sha256(b"abcd").hexdigest(), header(size=4)), chunk(b"e")], "after the one carrying"),
])
def test_the_trainer_refuses_a_malformed_restore_stream(messages, reason):
    with pytest.raises(InvalidSnapshot, match=reason):
        _assemble(iter(messages))


def test_the_trainer_reads_an_empty_restore_stream_as_a_fresh_start():
    assert _assemble(iter([])) is None


def flipped(payload: bytes, at: int) -> bytes:
    return payload[:at] + bytes([payload[at] ^ 0x01]) + payload[at + 1:]


async def test_one_flipped_byte_is_refused_at_the_agent_and_its_buddy_keeps_nothing(pair):
    # The right size and the sha256 of the intact payload: only hashing every byte that arrived
    # (on the agent's hashing thread, not its event loop) can tell.
    a, b = pair
    corrupt = flipped(PAYLOAD, SIZE // 2)
    messages = [chunk(corrupt[s:s + CHUNK], head=header() if s == 0 else None) for s in range(0, SIZE, CHUNK)]
    messages[-1].sha256 = SHA
    refused = await put_raw(a, messages)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "sha256 mismatch" in refused.details()
    await until(lambda: a.holds_nothing() and b.holds_nothing(), "both agents to discard the snapshot")
    assert a.reports.holdings() == [] and b.reports.holdings() == []


async def test_one_flipped_byte_forwarded_to_the_buddy_is_refused_there(pair):
    # The buddy hop checks on its own: an agent that forwarded a corrupt copy with the intact sha256
    # (bad memory, say) gets INVALID_ARGUMENT, and the buddy holds nothing.
    a, b = pair
    corrupt = flipped(PAYLOAD, SIZE - 1)

    async def pieces():
        for start in range(0, SIZE, CHUNK):
            end = min(start + CHUNK, SIZE)
            yield memoryview(corrupt)[start:end], SHA if end == SIZE else ""

    with pytest.raises(PeerUnavailable, match="refused: INVALID_ARGUMENT .*sha256 mismatch"):
        await a.peers.store(b.address, SnapshotId(1, 0, 5, "a"), SIZE, pieces, node_id="b")
    assert b.holds_nothing() and b.reports.holdings() == []


async def test_an_arriving_snapshot_is_hashed_off_the_event_loop_and_checked_whole():
    store = SnapshotStore()
    incoming = store.receive(SnapshotId(1, 0, 5, "a"), SIZE)
    threads: set[str] = set()
    hash_received = incoming._assembly.hash_received

    def spy() -> None:
        threads.add(threading.current_thread().name)
        hash_received()

    incoming._assembly.hash_received = spy
    for start in range(0, SIZE, 256 * 1024):
        incoming.add(PAYLOAD[start:start + 256 * 1024])
        await asyncio.sleep(0)
    await incoming.hashed()
    assert threads and all(name.startswith("ftsup-sha256") for name in threads)
    assert incoming.finish(SHA).payload == PAYLOAD and store.get(0, 5) is not None


async def test_a_snapshot_discarded_while_its_bytes_are_hashed_returns_its_reservation():
    store = SnapshotStore()
    incoming = store.receive(SnapshotId(1, 0, 5, "a"), SIZE)
    incoming.add(PAYLOAD[:SIZE - 1])  # over the offload threshold: a worker starts hashing
    assert incoming._hashing is not None
    incoming.truncated()  # the sender went away
    assert store.bytes_incoming == 0 and store.get(0, 5) is None
    await incoming.hashed()  # nothing left to wait for: it ended
    with pytest.raises(InvalidSnapshot):
        incoming.finish(SHA)


async def test_a_payload_in_parts_reaches_both_agents_as_the_joined_payload(pair):
    a, b = pair
    parts = [PAYLOAD[:5], b"", memoryview(PAYLOAD)[5:CHUNK + 7], PAYLOAD[CHUNK + 7:]]
    sha = await asyncio.to_thread(client(a).put_snapshot_parts, header(), parts)
    assert sha == SHA
    for node in (a, b):
        held = node.store.get(0, 5)
        assert held is not None and bytes(held.payload) == PAYLOAD and held.sha256 == SHA
