"""The environment a trainer rank is started with: torchrun's variables, with torchrun's meanings,
plus ftsup's own.

Pure: builds the variables ftsup sets on top of the directive's own `env` entries. The rule: the
ftsup variables are applied last, so a directive cannot contradict the rank map (RANK, WORLD_SIZE,
...) the agent was told to run. A few of torchrun's are defaults only (OMP_NUM_THREADS,
TORCH_NCCL_ASYNC_ERROR_HANDLING): torchrun too leaves them alone when the user set them.
Differences from torchrun, on purpose: TORCHELASTIC_USE_AGENT_STORE is False (ftsup hosts no
TCPStore; rank 0 does, at MASTER_ADDR:MASTER_PORT), TORCHELASTIC_RUN_ID is the job name, and
TORCHELASTIC_RESTART_COUNT counts the gang restarts the supervisor made after failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# torchrun's list (torch.distributed.elastic.agent.server.api): the signals its agent forwards.
SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"


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
    restart_count: int = 0  # gang restarts after failures so far (the supervisor's count)
    max_restarts: int = -1  # the job's budget, -1: unlimited
    run_id: str = ""  # the job name
    error_file: str = ""  # where torch's @record writes the rank's exception (TORCHELASTIC_ERROR_FILE)

    @property
    def group_rank(self) -> int:
        """This node's index in the gang: ranks are placed node by node, contiguously."""
        return self.rank // self.local_world_size

    @property
    def group_world_size(self) -> int:
        return max(1, self.world_size // self.local_world_size)


def trainer_env(spec: RankSpec, directive_env: Sequence[tuple[str, str]],
                inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """Returns the variables to overlay on the agent's own environment (`inherited`) for this rank."""
    env: dict[str, str] = {name: value for name, value in directive_env}
    visible = {**(inherited or {}), **env}
    env.update(torchrun_defaults(spec, visible))
    env.update(torchrun_env(spec))
    env.update(ftsup_env(spec))
    return env


def torchrun_defaults(spec: RankSpec, visible: Mapping[str, str]) -> Mapping[str, str]:
    """Set only where the user did not: torchrun's OMP_NUM_THREADS=1 with several local ranks
    (so they do not oversubscribe the cores) and NCCL's async error handling."""
    defaults: dict[str, str] = {}
    if spec.local_world_size > 1 and "OMP_NUM_THREADS" not in visible:
        defaults["OMP_NUM_THREADS"] = "1"
    if "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in visible:
        defaults["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    return defaults


def torchrun_env(spec: RankSpec) -> Mapping[str, str]:
    env = {
        "RANK": str(spec.rank),
        "LOCAL_RANK": str(spec.local_rank),
        "WORLD_SIZE": str(spec.world_size),
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "GROUP_RANK": str(spec.group_rank),
        "GROUP_WORLD_SIZE": str(spec.group_world_size),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(spec.rank),
        "ROLE_WORLD_SIZE": str(spec.world_size),
        "MASTER_ADDR": spec.master_addr,
        "MASTER_PORT": str(spec.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(spec.restart_count),
        # torchrun reports its budget; an unlimited ftsup job has none to report
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts) if spec.max_restarts >= 0 else "-1",
        "TORCHELASTIC_RUN_ID": spec.run_id or "none",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS_TO_HANDLE,
    }
    if spec.error_file:
        env["TORCHELASTIC_ERROR_FILE"] = spec.error_file
    return env


def ftsup_env(spec: RankSpec) -> Mapping[str, str]:
    return {
        "FTSUP_AGENT_ADDRESS": spec.agent_address,
        "FTSUP_GENERATION": str(spec.generation),
        "FTSUP_NODE_ID": spec.node_id,
        "FTSUP_RESTORE_STEP": "" if spec.restore_step is None else str(spec.restore_step),
        "PYTHONUNBUFFERED": "1",
    }


def log_file_name(rank: int, generation: int) -> str:
    return f"rank-{rank}.gen-{generation}.log"


def error_file_name(rank: int, generation: int) -> str:
    return f"rank-{rank}.gen-{generation}.error.json"
