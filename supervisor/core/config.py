"""The decision-relevant configuration: the job's shape and the detector thresholds.

Frozen and validated once; constructors reject absurd values naming the value and its limit, so
a bad flag fails at start-up rather than as a strange decision at 3 a.m.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from ftsup.supervisor.core.policies.interval import IntervalConfig
from ftsup.supervisor.core.policies.recompute import RecomputeConfig
from ftsup.supervisor.core.policies.sdc import SdcConfig
from ftsup.supervisor.core.policies.straggler import StragglerConfig
from ftsup.supervisor.core.policies.xid import XidPolicyConfig

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
    # The experiment record (GenerationStarted carries them): free-form, e.g. a git commit and a
    # data set snapshot id. Not part of config_hash, which identifies the configuration alone.
    code_version: str = ""
    data_version: str = ""
    # Elastic shrink (0: off, the job waits for nodes): with no spare to replace a lost node, run on
    # fewer nodes, down to this many, keeping the global batch through gradient accumulation, and
    # grow back at the next committed snapshot once nodes return. Only for data-parallel jobs
    # whose every rank holds the whole model and optimizer state (any rank's snapshot restores
    # any rank). A world of k nodes is allowed when k divides `nodes` (the accumulation is whole).
    min_nodes: int = 0
    # The restart budget: the job ends FAILED (JobFailed) at the failure after this many gang
    # restarts caused by failures (see budget.FAILURE_REASONS). None: unlimited, ftsup's default
    # for a job file (a fleet job expects failures); `ftsup run` defaults to 3.
    max_restarts: int | None = None
    # SIGTERM, then SIGKILL after this: room for a script's save-on-SIGTERM handler.
    sigterm_grace_s: float = 3.0
    cwd: str = ""  # the trainers' working directory; empty: the agent's node workdir

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"job name must match {_NAME.pattern}, got {self.name!r}")
        if not 1 <= self.nodes <= 100_000:
            raise ValueError(f"job nodes must be within [1, 100000], got {self.nodes}")
        if not 1 <= self.ranks_per_node <= 64:
            raise ValueError(f"ranks_per_node must be within [1, 64], got {self.ranks_per_node}")
        if not self.argv:
            raise ValueError("job argv (the trainer command) must not be empty")
        if self.master_port_span < 1:
            raise ValueError(f"master_port_span must be >= 1, got {self.master_port_span}")
        last_master_port = self.master_port_base + self.master_port_span - 1  # the planner's base + n % span
        if not (self.master_port_base >= 1024 and last_master_port <= 65535):
            raise ValueError(
                f"master ports {self.master_port_base}..{last_master_port} must lie within 1024..65535"
            )
        if not 0 <= self.min_nodes <= self.nodes:
            raise ValueError(f"min_nodes must be within [0, nodes={self.nodes}] (0: never shrink), got {self.min_nodes}")
        if self.max_restarts is not None and not 0 <= self.max_restarts <= 1_000_000:
            raise ValueError(f"max_restarts must be within [0, 1000000] (absent: unlimited), got {self.max_restarts}")
        if not (isinstance(self.sigterm_grace_s, (int, float)) and 0 <= self.sigterm_grace_s <= 3600):
            raise ValueError(f"sigterm_grace_s must be within [0, 3600], got {self.sigterm_grace_s!r}")
        if len(self.cwd) > 4096 or "\0" in self.cwd:
            raise ValueError(f"cwd must be a path of at most 4096 characters, got {self.cwd[:80]!r}")
        for key in ("code_version", "data_version"):
            value = getattr(self, key)
            if len(value) > 256 or not value.isprintable():
                raise ValueError(f"{key} must be printable and at most 256 characters, got {value!r}")

    @property
    def config_hash(self) -> str:
        """sha256 of a canonical text of the spec (versions excluded): equal configs, equal hashes."""
        shape: tuple[object, ...] = (self.name, self.nodes, self.ranks_per_node, self.argv, tuple(sorted(self.env)),
                                     self.master_port_base, self.master_port_span)
        if self.min_nodes:
            shape = (*shape, self.min_nodes)
        # Added keys join the text only when set, so existing jobs keep their hash.
        extra = tuple((k, v) for k, v, default in (("max_restarts", self.max_restarts, None),
                                                    ("sigterm_grace_s", self.sigterm_grace_s, 3.0),
                                                    ("cwd", self.cwd, "")) if v != default)
        canonical = repr(shape if not extra else (*shape, extra))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def is_elastic(self) -> bool:
        return 0 < self.min_nodes < self.nodes

    def shrunk_nodes(self, healthy: int) -> int | None:
        """The most nodes <= `healthy` the job may run on while short of `nodes`: at least
        `min_nodes` and a divisor of `nodes` (whole gradient accumulation). None: none allowed."""
        if not self.is_elastic:
            return None
        for count in range(min(healthy, self.nodes - 1), self.min_nodes - 1, -1):
            if self.nodes % count == 0:
                return count
        return None


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    heartbeat_interval_s: float = 1.0
    # Dead after this many intervals of silence on an open stream (a hung or partitioned node).
    heartbeat_misses: int = 2
    # A closed stream means the agent process died (its host closed the socket) unless the agent
    # reconnects within this; a transient loss that reconnects later is undone (see liveness.on_hello).
    reconnect_grace_s: float = 0.4
    # A new leader adds this to the one full timeout of grace it gives every node: agents first
    # learn the old leader is gone (its lease expires), then find the new one through NotLeader
    # answers and their reconnect backoff (at most 1 s between tries).
    failover_grace_s: float = 3.0
    # After a close, connect once to the node's peer port: refused, its agent is gone and the node
    # is dead without waiting out the grace (supervisor/agent_probe.py). Off: the grace alone
    # decides, and no supervisor opens a connection to a node (a policy that forbids it, or a
    # heartbeat-only baseline such as `ftsup bench detection`'s).
    agent_probe: bool = True

    def __post_init__(self) -> None:
        _positive("heartbeat_interval_s", self.heartbeat_interval_s, 60.0)
        _positive("reconnect_grace_s", self.reconnect_grace_s, 600.0)
        _positive("failover_grace_s", self.failover_grace_s, 600.0)
        if not 1 <= self.heartbeat_misses <= 100:
            raise ValueError(f"heartbeat_misses must be within [1, 100], got {self.heartbeat_misses}")

    @property
    def dead_after_s(self) -> float:
        return self.heartbeat_interval_s * self.heartbeat_misses


@dataclass(frozen=True, slots=True)
class CheckpointTiming:
    """When checkpoints off the step cadence happen and how long one may take.

    `is_auto`: request one whenever the Young/Daly interval (`interval`, from the measured cost and
    the observed MTBF) has passed since the last commit. A requested step lies at least
    `lead_steps` and `lead_s` ahead of the newest reported step, so the request reaches every
    rank (directive, then the agent's answer to a step report) before any of them gets there.
    `timeout_s`: an attempt not committed this long after it started is aborted (a rank that
    never writes its shard must not block every later checkpoint)."""

    is_auto: bool = False
    interval: IntervalConfig = IntervalConfig()
    lead_steps: int = 3
    lead_s: float = 2.0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if not 1 <= self.lead_steps <= 100_000:
            raise ValueError(f"lead_steps must be within [1, 100000], got {self.lead_steps}")
        _positive("lead_s", self.lead_s, 3600.0)
        _positive("timeout_s", self.timeout_s, 7 * 86400.0)


@dataclass(frozen=True, slots=True)
class CoreConfig:
    job: JobSpec
    detector: DetectorConfig = DetectorConfig()
    xid: XidPolicyConfig = XidPolicyConfig()
    straggler: StragglerConfig = StragglerConfig()
    sdc: SdcConfig = SdcConfig()
    recompute: RecomputeConfig = RecomputeConfig()  # SDC recompute checks (policies/recompute.py)
    # A confirmed straggler is swapped for a free spare; with no spare it is only reported (a
    # slow node beats a smaller world). False: always only report.
    is_straggler_swap_enabled: bool = True
    # After the supervisor starts, spares stand in for missing active nodes only after this long,
    # so a spare that registers first does not displace an active node still booting.
    spare_grace_s: float = 10.0
    allowed_nodes: frozenset[str] = frozenset()  # empty: any well-formed node id may join
    # Object-store checkpoints (issue 6): where (s3://bucket/prefix or a directory; "" = off) and
    # every how many steps (0 = only on request). The core only names the location; the shell
    # writes nothing itself, trainers write shards and the shell commits.
    checkpoint_location: str = ""
    checkpoint_every_steps: int = 0
    checkpoint_timing: CheckpointTiming = CheckpointTiming()
    # A rank exit that looks like collateral damage (a peer's connection broke under it) waits up
    # to this long for the real cause (another rank's own exit, a node's death verdict) before it
    # ends the generation itself; an exit with its own error ends the generation at once.
    exit_settle_s: float = 3.0
