"""mTLS, roles and health against real processes: a TLS supervisor, real agents, real supervisorctl.

Certificates come from `ftsup certs`. Covered refusals: an agent whose certificate names another
node, a client without a certificate, a read-only credential on a command. Plus: the standard
gRPC health service answers on the supervisor and on an agent's peer port, both daemons serve
/metrics over HTTPS to a client certificate from the CA (and to nobody else), and the supervisor
talks TLS to a real etcd member with client-certificate auth.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ftsup.common import tls
from ftsup.harness.certs import main as certs_main
from ftsup.harness.cluster import free_port, wait_until
from ftsup.supervisor.etcd_tls import make_tls_client
from ftsup.v1 import operator_pb2, operator_pb2_grpc
from tests.support.etcd_cluster import free_ports

pytestmark = pytest.mark.integration

ENV = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
DEADLINE_S = 30.0


@dataclass(frozen=True)
class Lab:
    pki: pathlib.Path
    address: str
    metrics_url: str
    admin_token: pathlib.Path
    read_token: pathlib.Path
    workdir: pathlib.Path

    def files(self, stem: str) -> tls.TlsFiles:
        return tls.TlsFiles(self.pki / f"{stem}.pem", self.pki / f"{stem}.key", self.pki / "ca.pem")

    def ctl(self, *args: str, cert: str | None = None, token: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
        command, *rest = args
        extra: list[str] = []
        if cert is not None:
            f = self.files(cert)
            extra += ["--tls-cert", str(f.cert), "--tls-key", str(f.key), "--tls-ca", str(f.ca)]
        if token is not None:
            extra += ["--token-file", str(token)]
        return subprocess.run([sys.executable, "-m", "ftsup.supervisor.ctl.main", "--address", self.address, command,
                               *rest, *extra], capture_output=True, text=True, timeout=60, env=ENV)


def secure_channel(address: str, files: tls.TlsFiles) -> grpc.Channel:
    return grpc.secure_channel(address, tls.channel_credentials(files))


def health_status(channel: grpc.Channel, service: str = "") -> int:
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(reply.status)


def wait_for(what: str, check, timeout_s: float = DEADLINE_S):  # type: ignore[no-untyped-def]
    """wait_until, where a daemon not answering yet (an RPC error) counts as "not yet"."""
    def answered():  # type: ignore[no-untyped-def]
        try:
            return check()
        except grpc.RpcError:
            return None

    return wait_until(answered, timeout_s, what)


def token_file(path: pathlib.Path, token: str) -> pathlib.Path:
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("security")
    pki = root / "pki"
    assert certs_main(["--out", str(pki), "--nodes", "node-1,node-9", "--supervisors", "sup-1",
                       "--operators", "alice:admin,bob:read"]) == 0
    job = root / "job.json"  # two nodes wanted: with one connected the job waits, no trainer starts
    job.write_text(json.dumps({"name": "sec", "nodes": 2, "ranks_per_node": 1, "argv": ["true"]}))
    port, metrics_port = free_port(), free_port()
    admin, read = token_file(root / "admin.token", "admin-token-0123456789"), token_file(root / "read.token", "read-token-0123456789")
    conf = root / "supervisor.toml"  # TLS and tokens through the config file, as a unit would run it
    conf.write_text(f'listen = "127.0.0.1:{port}"\ndata_dir = "{root / "log"}"\njob = "{job}"\n'
                    f'tls_cert = "{pki / "supervisor-sup-1.pem"}"\ntls_key = "{pki / "supervisor-sup-1.key"}"\n'
                    f'tls_ca = "{pki / "ca.pem"}"\noperator_token_file = "{admin}"\n'
                    f'operator_read_token_file = "{read}"\nmetrics_listen = "127.0.0.1:{metrics_port}"\n')
    log = open(root / "supervisor.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "ftsup.supervisor", "--config", str(conf)], stdout=log,
                               stderr=subprocess.STDOUT, env=ENV)
    lab = Lab(pki, f"127.0.0.1:{port}", f"https://127.0.0.1:{metrics_port}/metrics", admin, read, root)
    try:
        with secure_channel(lab.address, lab.files("operator-alice")) as channel:
            wait_for("the TLS supervisor's health service",
                     lambda: process.poll() is None and health_status(channel) == health_pb2.HealthCheckResponse.SERVING)
        yield lab
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


def start_agent(lab: Lab, node_id: str, cert: str, *extra: str) -> subprocess.Popen[str]:
    f = lab.files(cert)
    return subprocess.Popen(
        [sys.executable, "-m", "ftsup.agent", "--node-id", node_id, "--supervisor", lab.address, "--gpus", "0",
         "--xid-log", "none", "--workdir", str(lab.workdir / f"agent-{node_id}-{cert}"), "--log-json",
         "--tls-cert", str(f.cert), "--tls-key", str(f.key), "--tls-ca", str(f.ca), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    if process.poll() is None:
        process.terminate()
    return process.communicate(timeout=20)


def test_an_agent_with_its_own_certificate_joins_and_its_peer_port_serves_health_over_mtls(lab: Lab) -> None:
    agent = start_agent(lab, "node-1", "node-node-1")
    try:
        assert agent.stderr is not None

        def peer_port() -> int | None:
            line = agent.stderr.readline()  # type: ignore[union-attr]
            return json.loads(line)["peer_port"] if '"agent_listening"' in line else None

        port = wait_for("the agent's agent_listening line", peer_port)

        def connected() -> bool:
            nodes = json.loads(lab.ctl("nodes", "--json", cert="operator-alice").stdout or "{}").get("nodes", [])
            return any(n["node_id"] == "node-1" and n["connected"] for n in nodes)

        wait_for("node-1 to connect over mTLS", connected)
        with secure_channel(lab.address, lab.files("operator-bob")) as channel:
            assert health_status(channel, "ftsup.v1.Supervisor") == health_pb2.HealthCheckResponse.SERVING
            assert health_status(channel, "ftsup.v1.Operator") == health_pb2.HealthCheckResponse.SERVING
        with secure_channel(f"127.0.0.1:{port}", lab.files("node-node-9")) as channel:
            assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
            assert health_status(channel, "ftsup.v1.AgentPeer") == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(f"127.0.0.1:{port}") as plain, pytest.raises(grpc.RpcError):
            health_status(plain)  # the peer port speaks mTLS only
    finally:
        _, err = stop(agent)
    assert agent.returncode == 0, err[-2000:]


def scrape(url: str, lab: Lab, cert: str | None) -> str:
    """The /metrics page over HTTPS, verified against the lab CA, presenting `cert` when given."""
    context = ssl.create_default_context(cafile=str(lab.pki / "ca.pem"))
    if cert is not None:
        context.load_cert_chain(lab.pki / f"{cert}.pem", lab.pki / f"{cert}.key")
    with urllib.request.urlopen(url, context=context, timeout=5) as reply:
        return reply.read().decode()


def test_both_daemons_serve_metrics_over_https_to_a_certificate_from_the_ca_only(lab: Lab) -> None:
    assert "ftsup_is_leader 1.0" in scrape(lab.metrics_url, lab, "operator-bob")
    for refused in (lambda: scrape(lab.metrics_url, lab, None),  # no client certificate
                    lambda: urllib.request.urlopen(lab.metrics_url.replace("https:", "http:"), timeout=5)):
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            refused()
    metrics_port = free_port()
    agent = start_agent(lab, "node-1", "node-node-1", "--metrics-listen", f"127.0.0.1:{metrics_port}")
    try:
        page = wait_for("the agent's metrics over HTTPS",
                        lambda: _scrape_or_none(f"https://127.0.0.1:{metrics_port}/metrics", lab, "node-node-9"))
        assert 'ftsup_agent_trainers_alive{node="node-1"} 0.0' in page
    finally:
        _, err = stop(agent)
    assert agent.returncode == 0, err[-2000:]
    assert '"url": "https://127.0.0.1:' in err and '"client_certificates": "required"' in err


def _scrape_or_none(url: str, lab: Lab, cert: str) -> str | None:
    try:
        return scrape(url, lab, cert)
    except (urllib.error.URLError, ConnectionError):
        return None  # not listening yet


def test_an_agent_whose_certificate_names_another_node_is_refused_and_exits_3(lab: Lab) -> None:
    agent = start_agent(lab, "node-2", "node-node-9")
    try:
        code = agent.wait(timeout=DEADLINE_S)
    finally:
        _, err = stop(agent)
    assert code == 3, err[-2000:]  # refused for good: systemd does not restart it
    assert "node/node-9 may not speak for node 'node-2'" in err
    nodes = json.loads(lab.ctl("nodes", "--json", cert="operator-alice").stdout)["nodes"]
    assert "node-2" not in {n["node_id"] for n in nodes}


def test_a_client_without_a_certificate_is_refused_at_the_handshake(lab: Lab) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=(lab.pki / "ca.pem").read_bytes())
    with grpc.secure_channel(lab.address, credentials) as channel, pytest.raises(grpc.RpcError) as error:
        operator_pb2_grpc.OperatorStub(channel).GetStatus(operator_pb2.GetStatusRequest(), timeout=5)
    assert error.value.code() is grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(lab.address) as plain, pytest.raises(grpc.RpcError):
        operator_pb2_grpc.OperatorStub(plain).GetStatus(operator_pb2.GetStatusRequest(), timeout=5)


def test_read_only_credentials_read_but_get_exit_4_on_a_command(lab: Lab) -> None:
    # A node certificate is no operator: with the read token it may read, not command.
    assert lab.ctl("status", cert="node-node-1", token=lab.read_token).returncode == 0
    denied = lab.ctl("quarantine", "node-1", "--reason", "x", cert="node-node-1", token=lab.read_token)
    assert denied.returncode == 4 and "needs the admin role" in denied.stderr, denied.stderr
    assert "read-token-0123456789" not in denied.stderr
    unauthenticated = lab.ctl("status", cert="node-node-1")
    assert unauthenticated.returncode == 4 and "--token-file" in unauthenticated.stderr
    # The read operator certificate: the same refusal; the admin one gets past authorization
    # (node-1 is not connected now, so the command itself may succeed or be refused: not exit 4).
    bob = lab.ctl("drain", "nobody", "--reason", "x", cert="operator-bob")
    assert bob.returncode == 4 and "admin role" in bob.stderr
    alice = lab.ctl("drain", "nobody", "--reason", "x", cert="operator-alice")
    assert alice.returncode == 2 and "unknown node 'nobody'" in alice.stderr, alice.stderr
    admin_token = lab.ctl("drain", "nobody", "--reason", "x", cert="node-node-1", token=lab.admin_token)
    assert admin_token.returncode == 2 and "unknown node" in admin_token.stderr


def test_the_supervisor_reaches_etcd_over_tls_with_a_client_certificate(tmp_path: pathlib.Path) -> None:
    assert shutil.which("etcd") is not None, "etcd is not installed (`make test` installs etcd-server)"
    pki = tmp_path / "pki"
    assert certs_main(["--out", str(pki), "--supervisors", "etcd-1,sup-1"]) == 0
    client_port, peer_port = free_ports(2)
    etcd = subprocess.Popen(
        ["etcd", "--name", "e1", "--data-dir", str(tmp_path / "e1"),
         "--listen-client-urls", f"https://127.0.0.1:{client_port}",
         "--advertise-client-urls", f"https://127.0.0.1:{client_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"e1=http://127.0.0.1:{peer_port}",
         "--cert-file", str(pki / "supervisor-etcd-1.pem"), "--key-file", str(pki / "supervisor-etcd-1.key"),
         "--trusted-ca-file", str(pki / "ca.pem"), "--client-cert-auth",
         "--logger", "zap", "--log-outputs", str(tmp_path / "etcd.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    async def roundtrip() -> bytes:
        client = make_tls_client([f"127.0.0.1:{client_port}"], tls.TlsFiles(
            pki / "supervisor-sup-1.pem", pki / "supervisor-sup-1.key", pki / "ca.pem"))
        try:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                try:
                    await client.put(b"/ftsup/tls-check", b"ok")
                    break
                except Exception:
                    if time.monotonic() > deadline or etcd.poll() is not None:
                        raise
                    await asyncio.sleep(0.1)
            got = await client.get(b"/ftsup/tls-check")
            return bytes(got.value)
        finally:
            await client.close()

    try:
        assert asyncio.run(roundtrip()) == b"ok"
        plain = subprocess.run(["etcdctl", "--endpoints", f"127.0.0.1:{client_port}", "--dial-timeout=1s",
                                "get", "/ftsup/tls-check"], capture_output=True, text=True, timeout=30)
        assert plain.returncode != 0  # plaintext is refused by the TLS member
    finally:
        etcd.terminate()
        etcd.wait(timeout=20)


def test_the_supervisor_notifies_systemd_ready_then_watchdog_then_stopping(tmp_path: pathlib.Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(DEADLINE_S)  # a deadline per datagram
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"name": "notify", "nodes": 1, "argv": ["true"]}))
    env = {**ENV, "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"}
    process = subprocess.Popen([sys.executable, "-m", "ftsup.supervisor", "--listen", f"127.0.0.1:{free_port()}",
                                "--data-dir", str(tmp_path / "log"), "--job", str(job)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        received = [sock.recv(4096).decode() for _ in range(4)]
        ready = next(m for m in received if "READY=1" in m)
        assert f"MAINPID={process.pid}" in ready and "STATUS=serving on 127.0.0.1:" in ready
        assert sum(m == "WATCHDOG=1" for m in received) >= 2  # petted every 0.2 s from the event loop
        process.terminate()
        while "STOPPING=1" not in (message := sock.recv(4096).decode()):
            assert message in ("WATCHDOG=1",) or message.startswith("STATUS="), message
        assert process.wait(timeout=DEADLINE_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=20)
        sock.close()
