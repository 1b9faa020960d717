"""`ftsup certs` output and the TLS helpers: identities in SAN URIs, modes, plaintext refusal."""

from __future__ import annotations

import pathlib
import stat

import pytest
from cryptography import x509

from ftsup.common import tls
from ftsup.harness.certs import main as certs_main


def test_certs_writes_a_ca_and_one_identity_per_subject(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "pki"
    assert certs_main(["--out", str(out), "--nodes", "node-1,node-2", "--supervisors", "sup-1",
                       "--operators", "alice:admin,bob:read"]) == 0
    expect = {
        "node-node-1.pem": tls.PeerIdentity(tls.PeerKind.NODE, "node-1"),
        "supervisor-sup-1.pem": tls.PeerIdentity(tls.PeerKind.SUPERVISOR, "sup-1"),
        "operator-alice.pem": tls.PeerIdentity(tls.PeerKind.OPERATOR, "alice", "admin"),
        "operator-bob.pem": tls.PeerIdentity(tls.PeerKind.OPERATOR, "bob", "read"),
    }
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    for name, identity in expect.items():
        pem = (out / name).read_bytes()
        assert tls.identity_of_cert(pem) == identity
        x509.load_pem_x509_certificate(pem).verify_directly_issued_by(ca)  # raises if not signed by the CA
        key = out / name.replace(".pem", ".key")
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600
    server = x509.load_pem_x509_certificate((out / "supervisor-sup-1.pem").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)


def test_certs_reuses_the_ca_when_adding_a_node(tmp_path: pathlib.Path) -> None:
    assert certs_main(["--out", str(tmp_path), "--nodes", "a"]) == 0
    ca_before = (tmp_path / "ca.pem").read_bytes()
    assert certs_main(["--out", str(tmp_path), "--nodes", "b"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() == ca_before


@pytest.mark.parametrize("args", [["--operators", "carol:root"], ["--nodes", "bad/name"], []])
def test_certs_rejects_bad_names_and_roles(tmp_path: pathlib.Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert certs_main(["--out", str(tmp_path), *args]) == 2
    assert "ftsup certs:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("uri", "identity"),
    [
        ("spiffe://ftsup/node/n1", tls.PeerIdentity(tls.PeerKind.NODE, "n1")),
        ("spiffe://ftsup/operator/al/read", tls.PeerIdentity(tls.PeerKind.OPERATOR, "al", "read")),
        ("spiffe://ftsup/operator/al/root", None),
        ("spiffe://ftsup/node/", None),
        ("spiffe://other/node/n1", None),
        ("spiffe://ftsup/robot/x", None),
    ],
)
def test_spiffe_uris_parse_strictly(uri: str, identity: tls.PeerIdentity | None) -> None:
    assert tls.parse_spiffe(uri) == identity


def test_plaintext_listening_beyond_loopback_needs_insecure() -> None:
    tls.check_listen("127.0.0.1:7070", None, is_insecure_allowed=False, flag="--listen")
    tls.check_listen("[::1]:7070", None, is_insecure_allowed=False, flag="--listen")
    tls.check_listen("0.0.0.0:7070", None, is_insecure_allowed=True, flag="--listen")
    with pytest.raises(tls.TlsConfigError, match="--listen 0.0.0.0:7070 is not loopback.*--insecure"):
        tls.check_listen("0.0.0.0:7070", None, is_insecure_allowed=False, flag="--listen")


def test_half_a_tls_configuration_names_the_missing_flag(tmp_path: pathlib.Path) -> None:
    with pytest.raises(tls.TlsConfigError, match="missing --tls-key, --tls-ca"):
        tls.tls_files(tmp_path / "c.pem", None, None)
    with pytest.raises(tls.TlsConfigError, match="--tls-ca: .* is not a readable file"):
        (tmp_path / "c.pem").write_text("x")
        tls.tls_files(tmp_path / "c.pem", tmp_path / "c.pem", tmp_path / "missing.pem")


def test_the_supervisor_refuses_a_plaintext_public_listener(tmp_path: pathlib.Path) -> None:
    from ftsup.supervisor.config import ConfigError, load

    job = tmp_path / "job.json"
    job.write_text('{"name": "t", "nodes": 1, "argv": ["true"]}')
    with pytest.raises(ConfigError, match="--listen 0.0.0.0:7070 is not loopback"):
        load(["--job", str(job), "--listen", "0.0.0.0:7070"])
    assert load(["--job", str(job), "--listen", "0.0.0.0:7070", "--insecure"]).server_tls is None
    with pytest.raises(ConfigError, match="--etcd 10.0.0.5:2379 is not loopback"):
        load(["--job", str(job), "--etcd", "10.0.0.5:2379"])


def test_the_agent_refuses_a_plaintext_public_peer_listener() -> None:
    from ftsup.agent.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="--host 10.1.2.3:0 is not loopback"):
        parse_config(["--node-id", "n", "--supervisor", "s:1", "--host", "10.1.2.3"], environ={})
    assert parse_config(["--node-id", "n", "--supervisor", "s:1", "--host", "10.1.2.3", "--insecure", "--gpus", "0"],
                        environ={}).tls_files is None


def test_a_plaintext_public_metrics_address_is_refused_saying_what_to_do(tmp_path: pathlib.Path) -> None:
    from ftsup.agent.config import ConfigError as AgentConfigError
    from ftsup.agent.config import parse_config
    from ftsup.supervisor.config import ConfigError, load

    job = tmp_path / "job.json"
    job.write_text('{"name": "t", "nodes": 1, "argv": ["true"]}')
    with pytest.raises(ConfigError) as refused:
        load(["--job", str(job), "--metrics-listen", "0.0.0.0:9464"])
    message = str(refused.value)
    assert message.startswith("--metrics-listen 0.0.0.0:9464 is not loopback and no TLS is configured")
    for remedy in ("--tls-cert/--tls-key/--tls-ca", "HTTPS", "127.0.0.1:9464", "--insecure"):
        assert remedy in message
    agent = ["--node-id", "n", "--supervisor", "s:1", "--gpus", "0"]
    with pytest.raises(AgentConfigError, match=r"--metrics-listen :9465 is not loopback.*--insecure"):
        parse_config([*agent, "--metrics-listen", ":9465"], environ={})
    # Loopback plaintext stays allowed; --insecure or TLS allow any address.
    assert load(["--job", str(job), "--metrics-listen", "127.0.0.1:9464"]).metrics_listen == "127.0.0.1:9464"
    assert parse_config([*agent, "--metrics-listen", "[::1]:9465"], environ={}).metrics_listen == "[::1]:9465"
    assert load(["--job", str(job), "--metrics-listen", "0.0.0.0:9464", "--insecure"]).server_tls is None
    assert parse_config([*agent, "--metrics-listen", "0.0.0.0:9465", "--insecure"], environ={}).tls_files is None
    assert certs_main(["--out", str(tmp_path / "pki"), "--nodes", "n", "--supervisors", "s"]) == 0
    pki = tmp_path / "pki"
    with_tls = load(["--job", str(job), "--metrics-listen", "0.0.0.0:9464", "--tls-cert", str(pki / "supervisor-s.pem"),
                     "--tls-key", str(pki / "supervisor-s.key"), "--tls-ca", str(pki / "ca.pem")])
    assert with_tls.server_tls is not None and with_tls.metrics_listen == "0.0.0.0:9464"


async def test_a_peer_client_expecting_one_node_accepts_only_that_nodes_certificate(tmp_path: pathlib.Path) -> None:
    """The helper the peer client uses (tls.expect_node): another node's certificate from the same
    CA, valid for the same host, fails the handshake; a supervisor's does not pass for a node."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    pki = tmp_path / "pki"
    assert certs_main(["--out", str(pki), "--nodes", "node-1,node-9", "--supervisors", "sup-1"]) == 0

    def files(stem: str) -> tls.TlsFiles:
        return tls.TlsFiles(pki / f"{stem}.pem", pki / f"{stem}.key", pki / "ca.pem")

    async def answers(server_stem: str, options: tls.ChannelOptions) -> bool:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(files(server_stem)))
        await server.start()
        try:
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials(files("node-node-1")),
                                               options=options) as channel:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return True
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE  # the handshake, not the service, said no
            return False
        finally:
            await server.stop(0)

    assert await answers("node-node-1", tls.expect_node("node-1"))
    assert not await answers("node-node-9", tls.expect_node("node-1"))
    assert not await answers("supervisor-sup-1", tls.expect_node("node-1"))
    assert await answers("supervisor-sup-1", tls.expect_supervisor())
    assert not await answers("node-node-9", tls.expect_supervisor())
