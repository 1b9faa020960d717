"""Which process starts the generation's rendezvous store early (common/rendezvous_store.py)."""

from __future__ import annotations

import pytest

from ftsup.common import rendezvous_store

RANK0 = {"RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "False"}


def test_rank_0_hosting_its_own_store_starts_it_early():
    assert rendezvous_store.wanted(RANK0)


@pytest.mark.parametrize("change", [
    {"RANK": "1"},  # a client: never hosts
    {"TORCHELASTIC_USE_AGENT_STORE": "True"},  # an agent hosts it: torch makes rank 0 a client too
    {"FTSUP_PRESTART_STORE": "0"},  # the job turned it off
    {"MASTER_PORT": "not-a-port"},
    {"MASTER_ADDR": ""},
], ids=["other-rank", "agent-store", "opted-out", "bad-port", "no-address"])
def test_anything_else_leaves_the_store_to_torch(change):
    assert not rendezvous_store.wanted({**RANK0, **change})
    assert not rendezvous_store.prestart({**RANK0, **change})  # and starts nothing


def test_a_port_it_cannot_take_is_left_to_the_script_without_raising(capsys):
    import socket

    from ftsup.harness.cluster import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        env = {**RANK0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(taken.getsockname()[1])}
        assert not rendezvous_store.prestart(env)
    assert "not started early" in capsys.readouterr().err


def _listener():
    import socket

    from ftsup.harness.cluster import free_port

    server = socket.socket()
    server.bind(("127.0.0.1", free_port()))  # reserved for this session: bound, not yet listening
    return server


def test_another_rank_waits_until_rank_0_listens():
    """The others' first dial must find rank 0's store: they wait for the port to accept."""
    import threading

    server = _listener()
    env = {**RANK0, "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.getsockname()[1])}
    late = threading.Timer(0.2, server.listen)
    late.start()
    try:
        waited = rendezvous_store.await_host(env)
    finally:
        late.cancel()
        server.close()
    assert waited is not None and waited >= 0.15, waited


def test_the_wait_ends_at_its_cap_and_rank_0_never_waits():
    import time

    server = _listener()  # bound, never listening: connections are refused
    env = {**RANK0, "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.getsockname()[1]),
           "FTSUP_STORE_WAIT_S": "0.1"}
    try:
        started = time.monotonic()
        assert rendezvous_store.await_host(env) is None
        assert time.monotonic() - started < 5
        assert rendezvous_store.await_host({**env, "RANK": "0"}) is None  # rank 0 hosts: nothing to wait for
        assert rendezvous_store.await_host({**env, "FTSUP_PRESTART_STORE": "0"}) is None
    finally:
        server.close()


@pytest.mark.parametrize(("value", "cap"), [(None, 2.0), ("0.5", 0.5), ("-3", 0.0), ("9999", 60.0), ("soon", 2.0)])
def test_the_wait_cap_is_read_with_bounds(value, cap):
    env = {} if value is None else {"FTSUP_STORE_WAIT_S": value}
    assert rendezvous_store.wait_cap_s(env) == cap


def test_a_rank_0_that_rejoins_keeps_only_its_new_generations_store():
    """An earlier generation's server (its keys) must not outlive the generation in this process."""
    import weakref

    from ftsup.harness.cluster import free_port

    env = {**RANK0, "MASTER_ADDR": "127.0.0.1"}
    assert rendezvous_store.prestart({**env, "MASTER_PORT": str(free_port())})
    first = weakref.ref(rendezvous_store._held[0])
    assert rendezvous_store.prestart({**env, "MASTER_PORT": str(free_port())})
    assert len(rendezvous_store._held) == 1 and first() is None
    rendezvous_store._held.clear()
