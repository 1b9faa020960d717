"""In-memory twins of the agent's seams, for unit tests (STYLE 8).

`ScriptedProcessRunner` records spawns and signals and lets the test decide when and how each
process exits; it honours the `ProcessRunner` contract (signal after exit is a no-op; wait
returns the exit code, negative for the signal that ended it). `FakePeers` answers snapshot
fetches from a dict.
"""

from __future__ import annotations

import asyncio
import signal as signals
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ftsup.agent.peers import PeerDenied, SnapshotMissing
from ftsup.agent.process import ProcessHandle
from ftsup.agent.snapshots import Blob, SnapshotStore


@dataclass(eq=False)
class FakeProcess:
    pid: int
    argv: tuple[str, ...]
    env: dict[str, str]
    log_path: Path
    signals: list[int] = field(default_factory=list)
    exit_code: int | None = None
    _exited: asyncio.Event = field(default_factory=asyncio.Event)

    def exit(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
            self._exited.set()


class ScriptedProcessRunner:
    """Processes that exit when the test says so, or on a signal listed in `dies_on`."""

    def __init__(self, dies_on: Sequence[int] = (signals.SIGKILL, signals.SIGTERM)) -> None:
        self.spawned: list[FakeProcess] = []
        self.cwds: list[Path | None] = []
        self.dies_on = set(dies_on)
        self.fail_spawn: str | None = None
        self._next_pid = 1000

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                    cwd: Path | None = None) -> ProcessHandle:
        if self.fail_spawn is not None:
            from ftsup.agent.process import SpawnFailed

            raise SpawnFailed(self.fail_spawn)
        self._next_pid += 1
        process = FakeProcess(self._next_pid, tuple(argv), dict(env), log_path)
        self.cwds.append(cwd)
        self.spawned.append(process)
        return process

    def signal(self, handle: ProcessHandle, sig: int) -> None:
        assert isinstance(handle, FakeProcess)
        if handle.exit_code is not None:
            return
        handle.signals.append(sig)
        if sig in self.dies_on:
            handle.exit(-sig)

    async def wait(self, handle: ProcessHandle) -> int:
        assert isinstance(handle, FakeProcess)
        await handle._exited.wait()
        assert handle.exit_code is not None
        return handle.exit_code

    def alive(self) -> list[FakeProcess]:
        return [p for p in self.spawned if p.exit_code is None]


class FakePeers:
    """Peer fetches answered from a dict of (address, rank, step) -> blob; records every fetch."""

    def __init__(self, blobs: dict[tuple[str, int, int], Blob]) -> None:
        self.blobs = blobs
        self.fetched: list[tuple[str, int, int]] = []
        self.expected_nodes: list[str] = []  # the node each fetch pinned (PeerClient checks it under mTLS)
        self.denials: dict[str, int] = {}  # address -> fetches it still refuses (PERMISSION_DENIED)

    async def fetch(self, address: str, rank: int, step: int, store: SnapshotStore | None = None,
                    *, generation: int = 0, node_id: str = "") -> Blob:
        self.fetched.append((address, rank, step))
        self.expected_nodes.append(node_id)
        if self.denials.get(address, 0) > 0:  # (a holder that has not seen this node's grant yet)
            self.denials[address] -= 1
            raise PeerDenied(f"{address} refused: PERMISSION_DENIED no grant yet")
        if (address, rank, step) not in self.blobs:
            raise SnapshotMissing(f"{address} holds no rank {rank} step {step}")
        blob = self.blobs[(address, rank, step)]
        if store is not None:  # as PeerClient.fetch: streamed into the store
            store.put(blob)
        return blob
