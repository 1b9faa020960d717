"""The supervisor runs inside its unit's sandbox: no W+X memory, only the system calls the unit allows.

systemd cannot run here (no systemd as PID 1), so the two directives that could break the daemon
are reproduced with what systemd itself relies on: `MemoryDenyWriteExecute=yes` with the kernel's
PR_SET_MDWE (refuse any mapping that is or becomes writable and executable; inherited across
exec), and `SystemCallFilter=` by tracing every system call of a real supervisor (strace -f) that
starts, registers a node through a real agent stream, appends and fsyncs its embedded log and
answers operator calls, then checking each against the unit's filter as `systemd-analyze` expands
it.
"""

from __future__ import annotations

import functools
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from ftsup.harness.cluster import ClusterSpec, LocalCluster
from ftsup.v1 import agent_pb2
from tests.integration.test_supervisor_wire import RawAgent, hello

pytestmark = pytest.mark.integration
ROOT = pathlib.Path(__file__).resolve().parents[2]
ANALYZE, STRACE = shutil.which("systemd-analyze"), shutil.which("strace")

WRAPPER = """#!{python}
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:  # PR_SET_MDWE, REFUSE_EXEC_GAIN
    sys.exit(77)
os.execv({strace!r}, [{strace!r}, "-f", "-qq", "-c", "-o", {trace!r}, {python!r}, *sys.argv[1:]])
"""


@functools.cache
def expand(group: str) -> frozenset[str]:
    """The system calls a `systemd-analyze syscall-filter` group names, nested groups expanded."""
    assert ANALYZE is not None
    out = subprocess.run([ANALYZE, "syscall-filter", "--no-pager", group], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        item = line.strip()
        if item and not item.startswith("#"):
            calls |= expand(item) if item.startswith("@") else {item}
    return frozenset(calls)


def allowed_by(unit: str) -> frozenset[str]:
    """What the unit's SystemCallFilter= lines allow (an allow list, then `~` deny lists)."""
    allowed: set[str] = set()
    for line in re.findall(r"^SystemCallFilter=(.*)$", (ROOT / "systemd" / unit).read_text(), flags=re.MULTILINE):
        deny = line.startswith("~")
        names = set().union(*(expand(n) if n.startswith("@") else {n} for n in line.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return frozenset(allowed)


def traced_calls(summary: pathlib.Path) -> set[str]:
    """System call names from strace -c's table (last column of each row)."""
    calls = set()
    for line in summary.read_text().splitlines():
        fields = line.split()
        if fields and re.fullmatch(r"[\d.]+", fields[0]) and fields[-1] != "total":
            calls.add(fields[-1])
    return calls


@pytest.mark.skipif(ANALYZE is None or STRACE is None, reason="needs systemd-analyze and strace")
def test_the_supervisor_works_without_wx_memory_and_within_its_units_syscall_filter(tmp_path: pathlib.Path) -> None:
    trace = tmp_path / "syscalls.txt"
    wrapper = tmp_path / "sandboxed-python"
    wrapper.write_text(WRAPPER.format(python=sys.executable, strace=STRACE, trace=str(trace)))
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", "import mmap; mmap.mmap(-1, 4096, prot=7)"], capture_output=True,
                           timeout=60)
    if probe.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux >= 6.3)")
    assert probe.returncode != 0 and b"PermissionError" in probe.stderr, "W+X memory must be refused under MDWE"

    spec = ClusterSpec(nodes=1, spares=0, ranks_per_node=1, trainer_argv=("true",))
    cluster = LocalCluster(spec, tmp_path / "cluster", python=str(wrapper))
    with cluster:
        cluster.start_supervisor_only()
        agent = RawAgent(cluster.address)
        agent.send(hello=hello("node-1", 1))
        assert agent.next_of("welcome").welcome.node_id == "node-1"
        agent.send(heartbeat=agent_pb2.Heartbeat(seq=1))
        assert [n.node_id for n in cluster.nodes()] == ["node-1"]
        assert any(r.event.WhichOneof("kind") == "node_registered" for r in cluster.events())
        agent.close()
    calls = traced_calls(trace)
    assert {"fsync", "epoll_wait", "accept4"} & calls and len(calls) > 20, sorted(calls)
    refused = calls - allowed_by("ftsup-supervisor.service")
    assert not refused, f"the unit's SystemCallFilter would refuse {sorted(refused)}"


@pytest.mark.skipif(ANALYZE is None, reason="needs systemd-analyze")
def test_the_agents_deny_list_leaves_what_cuda_nccl_and_torch_call() -> None:
    allowed_everything_but = set().union(*(
        expand(name) for line in re.findall(r"^SystemCallFilter=~(.*)$",
                                            (ROOT / "systemd" / "ftsup-agent.service").read_text(), flags=re.MULTILINE)
        for name in line.split()))
    needed = {"ioctl", "mmap", "mprotect", "mbind", "set_mempolicy", "get_mempolicy", "sched_setaffinity",
              "pidfd_open", "pidfd_getfd", "ptrace", "process_vm_readv", "perf_event_open", "memfd_create",
              "io_uring_setup", "shmget", "mlock", "setrlimit", "prctl", "clone3", "execve", "sendmsg"}
    assert not needed & allowed_everything_but
    assert {"init_module", "mount", "reboot", "swapon", "iopl", "settimeofday"} <= allowed_everything_but
