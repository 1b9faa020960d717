"""An agent stand-in for running a training script without ftsup: the reference run.

Owns nothing but the `AgentClient` surface `Session` uses: step reports and snapshots go nowhere,
nothing is ever restored. Launched like torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), an
example run with `--offline` trains the same bits as under the supervisor, so a fault-injection
test can compare a recovered run's final digest with an uninterrupted one in a single cluster run.
"""

from __future__ import annotations

from collections.abc import Mapping

from ftsup.v1 import agent_pb2, peer_pb2
from trainer.session import LaunchEnv, Session


class OfflineClient:
    address = "offline"

    def __init__(self) -> None:
        self.steps: list[agent_pb2.StepReport] = []  # kept so an in-process caller can read digests
        self.finished: agent_pb2.RankFinished | None = None

    def get_restore(self, rank: int, generation: int) -> peer_pb2.GetRestoreResponse:
        return peer_pb2.GetRestoreResponse()

    def report_step(self, report: agent_pb2.StepReport) -> None:
        self.steps.append(report)

    def put_snapshot(self, blob: peer_pb2.SnapshotBlob) -> None:
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
    return Session(LaunchEnv.from_mapping(env), client=OfflineClient())  # type: ignore[arg-type]
