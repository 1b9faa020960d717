"""mTLS for every ftsup endpoint (gRPC and /metrics): credentials from PEM files and who the peer is.

Identity lives in one SAN URI per certificate (written by `ftsup certs`, see docs/ops.md):
  spiffe://ftsup/node/<node-id>                 an agent; must equal the node id in its Hello
  spiffe://ftsup/supervisor/<id>                a supervisor replica
  spiffe://ftsup/operator/<name>/<admin|read>   a person or script using supervisorctl
Servers check clients by that URI. Clients check servers at the handshake by an identity host
name every server certificate also carries (a DNS SAN under `.ftsup.invalid`, a reserved TLD no
real host has): `supervisor.ftsup.invalid` on every supervisor's, `<node-id>.node.ftsup.invalid`
on node <node-id>'s. A client asks for the name of the identity it expects (`expect_supervisor`,
`expect_node`: the channel's TLS target name), so the handshake itself refuses any other
certificate from the CA: a node's certificate cannot pass for a supervisor, nor for another node.
(gRPC Python gives a client no hook to read the server's certificate after the handshake; the
target name is the check the TLS library applies to it.)
The rule enforced here: a daemon never listens beyond loopback without TLS unless the operator
said `--insecure` (`check_listen`; the /metrics endpoint follows it too, common/metrics_http.py).
Shared by the supervisor, the agent and supervisorctl.
"""

from __future__ import annotations

import ipaddress
import pathlib
import ssl
from dataclasses import dataclass
from enum import Enum
from typing import Any

import grpc

SPIFFE_PREFIX = "spiffe://ftsup/"
IDENTITY_DOMAIN = "ftsup.invalid"  # RFC 2606: .invalid never resolves, so no real host shares these names
SUPERVISOR_HOST_NAME = f"supervisor.{IDENTITY_DOMAIN}"


class TlsConfigError(ValueError):
    """TLS files or flags are unusable; the text names the file or flag."""


class PeerKind(Enum):
    NODE = "node"
    SUPERVISOR = "supervisor"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Paths of this endpoint's certificate, its key and the CA that signs every peer."""

    cert: pathlib.Path
    key: pathlib.Path
    ca: pathlib.Path


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    kind: PeerKind
    name: str
    role: str = ""  # operators only: "admin" or "read"

    def __str__(self) -> str:
        return f"{self.kind.value}/{self.name}" + (f"/{self.role}" if self.role else "")


def tls_files(cert: str | pathlib.Path | None, key: str | pathlib.Path | None,
              ca: str | pathlib.Path | None, *, flag_prefix: str = "--tls") -> TlsFiles | None:
    """All three or none: a half-configured TLS setup is an error naming the missing flag."""
    given = {"cert": cert, "key": key, "ca": ca}
    if not any(given.values()):
        return None
    missing = [f"{flag_prefix}-{name}" for name, value in given.items() if not value]
    if missing:
        raise TlsConfigError(f"TLS needs {flag_prefix}-cert, {flag_prefix}-key and {flag_prefix}-ca;"
                             f" missing {', '.join(missing)}")
    files = TlsFiles(pathlib.Path(str(cert)), pathlib.Path(str(key)), pathlib.Path(str(ca)))
    for name, path in (("cert", files.cert), ("key", files.key), ("ca", files.ca)):
        if not path.is_file():
            raise TlsConfigError(f"{flag_prefix}-{name}: {path} is not a readable file")
    return files


def _read(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"cannot read {path}: {exc}") from exc


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server side: present our cert, require a client cert signed by the CA (mTLS)."""
    return grpc.ssl_server_credentials(
        [(_read(files.key), _read(files.cert))], root_certificates=_read(files.ca), require_client_auth=True
    )


def server_ssl_context(files: TlsFiles) -> ssl.SSLContext:
    """The same mTLS rule for plain-socket servers (the /metrics endpoint): present our
    certificate, require a client certificate signed by the CA; TLS 1.2 at least."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert, files.key)
        context.load_verify_locations(cafile=files.ca)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot use {files.cert}, {files.key} and CA {files.ca}: {exc}") from exc
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client side: verify the server against the CA, present our own cert."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(files.ca), private_key=_read(files.key), certificate_chain=_read(files.cert)
    )


