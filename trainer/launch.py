"""What the agent tells a rank through its environment: torchrun's variables plus FTSUP_*.

Owns reading and checking the launch environment once, at start and again when a rank rejoins a
new generation in-process; a missing or malformed variable is refused naming it and its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LaunchEnv:
    """What the agent tells a rank through its environment (torchrun names plus FTSUP_*)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    generation: int
    node_id: str
    agent_address: str
    restore_step: int | None  # None: fresh start
    # An elastic job's full world (FTSUP_FULL_WORLD_SIZE); None: not elastic, the world is full.
    full_world_size: int | None = None

    @classmethod
    def from_mapping(cls, env: Mapping[str, str]) -> LaunchEnv:
        def need(name: str) -> str:
            value = env.get(name, "")
            if value == "":
                raise ValueError(f"environment variable {name} is not set")
            return value

        def need_int(name: str, low: int) -> int:
            raw = need(name)
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
            if value < low:
                raise ValueError(f"{name}={value} must be >= {low}")
            return value

        restore_raw = env.get("FTSUP_RESTORE_STEP", "")
        launch = cls(
            rank=need_int("RANK", 0),
            local_rank=need_int("LOCAL_RANK", 0),
            world_size=need_int("WORLD_SIZE", 1),
            local_world_size=need_int("LOCAL_WORLD_SIZE", 1),
            generation=need_int("FTSUP_GENERATION", 0),
            node_id=need("FTSUP_NODE_ID"),
            agent_address=need("FTSUP_AGENT_ADDRESS"),
            restore_step=None if restore_raw == "" else need_int("FTSUP_RESTORE_STEP", 0),
            full_world_size=need_int("FTSUP_FULL_WORLD_SIZE", 1) if env.get("FTSUP_FULL_WORLD_SIZE") else None,
        )
        full = launch.full_world_size
        if full is not None and (full < launch.world_size or full % launch.world_size):
            raise ValueError(f"FTSUP_FULL_WORLD_SIZE={full} must be a multiple of WORLD_SIZE={launch.world_size}")
        if launch.rank >= launch.world_size:
            raise ValueError(f"RANK={launch.rank} must be below WORLD_SIZE={launch.world_size}")
        if launch.local_rank >= launch.local_world_size:
            raise ValueError(
                f"LOCAL_RANK={launch.local_rank} must be below "
                f"LOCAL_WORLD_SIZE={launch.local_world_size}"
            )
        return launch

    @property
    def accumulation(self) -> int:
        """Micro-batches per step: full world / world (1 unless an elastic job runs shrunk)."""
        return 1 if self.full_world_size is None else self.full_world_size // self.world_size
