"""ftsup.trainer.session: validation, ordering, snapshot back-pressure and finish, over a fake link."""

import hashlib
import sys
import threading
from collections.abc import Callable
from concurrent import futures
from types import FrameType

import grpc
import pytest
import torch

from ftsup.harness.cluster import ClusterError, wait_until
from ftsup.trainer import snapshot as snapshot_module
from ftsup.trainer.agent_client import AgentClient, AgentLinkError, HeldSnapshot
from ftsup.trainer.session import LaunchEnv, Session
from ftsup.v1 import peer_pb2_grpc

ENV = {
    "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
    "FTSUP_GENERATION": "3", "FTSUP_NODE_ID": "node-a",
    "FTSUP_AGENT_ADDRESS": "unix:/nowhere", "FTSUP_RESTORE_STEP": "",
}
WAIT_S = 10.0


class FakeClient:
    """Records calls in order; PutSnapshot can be held until `release` is set."""

    address = "unix:/fake"

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.release = threading.Event()
        self.release.set()
        self.restore_blob: HeldSnapshot | None = None

    def get_restore(self, rank, generation):
        self.calls.append(("GetRestore", (rank, generation)))
        return self.restore_blob

    def report_step(self, report):
        self.calls.append(("ReportStep", report.step))

    def put_snapshot(self, header, payload):
        assert self.release.wait(WAIT_S)
        sha256 = hashlib.sha256(payload).hexdigest()
        held = HeldSnapshot(header.generation, header.rank, header.step, header.owner_node_id, sha256,
                            memoryview(bytes(payload)))
        self.calls.append(("PutSnapshot", held))
        return sha256

    def report_finished(self, finished):
        self.calls.append(("ReportFinished", finished))

    def close(self):
        self.calls.append(("close", None))


def make_session(client=None, **env) -> Session:
    return Session(LaunchEnv.from_mapping(ENV | env), client or FakeClient())


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters())


def test_launch_env_reads_torchrun_and_ftsup_variables():
    launch = LaunchEnv.from_mapping(ENV | {"FTSUP_RESTORE_STEP": "7"})
    assert (launch.rank, launch.world_size, launch.generation, launch.restore_step) == (1, 2, 3, 7)
    assert LaunchEnv.from_mapping(ENV).restore_step is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"RANK": "2"}, "RANK=2 must be below WORLD_SIZE=2"),
        ({"FTSUP_GENERATION": "x"}, "FTSUP_GENERATION='x' is not an integer"),
        ({"FTSUP_AGENT_ADDRESS": ""}, "FTSUP_AGENT_ADDRESS is not set"),
        ({"FTSUP_RESTORE_STEP": "-1"}, "FTSUP_RESTORE_STEP=-1 must be >= 0"),
    ],
)
def test_launch_env_rejects_bad_values_naming_them(change, message):
    with pytest.raises(ValueError, match=message):
        LaunchEnv.from_mapping(ENV | change)


@pytest.mark.parametrize("bad", [float("nan"), -0.5, float("inf")])
def test_report_step_rejects_a_negative_or_non_finite_step_time_naming_it(bad):
    session = make_session()
    with pytest.raises(ValueError, match=f"step_time_s .* got {bad!r}"):
        session.report_step(1, bad, 0.1, 1.0, "d")


def test_report_step_sends_nan_loss_as_given_and_keeps_order():
    client = FakeClient()
    session = make_session(client)
    for step in range(1, 51):
        session.report_step(step, 0.2, 0.1, float("nan"), "d")
    session.finish(50, "final")
    steps = [arg for name, arg in client.calls if name == "ReportStep"]
    assert steps == list(range(1, 51))
    assert client.calls[-1][0] == "ReportFinished"


def _stack_has(thread_id: int, matches: Callable[[FrameType], bool]) -> bool:
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if matches(frame):
            return True
        frame = frame.f_back
    return False


