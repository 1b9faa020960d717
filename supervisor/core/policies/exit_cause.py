"""Is a rank's exit its own failure, or collateral damage from a peer's?

When one rank of a gang dies, every rank talking to it fails a moment later on a broken
connection ("Connection closed by peer" from gloo, "remote process exited" from NCCL, a store
socket reset...). Whichever of those exits reaches the supervisor first would otherwise be
recorded as the generation's cause, and the operator would chase a healthy node. The core holds a
collateral-looking exit for a short settle window (generations.py) so the real cause (another rank's
own exit, or the death verdict of the node whose stream just closed) can name the failure.

Pure: judged on the output tail the agent sends with the exit. A false "collateral" costs only
the settle window; a missed one costs only the attribution (the generation ends either way).
"""

from __future__ import annotations

from ftsup.supervisor.core.inputs import TrainerExit
from ftsup.supervisor.core.state import ClusterState, Liveness

# Lower-cased fragments that torch.distributed backends and the c10d store print when the
# *other* end of a connection failed. Kept specific: a rank's own error must not match.
PEER_FAILURE_MARKS: tuple[str, ...] = (
    "connection closed by peer",  # gloo tcp pair
    "connection reset by peer",
    "broken pipe",
    "caused by a remote worker crashing",  # gloo's hint
    "remote process exited or there was a network error",  # NCCL ncclRemoteError
    "ncclremoteerror",
    "nccl communicator was aborted",
    "watchdog caught collective operation timeout",  # NCCL watchdog: a peer stopped participating
    "distnetworkerror",
    "failed to recv, got 0 bytes",  # c10d TCPStore: the store's host went away
    "connection was likely closed",
)


def looks_collateral(output_tail: str) -> bool:
    """True when the rank's last output says a peer or the store went away under it."""
    if not output_tail:
        return False
    text = output_tail[-4096:].lower()
    return any(mark in text for mark in PEER_FAILURE_MARKS)


def is_abnormal(exit_: TrainerExit) -> bool:
    """An exit that fails the generation: not a rank that said it finished, nor a plain script's 0."""
    return not exit_.finished and not (exit_.is_plain_script and exit_.exit_code == 0)


def suspects_besides(state: ClusterState, node_id: str) -> list[str]:
    """Members of the generation in force, other than `node_id`, the detector suspects now (a
    closed stream, an overdue heartbeat): a verdict on one of them is due within the detector's
    limits and would be the better cause."""
    generation = state.generation
    if generation is None:
        return []
    nodes, suspect = state.nodes, Liveness.SUSPECT
    return [m.node_id for m in generation.members
            if m.node_id != node_id and m.node_id in nodes and nodes[m.node_id].liveness is suspect]


def should_hold(state: ClusterState, exit_: TrainerExit) -> bool:
    """Hold this exit for the settle window instead of ending the generation on it now."""
    generation = state.generation
    if generation is None or generation.number != exit_.generation or not is_abnormal(exit_):
        return False
    return looks_collateral(exit_.output_tail) or bool(suspects_besides(state, exit_.node_id))
