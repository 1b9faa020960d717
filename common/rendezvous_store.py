"""Rank 0's rendezvous store, started before the script asks for it.

`init_process_group` (env:// or tcp://) makes rank 0 host a TCPStore at MASTER_ADDR:MASTER_PORT
and every other rank a client of it. A client that dials before the server listens backs off
(hundreds of milliseconds, jittered, in torch's C++ with no knob), and the server then waits for
that client: measured on 4 gloo ranks started together, rank 0 arriving 50 ms after the others
made everyone's init take 0.33-0.44 s instead of 0.01-0.2 s; 0.2 s late, 0.55-0.75 s. After a
failure every rank starts at once, so this back-off was most of a warm restart's process-group
time (docs/peers.md).

A process that will be rank 0 can start the server the moment it knows its generation's port
(a warm process at its launch, a rejoining rank when handed its new rank), well before the
script's own imports end. The store is multi-tenant, the kind `init_process_group` makes, so the
script's rank-0 store finds this server by its port and uses it instead of starting its own;
its world-size bookkeeping is the script's alone (this one waits for no worker and counts as
none). The returned object must stay referenced: torch keeps multi-tenant servers by weak
reference.

Rank 0 is not always launched first: after a failure the surviving nodes reap the old
generation's trainers before starting the new one (~0.1 s), while a spare starts at once, so a
spare's ranks could still dial before rank 0 listens. Every other rank therefore waits, before its
script runs, until the port accepts a connection (a plain TCP connect every 10 ms, at most
`FTSUP_STORE_WAIT_S`, 2 s); its own imports then run after rank 0's store is up, and its first
dial succeeds. Past the wait (rank 0 started cold, or elsewhere) the script runs as it would have.
`FTSUP_PRESTART_STORE=0` in the job's environment turns both off.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from datetime import timedelta

OPT_OUT = "FTSUP_PRESTART_STORE"
WAIT_ENV = "FTSUP_STORE_WAIT_S"
DEFAULT_WAIT_S = 2.0
POLL_S = 0.01
_held: list[object] = []  # the store this process started for its current generation


def _applies(env: Mapping[str, str]) -> bool:
    """A torch rendezvous whose rank 0 hosts the store (not an agent store), not turned off."""
    return (env.get("RANK", "").isdigit() and bool(env.get("MASTER_ADDR")) and env.get("MASTER_PORT", "").isdigit()
            and env.get("TORCHELASTIC_USE_AGENT_STORE", "False") != "True" and env.get(OPT_OUT, "1") != "0")


def wanted(env: Mapping[str, str]) -> bool:
    """Rank 0 starts the store early; every other rank waits for it (`await_host`)."""
    return _applies(env) and env["RANK"] == "0"


def wait_cap_s(env: Mapping[str, str]) -> float:
    """`FTSUP_STORE_WAIT_S`, within [0, 60]; the default when unset or not a number."""
    try:
        return min(max(float(env.get(WAIT_ENV, DEFAULT_WAIT_S)), 0.0), 60.0)
    except ValueError:
        return DEFAULT_WAIT_S


def await_host(env: Mapping[str, str] | None = None) -> float | None:
    """A rank other than 0 waits until rank 0's store accepts connections, at most `wait_cap_s`.

    Seconds waited when it answered, None when it did not (or this rank does not wait). Never
    raises: an address that does not resolve is the script's init's to report."""
    env = os.environ if env is None else env
    if not _applies(env) or env["RANK"] == "0":
        return None
    started = time.monotonic()
    deadline = started + wait_cap_s(env)
    address = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
    while True:
        try:
            with socket.create_connection(address, timeout=max(POLL_S, deadline - time.monotonic())):
                return time.monotonic() - started
        except OSError:
            if time.monotonic() + POLL_S > deadline:
                return None
            time.sleep(POLL_S)


def prestart(env: Mapping[str, str] | None = None) -> bool:
    """Starts the generation's store server in this process when `wanted`; True when it listens.

    Never raises: whatever fails here (the port taken, torch without distributed) fails again,
    with torch's own message, when the script calls `init_process_group`, as it would have."""
    env = os.environ if env is None else env
    if not wanted(env):
        return False
    try:
        from torch.distributed import TCPStore

        store = TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), None, True,
                         timedelta(seconds=60), wait_for_workers=False, multi_tenant=True)
    except Exception as exc:  # the script's own init reports it properly
        print(f"ftsup: rank 0's rendezvous store not started early ({exc!r}); the script's init will start it",
              file=sys.stderr, flush=True)
        return False
    # Only this generation's: a rank 0 that rejoins in-process must not keep an earlier
    # generation's server (and its keys) alive, where a later generation reusing that port
    # would find it instead of a fresh one.
    _held[:] = [store]
    return True
