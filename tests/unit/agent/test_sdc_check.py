"""The verifier's side of an SDC recompute check, driven through the scripted process runner:
which snapshot it replays from, what the replay process is given, what it answers, and that an
order withdrawn by the supervisor stops its replay."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
from pathlib import Path

import structlog

from ftsup.agent.core import sdc_replay
from ftsup.agent.fakes import FakePeers, ScriptedProcessRunner
from ftsup.agent.sdc_check import SdcChecker
from ftsup.agent.snapshots import Blob, SnapshotStore
from ftsup.v1 import agent_pb2

LOG = structlog.get_logger("test")


def blob(rank: int, step: int, payload: bytes = b"snapshot-bytes") -> Blob:
    return Blob(1, rank, step, "n3", payload, hashlib.sha256(payload).hexdigest())


def order(check_id: str = "sdc-9", ranks=(0, 1, 2, 3)) -> agent_pb2.SdcCheckOrder:
    return agent_pb2.SdcCheckOrder(
        check_id=check_id, generation=1, step=5, rank=2, world_size=4, replay_ranks=list(ranks),
        sources=[agent_pb2.SdcSnapshotSource(node_id="n4", address="n4:1"),
                 agent_pb2.SdcSnapshotSource(node_id="n3", address="n3:1")],
        argv=["python", "-m", "train"], env=[agent_pb2.EnvVar(name="JOB", value="x"), agent_pb2.EnvVar(name="RANK", value="9")],
    )


class Verifier:
    def __init__(self, tmp_path: Path, peers: FakePeers) -> None:
        self.runner = ScriptedProcessRunner()
        self.store = SnapshotStore()
        self.sent: list[agent_pb2.AgentMessage] = []
        self.peers = peers
        self.checker = SdcChecker("s1", tmp_path, self.store, peers, self.runner,  # type: ignore[arg-type]
                                  {"PATH": "/bin", "RANK": "0"}, self.sent.append, LOG)

    async def spawned(self) -> None:
        for _ in range(200):
            if self.runner.spawned:
                return
            await asyncio.sleep(0.005)
        raise AssertionError("no replay was started")

    async def answered(self) -> agent_pb2.SdcCheckResult:
        for _ in range(200):
            if self.sent:
                return self.sent[-1].sdc_check_result
            await asyncio.sleep(0.005)
        raise AssertionError("no answer was sent")


def answer_as_the_replay_would(process, digests: dict[int, tuple[str, str]], check_id: str = "sdc-9") -> dict:
    request = json.loads(Path(process.env[sdc_replay.REPLAY_ENV]).read_text())
    Path(request["out_path"]).write_text(json.dumps({
        "check_id": check_id, "step": request["step"], "rank": request["rank"], "replay_s": 0.5,
        "recomputed": [{"rank": r, "grad_digest": g, "param_digest": p} for r, (g, p) in digests.items()]}))
    return request


async def test_the_verifier_fetches_the_snapshot_before_the_step_replays_it_and_answers_with_its_digests(tmp_path):
    peers = FakePeers({("n3:1", 2, 4): blob(2, 4)})  # the buddy n4 lost it; the rank's node has it
    node = Verifier(tmp_path, peers)
    node.checker.apply([order()])
    await node.spawned()
    (process,) = node.runner.spawned
    assert peers.fetched == [("n4:1", 2, 4), ("n3:1", 2, 4)]
    assert peers.expected_nodes == ["n4", "n3"]  # each source's identity is pinned, not just its address
    assert process.argv == ("python", "-m", "train")
    assert process.env["JOB"] == "x" and "RANK" not in process.env  # never a rank of the job's process group
    request = answer_as_the_replay_would(process, {r: (f"g{r}", "p") for r in range(4)})
    assert (request["step"], request["rank"], request["world_size"], request["ranks"]) == (5, 2, 4, [0, 1, 2, 3])
    assert Path(request["snapshot_path"]).read_bytes() == b"snapshot-bytes"
    assert request["sha256"] == blob(2, 4).sha256
    process.exit(0)
    result = await node.answered()
    assert (result.check_id, result.step, result.rank, result.error) == ("sdc-9", 5, 2, "")
    assert [(d.rank, d.node_id, d.grad_digest, d.param_digest) for d in result.recomputed] == [
        (r, "s1", f"g{r}", "p") for r in range(4)]
    assert not Path(request["snapshot_path"]).exists()  # the model-sized copy is removed
    assert node.checker.resync() == node.sent  # sent again to a new supervisor while ordered
    node.checker.apply([order()])  # the same directive again: nothing starts twice
    assert len(node.runner.spawned) == 1
    node.checker.apply([])
    assert node.checker.resync() == []


async def test_a_snapshot_in_the_own_store_needs_no_fetch(tmp_path):
    peers = FakePeers({})
    node = Verifier(tmp_path, peers)
    node.store.put(blob(2, 4))
    node.checker.apply([order()])
    await node.spawned()
    assert peers.fetched == []
    node.runner.spawned[0].exit(1)
    result = await node.answered()
    assert "exited with code 1" in result.error and not result.recomputed


async def test_no_holder_with_the_snapshot_is_an_error_answer_without_a_replay(tmp_path):
    node = Verifier(tmp_path, FakePeers({}))
    node.checker.apply([order()])
    result = await node.answered()
    assert "no holder had rank 2's snapshot of step 4" in result.error and "n4: " in result.error
    assert node.runner.spawned == []


async def test_a_replay_answering_other_ranks_than_asked_is_an_error(tmp_path):
    node = Verifier(tmp_path, FakePeers({("n4:1", 2, 4): blob(2, 4)}))
    node.checker.apply([order(ranks=(2,))])
    await node.spawned()
    answer_as_the_replay_would(node.runner.spawned[0], {1: ("g", "")})
    node.runner.spawned[0].exit(0)
    result = await node.answered()
    assert "answered ranks [1], asked [2]" in result.error


async def test_an_order_withdrawn_by_the_supervisor_kills_its_replay_and_answers_nothing(tmp_path):
    node = Verifier(tmp_path, FakePeers({("n4:1", 2, 4): blob(2, 4)}))
    node.checker.apply([order()])
    await node.spawned()
    node.checker.apply([])  # the check timed out (or was answered by another session)
    for _ in range(100):
        if node.runner.spawned[0].exit_code is not None:
            break
        await asyncio.sleep(0.005)
    assert node.runner.spawned[0].signals == [signal.SIGKILL]
    await asyncio.sleep(0.02)
    assert node.sent == [] and node.checker.running() == []


def test_reconcile_is_idempotent_by_check_id():
    assert sdc_replay.reconcile(["a", "b"], ["a"], []) == sdc_replay.Reconcile(("b",), ())
    assert sdc_replay.reconcile(["b"], ["a"], ["b"]) == sdc_replay.Reconcile((), ("a",))
    assert sdc_replay.parse_answer([], "c", [0]).error.startswith("unreadable replay answer")
    assert sdc_replay.parse_answer({"check_id": "c"}, "c", [0]).error.startswith("unreadable replay answer")
    assert "not 'c'" in sdc_replay.parse_answer({"check_id": "d", "recomputed": []}, "c", [0]).error
    ok = sdc_replay.parse_answer({"check_id": "c", "recomputed": [{"rank": 0, "grad_digest": "g"}]}, "c", [0])
    assert ok == sdc_replay.Answer((sdc_replay.RankDigest(0, "g", ""),), "")
    env = sdc_replay.replay_env({"PATH": "/bin", "MASTER_PORT": "1"}, [("A", "b"), ("RANK", "3")], "/r.json")
    assert env == {"PATH": "/bin", "A": "b", sdc_replay.REPLAY_ENV: "/r.json", "PYTHONUNBUFFERED": "1"}


async def test_holders_that_have_not_seen_the_verifiers_grant_yet_are_asked_again(tmp_path):
    """The grant reaches each holder in its own directive, possibly after the verifier's order
    (an inconclusive check in CI): a round refused by every holder is asked again shortly."""
    peers = FakePeers({("n3:1", 2, 4): blob(2, 4)})
    peers.denials = {"n4:1": 5, "n3:1": 2}
    node = Verifier(tmp_path, peers)
    node.checker.apply([order()])
    await node.spawned()
    assert peers.fetched == [("n4:1", 2, 4), ("n3:1", 2, 4)] * 3, "two refused rounds, then n3 answers"


async def test_holders_that_keep_refusing_end_the_check_as_an_error_once_the_wait_is_over(tmp_path, monkeypatch):
    monkeypatch.setattr("ftsup.agent.sdc_check.GRANT_WAIT_S", 0.3)
    peers = FakePeers({})
    peers.denials = {"n4:1": 1000, "n3:1": 1000}
    node = Verifier(tmp_path, peers)
    node.checker.apply([order()])
    result = await node.answered()
    assert "no holder had rank 2's snapshot of step 4" in result.error and "PERMISSION_DENIED" in result.error
    assert node.runner.spawned == [] and 2 < len(peers.fetched) < 20
