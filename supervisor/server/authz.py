"""Who may call what on the Operator service: roles from bearer tokens and operator certificates.

Two roles. `read` may call the methods in READ_ONLY_METHODS (status, nodes, leader, events);
`admin` may call everything. Any method not listed there needs admin, so a new command is
guarded the day it is added (fail closed). A caller's role is the higher of its token's
(`authorization: Bearer <token>`, compared in constant time) and its client certificate's
(SAN URI spiffe://ftsup/operator/<name>/<role>, verified by the mTLS handshake).

Without any credential configured (no token files, no TLS) the supervisor is in lab mode: reads
are open, and commands are allowed only when it listens on loopback alone, i.e. from someone
already on the machine. An admin token alone (no read token, no TLS) keeps reads open too.
Tokens are never logged.
"""

from __future__ import annotations

import hmac
import pathlib
from collections.abc import Collection
from dataclasses import dataclass
from enum import IntEnum

import grpc

from ftsup.common.tls import PeerIdentity, PeerKind, is_loopback

READ_ONLY_METHODS = frozenset({"GetStatus", "ListNodes", "GetLeader", "ListEvents",
                               "GetGoodput", "ListStragglers", "ListCheckpoints", "StreamLogs"})


class AuthzConfigError(ValueError):
    """The token file is unusable; the text says why."""


class Role(IntEnum):
    NONE = 0
    READ = 1
    ADMIN = 2


@dataclass(frozen=True, slots=True)
class Refusal:
    code: grpc.StatusCode
    reason: str


def load_token(path: pathlib.Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise AuthzConfigError(f"cannot read operator token file {path}: {exc}") from exc
    if len(token) < 16:
        raise AuthzConfigError(f"operator token in {path} is shorter than 16 characters")
    mode = path.stat().st_mode & 0o077
    if mode:
        raise AuthzConfigError(f"operator token file {path} is readable by group/others (chmod 600 it)")
    return token


def is_loopback_only(listen: str) -> bool:
    return is_loopback(listen)


def required_role(method: str) -> Role:
    return Role.READ if method in READ_ONLY_METHODS else Role.ADMIN


def _matches(presented: str, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(presented.encode(), f"Bearer {token}".encode())


@dataclass(frozen=True, slots=True)
class Authorizer:
    token: str | None  # the admin token
    is_local_only: bool
    read_token: str | None = None
    is_tls: bool = False

    @property
    def is_lab_mode(self) -> bool:
        return self.token is None and self.read_token is None and not self.is_tls

    @property
    def mode(self) -> str:
        """One word for the start-up log line (never the tokens themselves)."""
        if self.is_lab_mode:
            return "local only" if self.is_local_only else "reads only (no credentials configured)"
        parts = [name for name, on in (("admin token", self.token), ("read token", self.read_token),
                                       ("operator certificates", self.is_tls)) if on]
        return ", ".join(parts)

    # `metadata`: the call's (key, value) pairs, a tuple from a sync server or a grpc.aio.Metadata from
    # an aio one (a collection of pairs; grpc-stubs 1.53 misdeclares it a Mapping, which passes as Any).
    def role(self, metadata: Collection[tuple[str, str | bytes]], identity: PeerIdentity | None) -> Role:
        presented = next((str(v) for k, v in metadata if k == "authorization"), "")
        role = Role.NONE
        if presented:
            if _matches(presented, self.token):
                role = Role.ADMIN
            elif _matches(presented, self.read_token):
                role = Role.READ
        if identity is not None and identity.kind is PeerKind.OPERATOR:
            role = max(role, Role.ADMIN if identity.role == "admin" else Role.READ)
        return role

    def principal(self, metadata: Collection[tuple[str, str | bytes]], identity: PeerIdentity | None) -> str:
        """Who authenticated, for the audit trail (never the token itself): the operator
        certificate's identity, else which token matched, else "lab:local" (no credentials)."""
        if identity is not None and identity.kind is PeerKind.OPERATOR:
            return str(identity)
        presented = next((str(v) for k, v in metadata if k == "authorization"), "")
        if presented and _matches(presented, self.token):
            return "token:admin"
        if presented and _matches(presented, self.read_token):
            return "token:read"
        return "lab:local" if self.is_lab_mode else "anonymous"

    def refusal(self, method: str, metadata: Collection[tuple[str, str | bytes]],
                identity: PeerIdentity | None = None) -> Refusal | None:
        """Why `method` must be refused for this caller, or None to allow it."""
        needed = required_role(method)
        if self.is_lab_mode or (needed is Role.READ and self.read_token is None and not self.is_tls):
            if needed is Role.READ or self.is_local_only:
                return None
            return Refusal(grpc.StatusCode.PERMISSION_DENIED,
                           "operator commands are disabled: this supervisor listens beyond loopback without"
                           " --operator-token-file (or mTLS operator certificates)")
        role = self.role(metadata, identity)
        if role >= needed:
            return None
        if role is Role.READ:
            return Refusal(grpc.StatusCode.PERMISSION_DENIED,
                           f"not authorized: {method} changes the cluster and needs the admin role; your"
                           " credential is read-only (use the admin token file or an admin operator certificate)")
        who = f" (client certificate {identity})" if identity is not None else ""
        return Refusal(grpc.StatusCode.UNAUTHENTICATED,
                       f"not authorized{who}: pass an operator token (supervisorctl --token-file) or an operator"
                       " client certificate (supervisorctl --tls-cert/--tls-key from `ftsup certs --operators`)")
