"""The status page's server side: node states, fleet diffs, record shaping, listener rules, routes."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from ftsup.harness.status_load import fleet_events
from ftsup.supervisor.core.events import (
    GenerationStarted,
    NodeDeclaredDead,
    NodeDrained,
    NodeQuarantined,
    NodeRole,
    Record,
)
from ftsup.supervisor.core.evolve import evolve_all
from ftsup.supervisor.core.state import ClusterState, Liveness, NodeRecord
from ftsup.supervisor.web import feed
from ftsup.supervisor.web.server import StatusListenError, check_status_listen, serve_status


def node(**changes: object) -> NodeRecord:
    return dataclasses.replace(NodeRecord("n1", 1, NodeRole.ACTIVE, "h", 1, 8), **changes)


def test_a_dead_node_reads_dead_though_it_is_also_quarantined() -> None:
    assert feed.node_state(node(liveness=Liveness.DEAD, is_quarantined=True), {}) == "dead"
    assert feed.node_state(node(is_quarantined=True), {"n1": 1}) == "quarantined"
    assert feed.node_state(node(is_drained=True), {"n1": 1}) == "drained"
    assert feed.node_state(node(liveness=Liveness.SUSPECT), {"n1": 1}) == "suspect"


def test_a_live_node_outside_the_generation_is_spare_whatever_its_role() -> None:
    assert feed.node_state(node(), {"n1": 1}) == "active"
    assert feed.node_state(node(), {"other": 1}) == "spare"
    assert feed.node_state(node(role=NodeRole.SPARE), {}) == "spare"


def test_the_fleet_travels_as_parallel_arrays_grouped_by_failure_domain() -> None:
    state = evolve_all(ClusterState(), fleet_events(nodes=6, spares=2, per_domain=3))
    fleet = feed.fleet(state)
    assert fleet["domains"] == sorted(fleet["domains"]) and len(set(fleet["domains"])) == 3
    assert [fleet["states"][c] for c in fleet["codes"]].count("spare") == 2
    dead = evolve_all(state, [NodeDeclaredDead("node-00001", "silent", 2.0)])
    assert feed.fleet_changes(feed.fleet_codes(state), feed.fleet_codes(dead)) == {
        "node-00001": feed.STATE_CODE["dead"]}
    grown = evolve_all(state, fleet_events(nodes=7, spares=2, per_domain=3)[6:7])
    assert feed.fleet_changes(feed.fleet_codes(state), feed.fleet_codes(grown)) is None  # a node joined


def test_a_record_that_lists_the_world_travels_as_its_count() -> None:
    started = next(e for e in fleet_events(nodes=100, spares=0) if isinstance(e, GenerationStarted))
    item = feed.record_json(Record(7, 1, 1.5, started))
    assert item["fields"]["members"] == {"count": 100} and item["generation"] == 1 and item["kind"] == "GenerationStarted"
    quarantine = feed.record_json(Record(9, 1, 2.0, NodeQuarantined("n1", "xid 79", 8)))
    assert (quarantine["node"], quarantine["fields"]["evidence_seq"]) == ("n1", 8)
    assert feed.record_json(Record(10, 1, 2.0, NodeDrained("n1", "x" * 1000, "op")))["fields"]["reason"].endswith("…")


def test_a_plaintext_status_page_beyond_loopback_needs_tls_or_insecure() -> None:
    with pytest.raises(StatusListenError, match=r"--status-listen 0.0.0.0:9465 is not loopback.*--insecure"):
        check_status_listen("0.0.0.0:9465", None, is_insecure_allowed=False)
    with pytest.raises(StatusListenError, match="is not host:port"):
        check_status_listen("9465", None, is_insecure_allowed=False)
    check_status_listen("127.0.0.1:9465", None, is_insecure_allowed=False)
    check_status_listen("0.0.0.0:9465", None, is_insecure_allowed=True)


async def _get(port: int, path: str, method: str = "GET") -> tuple[str, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body


@pytest.mark.asyncio
async def test_the_page_its_reads_and_its_refusals() -> None:
    from ftsup.harness.status_load import SyntheticStatus

    synthetic = SyntheticStatus(nodes=4, spares=1)
    await synthetic._serve_setup()
    server = await serve_status(synthetic.runtime, "127.0.0.1:0")  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    try:
        status, body = await _get(port, "/status")
        assert status.endswith("200 OK") and b"status.js" in body
        status, body = await _get(port, "/status/api/state")
        state = json.loads(body)
        assert len(state["fleet"]["ids"]) == 5 and state["summary"]["phase"] == "running"
        assert (await _get(port, "/status/api/node?id=node-00001"))[0].endswith("200 OK")
        assert (await _get(port, "/status/api/node?id=nope"))[0].endswith("404 Not Found")
        status, body = await _get(port, "/status/api/record?seq=1")
        assert json.loads(body)["kind"] == "NodeRegistered"
        assert (await _get(port, "/status/api/record?seq=x"))[0].endswith("400 Bad Request")
        assert (await _get(port, "/status/static/../../main.py"))[0].endswith("404 Not Found")
        assert (await _get(port, "/status", "POST"))[0].endswith("405 Method Not Allowed")
    finally:
        server.close()
