"""`ftsup certs`: a lab CA and the certificates a small ftsup setup needs, in one directory.

For tests and labs, not production PKI: the CA key is written next to the certificates. Each
certificate carries its ftsup identity as a SAN URI (see common/tls.py); server certificates
(nodes, supervisors) also carry their identity host name (`supervisor.ftsup.invalid`,
`<id>.node.ftsup.invalid`), which is what ftsup's clients check, plus the DNS/IP names it serves
under for other TLS clients (curl on /metrics). Keys are ECDSA P-256, files mode 600.

Layout of --out:  ca.pem ca.key  node-<id>.pem/.key  supervisor-<id>.pem/.key  operator-<name>.pem/.key
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import pathlib
import re
import sys
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ftsup.common.tls import SPIFFE_PREFIX, PeerKind, identity_host_names

NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
ROLES = ("admin", "read")
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


class CertsError(ValueError):
    """A bad name, role or host; the text names it."""


@dataclass(frozen=True, slots=True)
class Subject:
    kind: str  # node | supervisor | operator
    name: str
    role: str = ""

    @property
    def uri(self) -> str:
        return f"{SPIFFE_PREFIX}{self.kind}/{self.name}" + (f"/{self.role}" if self.role else "")

    @property
    def stem(self) -> str:
        return f"{self.kind}-{self.name}"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: pathlib.Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _host_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ftsup lab CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(subject: Subject, hosts: tuple[str, ...], ca_key: ec.EllipticCurvePrivateKey,
          ca_cert: x509.Certificate, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf certificate: CN = name, SAN = the identity URI (+ host names for servers)."""
    key = _key()
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(subject.uri)]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if subject.kind != "operator":  # nodes serve AgentPeer, supervisors serve everyone
        names += _host_names((*identity_host_names(PeerKind(subject.kind), subject.name), *hosts, subject.name))
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    now = datetime.datetime.now(datetime.UTC)
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, subject.name)]
    if subject.role:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, subject.role))
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name(attributes)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def parse_subjects(nodes: str, supervisors: str, operators: str) -> list[Subject]:
    subjects: list[Subject] = []
    for kind, text in (("node", nodes), ("supervisor", supervisors)):
        for name in (n.strip() for n in text.split(",") if n.strip()):
            if not NAME_RE.fullmatch(name):
                raise CertsError(f"--{kind}s: {name!r} must match [A-Za-z0-9._-]{{1,64}}")
            subjects.append(Subject(kind, name))
    for item in (o.strip() for o in operators.split(",") if o.strip()):
        name, _, role = item.partition(":")
        if not NAME_RE.fullmatch(name) or role not in ROLES:
            raise CertsError(f"--operators: {item!r} must be NAME:admin or NAME:read")
        subjects.append(Subject("operator", name, role))
    if not subjects:
        raise CertsError("name at least one of --nodes, --supervisors, --operators")
    return subjects


def write_all(out: pathlib.Path, subjects: list[Subject], hosts: tuple[str, ...], days: int) -> list[pathlib.Path]:
    """Creates (or reuses) the CA in `out` and issues one cert+key per subject; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key_pem = out / "ca.pem", out / "ca.key"
    if ca_pem.exists() and ca_key_pem.exists():  # add certificates to an existing lab CA
        ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_pem.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise CertsError(f"{ca_key_pem} is not an EC key made by ftsup certs")
        ca_key = loaded
    else:
        ca_key, ca_cert = make_ca(days)
        _write(ca_key_pem, _key_pem(ca_key), 0o600)
        _write(ca_pem, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    written = [ca_pem, ca_key_pem]
    for subject in subjects:
        key, cert = issue(subject, hosts, ca_key, ca_cert, days)
        _write(out / f"{subject.stem}.key", _key_pem(key), 0o600)
        _write(out / f"{subject.stem}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
        written += [out / f"{subject.stem}.pem", out / f"{subject.stem}.key"]
    return written


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ftsup certs", description="Create a lab CA and ftsup certificates (not for production PKI).")
    p.add_argument("--out", required=True, type=pathlib.Path, help="directory for ca.pem and the certificates")
    p.add_argument("--nodes", default="", help="node ids, comma-separated (agent certs)")
    p.add_argument("--supervisors", default="", help="supervisor replica names, comma-separated")
    p.add_argument("--operators", default="", help="NAME:admin or NAME:read, comma-separated (supervisorctl certs)")
    p.add_argument("--hosts", default=",".join(DEFAULT_HOSTS),
                   help="DNS names / IPs that node and supervisor certs are valid for (each cert also gets its own name)")
    p.add_argument("--days", type=int, default=365, help="validity in days")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not 1 <= args.days <= 3650:
            raise CertsError(f"--days {args.days} must be within 1..3650")
        subjects = parse_subjects(args.nodes, args.supervisors, args.operators)
        hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip())
        written = write_all(args.out, subjects, hosts, args.days)
    except (CertsError, OSError) as exc:
        print(f"ftsup certs: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
