"""An agent stand-in for running a training script without ftsup: the reference run.

Owns nothing but the `AgentClient` surface `Session` uses: step reports and snapshots go nowhere,
nothing is ever restored. Launched like torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), an
example run with `--offline` trains the same bits as under the supervisor, so a fault-injection
test can compare a recovered run's final digest with an uninterrupted one in a single cluster run.
With FTSUP_OFFLINE_DIR set, it keeps what an agent would have received in that directory (each
snapshot's payload and SHA-256, every step report as a JSON line): the material a replay test
compares an SDC recompute with.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import warnings
from collections.abc import Mapping, Sequence

from google.protobuf import json_format

from ftsup.trainer.session import LaunchEnv, Session
from ftsup.v1 import agent_pb2, peer_pb2

KEEP_DIR_ENV = "FTSUP_OFFLINE_DIR"


class OfflineClient:
    address = "offline"

    def __init__(self, keep_dir: pathlib.Path | None = None) -> None:
        self.steps: list[agent_pb2.StepReport] = []  # kept so an in-process caller can read digests
        self.finished: agent_pb2.RankFinished | None = None
        self._keep_dir = keep_dir

    def get_restore(self, rank: int, generation: int) -> None:
        return None

    def report_step(self, report: agent_pb2.StepReport) -> None:
        self.steps.append(report)
        if self._keep_dir is not None:
            with open(self._keep_dir / f"rank-{report.rank}.steps.jsonl", "a") as out:
                out.write(json.dumps(json_format.MessageToDict(report, preserving_proto_field_name=True)) + "\n")

    def put_snapshot_parts(self, header: peer_pb2.SnapshotHeader, parts: Sequence[bytes | memoryview]) -> str:
        if self._keep_dir is None:
            return ""  # nobody reads it: not even joined
        return self.put_snapshot(header, b"".join(parts))

    def put_snapshot(self, header: peer_pb2.SnapshotHeader, payload: bytes | memoryview) -> str:
        if self._keep_dir is None:
            return ""  # nobody reads it: no hashing pass
        sha256 = hashlib.sha256(payload).hexdigest()
        stem = f"rank-{header.rank}.step-{header.step}"
        (self._keep_dir / f"{stem}.snap").write_bytes(payload)
        (self._keep_dir / f"{stem}.sha256").write_text(sha256)
        return sha256

    def report_liveness(self, report: peer_pb2.LivenessReport) -> None:
        return None

    def report_finished(self, finished: agent_pb2.RankFinished) -> None:
        self.finished = finished

    def close(self) -> None:
        return None


def offline_session(environ: Mapping[str, str]) -> Session:
    """A generation-1 session from torchrun's variables alone, talking to no agent."""
    env = {"LOCAL_RANK": environ.get("RANK", "0"), "LOCAL_WORLD_SIZE": environ.get("WORLD_SIZE", "1"),
           "FTSUP_GENERATION": "1", "FTSUP_NODE_ID": "offline", "FTSUP_AGENT_ADDRESS": "offline", **environ}
    env["FTSUP_RESTORE_STEP"] = ""
    keep = environ.get(KEEP_DIR_ENV, "")
    client = OfflineClient(pathlib.Path(keep) if keep else None)
    return Session(LaunchEnv.from_mapping(env), client=client)  # type: ignore[arg-type]


_warned = False


def unsupervised_session(environ: Mapping[str, str]) -> Session:
    """`Session.from_env()` outside ftsup (plain torchrun, plain python): the offline session,
    after one warning per process, so a script adopting ftsup still runs where ftsup is absent."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn("ftsup: no FTSUP_AGENT_ADDRESS (not launched by ftsup): Session is a no-op here;"
                      " nothing is snapshotted, reported or restored", RuntimeWarning, stacklevel=3)
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    return offline_session({**defaults, **environ})
