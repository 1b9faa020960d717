"""A real ftsup cluster on this machine: one supervisor and N agents as separate processes.

Used by `ftsup demo`, the integration tests and (later) the chaos harness. Each agent runs in its
own process group together with its trainer ranks, so "kill a node" is one killpg(SIGKILL):
the agent and every rank it launched vanish at once, as when a machine dies.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from ftsup.harness import orphan_guard, ports
from ftsup.v1 import events_pb2, operator_pb2, operator_pb2_grpc

T = TypeVar("T")


# Master ports a local job cycles through (one per generation, reused modulo the span): enough
# for a soak's generations to never reuse a port still in TIME_WAIT of the previous one.
MASTER_PORT_SPAN = 64


class ClusterError(RuntimeError):
    """The local cluster did not reach an expected state; the text says which and where the logs are."""


def free_port() -> int:
    """A loopback port reserved machine-wide until this process exits (harness/ports.py's rule:
    outside the ephemeral range, never handed to two sessions, bindable when reserved)."""
    return ports.reserve(1).first


def wait_until(check: Callable[[], T | None], timeout_s: float, what: str, poll_s: float = 0.1) -> T:
    """Polls `check` until it returns something truthy and returns that; raises ClusterError at
    the deadline. The one polling loop of the harness and the tests: wait on a condition, never
    sleep for an outcome."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(poll_s)


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 3
    spares: int = 1
    ranks_per_node: int = 2
    trainer_argv: tuple[str, ...] = ()
    trainer_env: tuple[tuple[str, str], ...] = ()
    heartbeat_interval_s: float = 1.0
    heartbeat_misses: int = 2
    reconnect_grace_s: float = 0.4
    job_name: str = "demo"
    # Trainers share this machine's 2 cores with the control plane; on GPU nodes they would not.
    trainer_nice: int = 10
    warm_trainers: int = 0  # pre-warmed trainer processes per agent (see agent/warm_pool.py)
    supervisors: int = 1  # more than one needs etcd_endpoints: replicas with leader election
    etcd_endpoints: tuple[str, ...] = ()
    etcd_prefix: str = ""
    agent_args: tuple[str, ...] = ()  # extra agent flags (e.g. short --hang-* limits for chaos runs)
    supervisor_args: tuple[str, ...] = ()  # extra supervisor flags (e.g. --checkpoint-location DIR)
    min_nodes: int = 0  # elastic: the job may shrink to this many nodes (0: never)
    # More job-file keys, set last (`ftsup run`: cwd, max_restarts, sigterm_grace_s, env, ports).
    job_keys: tuple[tuple[str, object], ...] = ()
    # The test harness's isolation: TMPDIR inside the workdir and OMP_NUM_THREADS=1 for every
    # trainer. `ftsup run` turns it off: the user's script sees the user's environment.
    is_isolated: bool = True


@dataclass(slots=True)
class NodeProcess:
    node_id: str
    role: str
    process: subprocess.Popen[bytes]
    log_path: pathlib.Path
    is_killed: bool = False