def _when_blocked(thread_id: int, matches: Callable[[FrameType], bool], release: threading.Event) -> None:
    """Sets `release` once `thread_id`'s stack shows it blocked where `matches` says (or at the
    deadline: the test's own assertions then fail instead of hanging)."""
    try:
        wait_until(lambda: release.is_set() or _stack_has(thread_id, matches), WAIT_S, "the thread to block",
                   poll_s=0.001)
    except ClusterError:
        pass
    finally:
        release.set()


def release_once_blocked(client: FakeClient, thread_id: int) -> None:
    """Release the held hand-off once `thread_id` is blocked waiting on the in-flight future."""
    _when_blocked(thread_id, lambda f: f.f_code.co_name == "exception" and "futures" in f.f_code.co_filename,
                  client.release)


def test_snapshot_waits_for_the_one_in_flight_and_counts_the_wait():
    client = FakeClient()
    client.release.clear()
    session = make_session(client)
    model, optimizer = model_and_optimizer()
    session.snapshot(1, model, optimizer)
    releaser = threading.Thread(target=release_once_blocked, args=(client, threading.get_ident()))
    releaser.start()
    session.snapshot(2, model, optimizer)  # blocks until the first hand-off is released
    session.finish(2, "final")
    releaser.join()

    names = [name for name, _ in client.calls]
    assert names == ["PutSnapshot", "PutSnapshot", "ReportFinished"]
    assert [blob.step for name, blob in client.calls[:2]] == [1, 2]
    assert session.stats.waits == 1 and session.stats.wait_s > 0
    assert session.stats.handed_off == 2 and session.stats.last_payload_bytes > 0


def test_snapshot_blob_carries_identity_and_the_restore_round_trips():
    client = FakeClient()
    session = make_session(client)
    model, optimizer = model_and_optimizer()
    session.snapshot(4, model, optimizer, extra={"note": "x"})
    session.wait_for_snapshots()
    blob = client.calls[-1][1]
    assert (blob.generation, blob.rank, blob.step, blob.owner_node_id) == (3, 1, 4, "node-a")

    client.restore_blob = blob
    restarted = make_session(client, FTSUP_RESTORE_STEP="4", FTSUP_GENERATION="4")
    other = torch.nn.Linear(3, 2)
    assert restarted.restore(other, torch.optim.AdamW(other.parameters())) == 4
    assert torch.equal(other.weight, model.weight) and restarted.restored_extra == {"note": "x"}


def test_restore_is_fresh_without_asking_the_agent_when_no_restore_step_is_set():
    client = FakeClient()
    assert make_session(client).restore(*model_and_optimizer()) == 0
    assert client.calls == []


def test_restore_fails_clearly_when_the_agent_has_no_state_for_the_expected_step():
    session = make_session(FTSUP_RESTORE_STEP="5")
    with pytest.raises(RuntimeError, match="no snapshot for rank 1 although FTSUP_RESTORE_STEP=5"):
        session.restore(*model_and_optimizer())


def test_a_restore_stream_that_fails_its_checks_is_a_corrupt_snapshot_never_loaded():
    from ftsup.common.chunks import HashMismatch

    class CorruptClient(FakeClient):
        def get_restore(self, rank, generation):
            raise HashMismatch("snapshot of rank 1 step 5 (generation 3): sha256 mismatch (claimed 0..., payload has 1...)")

    session = make_session(CorruptClient(), FTSUP_RESTORE_STEP="5")
    model, optimizer = model_and_optimizer()
    before = model.weight.detach().clone()
    with pytest.raises(snapshot_module.SnapshotCorrupt, match="restore from agent at 'unix:/fake': .*sha256 mismatch"):
        session.restore(model, optimizer)
    assert torch.equal(model.weight, before)


class FailingLink(peer_pb2_grpc.TrainerLinkServicer):
    def ReportStep(self, request, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "agent is draining")


