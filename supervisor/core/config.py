"""The decision-relevant configuration: the job's shape and the detector thresholds.

Frozen and validated once; constructors reject absurd values naming the value and its limit, so
a bad flag fails at start-up rather than as a strange decision at 3 a.m.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from supervisor.core.policies.straggler import StragglerConfig
from supervisor.core.policies.xid import XidPolicyConfig

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _positive(name: str, value: float, limit: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= limit):
        raise ValueError(f"{name} must be a number in (0, {limit}], got {value!r}")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run: the same trainer command on every node, `ranks_per_node` processes each."""

    name: str
    nodes: int
    ranks_per_node: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    master_port_base: int = 29500
    master_port_span: int = 500

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"job name must match {_NAME.pattern}, got {self.name!r}")
        if not 1 <= self.nodes <= 100_000:
            raise ValueError(f"job nodes must be within [1, 100000], got {self.nodes}")
        if not 1 <= self.ranks_per_node <= 64:
            raise ValueError(f"ranks_per_node must be within [1, 64], got {self.ranks_per_node}")
        if not self.argv:
            raise ValueError("job argv (the trainer command) must not be empty")
        if not (1024 <= self.master_port_base and self.master_port_base + self.master_port_span <= 65535):
            raise ValueError(
                f"master ports {self.master_port_base}..{self.master_port_base + self.master_port_span}"
                " must lie within 1024..65535"
            )
        if self.master_port_span < 1:
            raise ValueError(f"master_port_span must be >= 1, got {self.master_port_span}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    heartbeat_interval_s: float = 1.0
    # Dead after this many intervals of silence on an open stream (a hung or partitioned node).
    heartbeat_misses: int = 2
    # A closed stream means the agent process died (its host closed the socket) unless the agent
    # reconnects within this; a transient loss that reconnects later is undone (see decide).
    reconnect_grace_s: float = 0.4

    def __post_init__(self) -> None:
        _positive("heartbeat_interval_s", self.heartbeat_interval_s, 60.0)
        _positive("reconnect_grace_s", self.reconnect_grace_s, 600.0)
        if not 1 <= self.heartbeat_misses <= 100:
            raise ValueError(f"heartbeat_misses must be within [1, 100], got {self.heartbeat_misses}")

    @property
    def dead_after_s(self) -> float:
        return self.heartbeat_interval_s * self.heartbeat_misses


@dataclass(frozen=True, slots=True)
class CoreConfig:
    job: JobSpec
    detector: DetectorConfig = DetectorConfig()
    xid: XidPolicyConfig = XidPolicyConfig()
    straggler: StragglerConfig = StragglerConfig()
    # A confirmed straggler is swapped for a free spare; with no spare it is only reported (a
    # slow node beats a smaller world). False: always only report.
    is_straggler_swap_enabled: bool = True
    # After the supervisor starts, spares stand in for missing active nodes only after this long,
    # so a spare that registers first does not displace an active node still booting.
    spare_grace_s: float = 10.0
    allowed_nodes: frozenset[str] = frozenset()  # empty: any well-formed node id may join