@dataclass
class LocalCluster:
    spec: ClusterSpec
    workdir: pathlib.Path
    python: str = sys.executable
    address: str = ""  # the replica queries go to first (any replica answers reads)
    addresses: list[str] = field(default_factory=list)
    replicas: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    supervisor: subprocess.Popen[bytes] | None = None
    agents: dict[str, NodeProcess] = field(default_factory=dict)
    _channel: grpc.Channel | None = None
    _replica_argv: dict[str, tuple[list[str], pathlib.Path]] = field(default_factory=dict)
    # node id -> the supervisor address(es) its agent dials instead of the replicas' (a chaos proxy)
    agent_routes: dict[str, str] = field(default_factory=dict)
    # process groups left behind by an agent killed alone (its trainers); stop() kills them too
    _orphan_groups: list[int] = field(default_factory=list)
    _paused_groups: set[int] = field(default_factory=set)
    _master_ports: ports.Reservation | None = None  # the job's master-port span, released by stop()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Starts the supervisor, then every agent (active nodes first, then spares)."""
        self.start_supervisor_only(ready_timeout_s)
        self.start_agents()

    def start_agents(self) -> None:
        """Starts every agent of the spec: active nodes first, then spares."""
        for i in range(self.spec.nodes):
            self.start_agent(f"node-{i + 1}", "active")
        for i in range(self.spec.spares):
            self.start_agent(f"spare-{i + 1}", "spare")

    def start_supervisor_only(self, ready_timeout_s: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "tmp").mkdir(exist_ok=True)
        job = {
            "name": self.spec.job_name,
            "nodes": self.spec.nodes,
            "ranks_per_node": self.spec.ranks_per_node,
            "argv": list(self.spec.trainer_argv),
            "env": {**({"OMP_NUM_THREADS": "1", "TMPDIR": str(self.workdir / "tmp")} if self.spec.is_isolated else {}),
                    **dict(self.spec.trainer_env)},
            # The whole span the planner cycles through (base + generation % span) is reserved.
            "master_port_base": self._reserve_master_ports().first,
            "master_port_span": MASTER_PORT_SPAN,
            **({"min_nodes": self.spec.min_nodes} if self.spec.min_nodes else {}),
            **dict(self.spec.job_keys),
        }
        job_path = self.workdir / "job.json"
        job_path.write_text(json.dumps(job, indent=2))
        if self.spec.supervisors > 1 and not self.spec.etcd_endpoints:
            raise ClusterError("more than one supervisor replica needs etcd_endpoints")
        for index in range(self.spec.supervisors):
            address = f"127.0.0.1:{free_port()}"
            argv = [self.python, "-m", "ftsup.supervisor", "--listen", address, "--job", str(job_path),
                    "--heartbeat-interval-s", str(self.spec.heartbeat_interval_s),
                    "--heartbeat-misses", str(self.spec.heartbeat_misses),
                    "--reconnect-grace-s", str(self.spec.reconnect_grace_s), "--log-json",
                    *self.spec.supervisor_args]
            if self.spec.etcd_endpoints:
                argv += ["--etcd", ",".join(self.spec.etcd_endpoints), "--etcd-prefix", self.spec.etcd_prefix]
            else:
                argv += ["--data-dir", str(self.workdir / "supervisor")]
            log_name = "supervisor.log" if self.spec.supervisors == 1 else f"supervisor-{index + 1}.log"
            self._replica_argv[address] = (argv, self.workdir / log_name)
            self.replicas[address] = self._spawn(argv, self.workdir / log_name)
            self.addresses.append(address)
        self.address = self.addresses[0]
        self.supervisor = self.replicas[self.address]
        for address in self.addresses:
            self.wait_for(functools.partial(self._answers, address), ready_timeout_s, f"the supervisor at {address}")

    def _reserve_master_ports(self) -> ports.Reservation:
        if self._master_ports is None:
            self._master_ports = ports.reserve(MASTER_PORT_SPAN)
        return self._master_ports

    def start_agent(self, node_id: str, role: str, extra_args: tuple[str, ...] = ()) -> NodeProcess:
        node_dir = self.workdir / "nodes" / node_id
        node_dir.mkdir(parents=True, exist_ok=True)
        process = self._spawn(
            [self.python, "-m", "ftsup.agent", "--node-id", node_id, "--role", role,
             "--supervisor", self.agent_routes.get(node_id) or ",".join(self.addresses),
             "--workdir", str(node_dir), "--heartbeat-interval-s", str(self.spec.heartbeat_interval_s),
             "--gpus", "0", "--trainer-nice", str(self.spec.trainer_nice),
             "--warm-trainers", str(self.spec.warm_trainers), "--xid-log", str(node_dir / "kern.log"),
             "--log-json", *self.spec.agent_args, *extra_args],
            node_dir / "agent.log",
        )
        node = NodeProcess(node_id, role, process, node_dir / "agent.log")
        self.agents[node_id] = node
        return node

    def _spawn(self, argv: list[str], log_path: pathlib.Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "GRPC_VERBOSITY": "ERROR", "PYTHONUNBUFFERED": "1",
               **({"TMPDIR": str(self.workdir / "tmp")} if self.spec.is_isolated else {})}
        with open(log_path, "ab") as log:
            # A new session per process: killpg() then takes an agent and all its ranks.
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        orphan_guard.watch(process)  # (stopped even if this process is SIGKILLed: harness/orphan_guard.py)
        return process

    def inject_xid(self, node_id: str, code: int, text: str = "injected by the test harness") -> float:
        """Appends a real-format NVRM Xid line to the node's kernel log (which its agent follows)."""
        line = f"[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python, {text}\n"
        injected_at = time.time()
        with open(self.workdir / "nodes" / node_id / "kern.log", "a") as log:
            log.write(line)
        return injected_at

    def kill_node(self, node_id: str) -> float:
        """SIGKILLs the node's agent and its trainer ranks; returns the wall time of the kill."""
        node = self.agents[node_id]
        killed_at = time.time()
        os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=10)
        node.is_killed = True
        return killed_at

    def kill_agent_only(self, node_id: str) -> float:
        """SIGKILLs the node's agent process alone (an agent crash): its trainer ranks live on."""
        node = self.agents[node_id]
        killed_at = time.time()
        node.process.kill()
        node.process.wait(timeout=10)
        node.is_killed = True
        self._orphan_groups.append(node.process.pid)
        return killed_at

    def pause_node(self, node_id: str) -> float:
        """SIGSTOPs the node's agent and ranks: a silent hang, every socket left open."""
        pgid = self.agents[node_id].process.pid
        paused_at = time.time()
        os.killpg(pgid, signal.SIGSTOP)
        self._paused_groups.add(pgid)
        return paused_at

    def resume_node(self, node_id: str) -> None:
        pgid = self.agents[node_id].process.pid
        os.killpg(pgid, signal.SIGCONT)
        self._paused_groups.discard(pgid)

    def trainer_pid(self, node_id: str, rank: int, generation: int) -> int | None:
        """The pid the node's agent logged for a rank of a generation (`trainer_started`, or
        `trainer_rejoined` when a live process joined it in-process), or None."""
        pid = None
        log_path = self.agents[node_id].log_path
        for line in log_path.read_text(errors="replace").splitlines():
            if '"trainer_started"' not in line and '"trainer_rejoined"' not in line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("rank") == rank and entry.get("generation") == generation:
                pid = int(entry["pid"])
        return pid

    def kill_supervisor(self, address: str) -> float:
        """SIGKILLs one supervisor replica; queries move to a replica still running."""
        killed_at = time.time()
        process = self.replicas[address]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        if self.address == address:
            alive = [a for a, p in self.replicas.items() if p.poll() is None]
            self.address = alive[0]
            self.supervisor = self.replicas[self.address]
            if self._channel is not None:
                self._channel.close()
            self._channel = grpc.insecure_channel(self.address)
        return killed_at

    def restart_supervisor(self, address: str, ready_timeout_s: float = 60.0) -> None:
        """Starts a killed replica again on its address; it rejoins as a follower."""
        if self.replicas[address].poll() is None:
            raise ClusterError(f"the supervisor at {address} is still running")
        argv, log_path = self._replica_argv[address]
        self.replicas[address] = self._spawn(argv, log_path)
        self.wait_for(lambda: self._answers(address), ready_timeout_s, f"the restarted supervisor at {address}")

    def leader(self) -> operator_pb2.GetLeaderResponse | None:
        """The replica that leads now, asked of every running replica; None during an election."""
        return self.leader_excluding("")

    def leader_excluding(self, skip: str) -> operator_pb2.GetLeaderResponse | None:
        for address, process in self.replicas.items():
            if address == skip or process.poll() is not None:
                continue
            reply = self.replica_view(address)
            if reply is not None and reply.is_leader:
                return reply
        return None

    def replica_view(self, address: str) -> operator_pb2.GetLeaderResponse | None:
        """One replica's own view (role, term, applied seq); None when it does not answer."""
        try:
            with grpc.insecure_channel(address) as channel:
                return operator_pb2_grpc.OperatorStub(channel).GetLeader(operator_pb2.GetLeaderRequest(), timeout=2)
        except grpc.RpcError:
            return None

    def stop(self) -> None:
        for pgid in self._paused_groups:  # a stopped process would not act on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
        for pgid in self._orphan_groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        for node in self.agents.values():
            terminate_group(node.process)
        for process in self.replicas.values():
            terminate_group(process)
        if self._channel is not None:
            self._channel.close()
        if self._master_ports is not None:
            ports.release(self._master_ports)
            self._master_ports = None

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries --------------------------------------------------------------------------------
    def _stub(self) -> operator_pb2_grpc.OperatorStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return operator_pb2_grpc.OperatorStub(self._channel)

    def _answers(self, address: str) -> bool:
        try:
            with grpc.insecure_channel(address) as channel:
                operator_pb2_grpc.OperatorStub(channel).GetStatus(operator_pb2.GetStatusRequest(), timeout=2)
            return True
        except grpc.RpcError:
            return False

    def status(self) -> operator_pb2.GetStatusResponse:
        return self._stub().GetStatus(operator_pb2.GetStatusRequest(), timeout=5)

    def nodes(self) -> list[operator_pb2.NodeInfo]:
        return list(self._stub().ListNodes(operator_pb2.ListNodesRequest(), timeout=5).nodes)

    def events(self, since_seq: int = 1) -> list[events_pb2.Record]:
        return list(self._stub().ListEvents(operator_pb2.ListEventsRequest(since_seq=since_seq), timeout=10))

    def trainer_step(self, node_id: str, rank: int = 0, generation: int = 1) -> int:
        """The last step a rank printed to its own log (0 before the first), read without the supervisor.

        Rank 0 of the example trainer prints one line per step; this lets a test watch training
        go on while no supervisor can answer (no leader, etcd without quorum).
        """
        path = self.workdir / "nodes" / node_id / f"rank-{rank}.gen-{generation}.log"
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return 0
        steps = re.findall(r"^step (\d+) ", text, flags=re.MULTILINE)
        return int(steps[-1]) if steps else 0

    def wait_for(self, check: Callable[[], T | None], timeout_s: float, what: str, poll_s: float = 0.1) -> T:
        """Polls `check` until it returns something truthy; raises ClusterError at the deadline,
        or at once if the supervisor exited meanwhile."""
        def checked() -> T | None:
            try:
                value = check()
            except grpc.RpcError:  # (a supervisor that exited resets its connections: say why it exited)
                self._raise_if_supervisor_died(what)
                raise
            if not value:
                self._raise_if_supervisor_died(what)
            return value

        return wait_until(checked, timeout_s, f"{what}; logs in {self.workdir}", poll_s)

    def _raise_if_supervisor_died(self, what: str) -> None:
        if self.supervisor is not None and self.supervisor.poll() is not None:
            log_path = self._replica_argv[self.address][1] if self.address in self._replica_argv \
                else self.workdir / "supervisor.log"
            raise ClusterError(
                f"the supervisor at {self.address} exited with code {self.supervisor.returncode} while waiting"
                f" for {what}; the end of {log_path}:\n{_tail(log_path, LOG_TAIL_LINES)}"
            )


LOG_TAIL_LINES = 15  # of a supervisor that exited, in the error (CI shows the error, not the file)


def _tail(path: pathlib.Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


def terminate_group(process: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """SIGTERM a process group, SIGKILL it after `grace_s`; quiet when it is already gone."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        process.wait(timeout=grace_s)