def node_host_name(node_id: str) -> str:
    """The identity host name node `node_id`'s certificate carries (see the module docstring)."""
    return f"{node_id}.node.{IDENTITY_DOMAIN}"


def identity_host_names(kind: PeerKind, name: str) -> tuple[str, ...]:
    """The identity host names a server certificate of this identity carries (`ftsup certs`)."""
    if kind is PeerKind.SUPERVISOR:
        return (SUPERVISOR_HOST_NAME,)
    if kind is PeerKind.NODE:
        return (node_host_name(name),)
    return ()  # operators serve nothing


ChannelOptions = tuple[tuple[str, str], ...]


def expect_supervisor() -> ChannelOptions:
    """Channel options under which the TLS handshake accepts only a supervisor's certificate
    (agents' supervisor link, supervisorctl). Pass them to grpc.secure_channel(..., options=)."""
    return (("grpc.ssl_target_name_override", SUPERVISOR_HOST_NAME),)


def expect_node(node_id: str) -> ChannelOptions:
    """Channel options under which the TLS handshake accepts only node `node_id`'s certificate
    (the buddy / restore / SDC peer client talking to that node's AgentPeer service)."""
    return (("grpc.ssl_target_name_override", node_host_name(node_id)),)


def identity_of_cert(pem: bytes) -> PeerIdentity | None:
    """The ftsup identity in a certificate's SAN URIs, or None when it carries none."""
    from cryptography import x509  # only servers read peers' certificates; keeps supervisorctl light

    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        identity = parse_spiffe(uri)
        if identity is not None:
            return identity
    return None


def parse_spiffe(uri: str) -> PeerIdentity | None:
    if not uri.startswith(SPIFFE_PREFIX):
        return None
    parts = uri[len(SPIFFE_PREFIX):].split("/")
    try:
        kind = PeerKind(parts[0])
    except ValueError:
        return None
    if kind is PeerKind.OPERATOR:
        if len(parts) == 3 and parts[1] and parts[2] in ("admin", "read"):
            return PeerIdentity(kind, parts[1], parts[2])
        return None
    if len(parts) == 2 and parts[1]:
        return PeerIdentity(kind, parts[1])
    return None


def peer_identity(context: grpc.aio.ServicerContext[Any, Any]) -> PeerIdentity | None:
    """Who is on the other end of a TLS connection (verified by the handshake); None without TLS."""
    pems = list(context.auth_context().get("x509_pem_cert") or [])
    return identity_of_cert(pems[0]) if pems else None


def is_loopback(address: str) -> bool:
    """True when host:port names a loopback host only (127.0.0.0/8, ::1, localhost, unix:)."""
    if address.startswith("unix:"):
        return True
    address = address.split("://", 1)[-1]  # etcd endpoints come as URLs: http://127.0.0.1:2379
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


INSECURE_WARNING = (
    "plaintext beyond loopback (--insecure): node ids are unauthenticated claims. Anyone who can reach"
    " the supervisor's port can take a node's id (the real agent is then refused) or register as a spare"
    " and, once picked, receive the job's argv and env (secrets included) and fetch snapshots from peers."
    " Use mTLS (`ftsup certs`, docs/ops.md) outside a lab."
)


def check_listen(address: str, files: TlsFiles | None, *, is_insecure_allowed: bool, flag: str) -> None:
    """Refuses a plaintext listener beyond loopback unless --insecure says so."""
    if files is None and not is_insecure_allowed and not is_loopback(address):
        raise TlsConfigError(
            f"{flag} {address} is not loopback and no TLS is configured: pass --tls-cert/--tls-key/--tls-ca"
            " (`ftsup certs` makes a lab CA), or --insecure to accept plaintext on the network"
        )