def test_agent_errors_surface_as_agent_link_error_naming_the_address(tmp_path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    peer_pb2_grpc.add_TrainerLinkServicer_to_server(FailingLink(), server)
    address = f"unix:{tmp_path}/a.sock"
    server.add_insecure_port(address)
    server.start()
    session = make_session(AgentClient(address))
    try:
        session.report_step(1, 0.1, 0.05, 2.0, "d")
        expected = f"agent at '{address}': ReportStep failed with UNAVAILABLE"
        with pytest.raises(AgentLinkError, match=expected) as info:
            session.finish(1, "d")
        assert info.value.retryable
    finally:
        session.close()
        server.stop(grace=None)


def test_snapshot_barrier_returns_only_once_the_previous_hand_off_is_acknowledged():
    client = FakeClient()
    client.release.clear()
    session = make_session(client)
    model, optimizer = model_and_optimizer()
    assert session.snapshot_barrier() == 0.0 or session.snapshot_barrier() < 0.01  # nothing in flight
    session.snapshot(1, model, optimizer)
    releaser = threading.Thread(target=release_once_blocked, args=(client, threading.get_ident()))
    releaser.start()
    waited_s = session.snapshot_barrier()
    releaser.join()
    assert [name for name, _ in client.calls] == ["PutSnapshot"]
    assert waited_s > 0 and session.stats.waits == 1
    session.close()


def set_once_waiting_in(gate: threading.Event, thread_id: int, function: str) -> None:
    """Sets `gate` once `thread_id` is blocked inside `function` (seen on its stack)."""
    _when_blocked(thread_id, lambda f: f.f_code.co_name == function, gate)


def hold_capture(session: Session) -> threading.Event:
    """Makes the session's background copy wait for the returned gate."""
    gate = threading.Event()
    real_capture = session._handoff._buffers.capture

    def gated(state):
        assert gate.wait(WAIT_S)
        return real_capture(state)

    session._handoff._buffers.capture = gated
    return gate


def test_optimizer_step_waits_for_the_background_copy_so_the_snapshot_holds_its_steps_state():
    client = FakeClient()
    session = make_session(client)
    model, optimizer = model_and_optimizer()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # optimizer state exists, as after any real step
    at_step_1 = model.weight.detach().clone()
    gate = hold_capture(session)
    session.snapshot(1, model, optimizer)  # returns at once: the copy is held back
    assert session.stats.capture_waits == 0
    waiter = threading.Thread(target=set_once_waiting_in, args=(gate, threading.get_ident(), "wait_for_capture"))
    waiter.start()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # must wait until the copy of step 1's state has landed
    waiter.join()
    session.wait_for_snapshots()

    assert session.stats.capture_waits == 1 and session.stats.capture_wait_s > 0
    assert not torch.equal(model.weight, at_step_1)  # the step did run afterwards
    blob = client.calls[-1][1]
    restored = torch.nn.Linear(3, 2)
    resumed = make_session(client, FTSUP_RESTORE_STEP="1", FTSUP_GENERATION="4")
    client.restore_blob = blob
    assert resumed.restore(restored, torch.optim.AdamW(restored.parameters())) == 1
    assert torch.equal(restored.weight, at_step_1)
    session.close()


def test_a_failed_background_copy_releases_the_optimizer_and_surfaces_at_the_next_wait():
    session = make_session(FakeClient())
    model, optimizer = model_and_optimizer()

    def broken(state):
        raise RuntimeError("host buffer allocation failed")

    session._handoff._buffers.capture = broken
    session.snapshot(1, model, optimizer)
    optimizer.step()  # does not hang on a copy that will never land
    with pytest.raises(RuntimeError, match="host buffer allocation failed"):
        session.wait_for_snapshots()
    session.close()


def test_synchronous_capture_copies_before_snapshot_returns_and_never_blocks_the_optimizer():
    client = FakeClient()
    session = Session(LaunchEnv.from_mapping(ENV), client, background_capture=False)
    model, optimizer = model_and_optimizer()
    at_step_0 = model.weight.detach().clone()
    session.snapshot(0, model, optimizer)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    session.wait_for_snapshots()
    assert session.stats.capture_waits == 0 and session.stats.last_copy_s > 0
    assert session.stats.last_held_s >= session.stats.last_copy_s
    state = snapshot_module.decode(client.calls[-1][1].payload, client.calls[-1][1].sha256)
    assert torch.equal(state["objects"]["model"]["weight"], at_step_0)
    session.close()
