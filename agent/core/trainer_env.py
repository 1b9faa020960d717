"""The environment a trainer rank is started with.

Pure: builds the variables ftsup sets on top of the directive's own `env` entries. The rule: the
ftsup variables are applied last, so a directive cannot contradict the rank map (RANK, WORLD_SIZE,
...) the agent was told to run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RankSpec:
    """Everything needed to start one rank of one generation on this node."""

    generation: int
    rank: int
    local_rank: int
    local_world_size: int
    world_size: int
    master_addr: str
    master_port: int
    node_id: str
    agent_address: str  # grpc target of the trainer link, e.g. "unix:/var/lib/.../agent.sock"
    restore_step: int | None


def trainer_env(spec: RankSpec, directive_env: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Returns the variables to overlay on the agent's own environment for this rank."""
    env: dict[str, str] = {name: value for name, value in directive_env}
    env.update(ftsup_env(spec))
    return env


def ftsup_env(spec: RankSpec) -> Mapping[str, str]:
    return {
        "RANK": str(spec.rank),
        "LOCAL_RANK": str(spec.local_rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "FTSUP_AGENT_ADDRESS": spec.agent_address,
        "FTSUP_GENERATION": str(spec.generation),
        "FTSUP_NODE_ID": spec.node_id,
        "FTSUP_RESTORE_STEP": "" if spec.restore_step is None else str(spec.restore_step),
        "PYTHONUNBUFFERED": "1",
    }


def log_file_name(rank: int, generation: int) -> str:
    return f"rank-{rank}.gen-{generation}.log"
