"""Operator authorization: read and admin roles from tokens and certificates; fail closed."""

from __future__ import annotations

import grpc
import pytest

from ftsup.common.tls import PeerIdentity, PeerKind
from ftsup.supervisor.server.authz import READ_ONLY_METHODS, Authorizer, Role, required_role
from ftsup.v1 import operator_pb2

ADMIN = "admin-token-0123456789"
READ = "read-token-0123456789"


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_every_operator_method_needs_admin_unless_listed_read_only() -> None:
    methods = {m.name for m in operator_pb2.DESCRIPTOR.services_by_name["Operator"].methods}
    assert methods >= READ_ONLY_METHODS
    for name in methods - READ_ONLY_METHODS:
        assert required_role(name) is Role.ADMIN, name
    assert required_role("SomeFutureCommand") is Role.ADMIN


def test_a_read_token_reads_but_cannot_quarantine() -> None:
    authz = Authorizer(ADMIN, is_local_only=True, read_token=READ)
    assert authz.refusal("GetStatus", bearer(READ)) is None
    refusal = authz.refusal("Quarantine", bearer(READ))
    assert refusal is not None and refusal.code is grpc.StatusCode.PERMISSION_DENIED
    assert "needs the admin role" in refusal.reason and READ not in refusal.reason
    assert authz.refusal("Quarantine", bearer(ADMIN)) is None


def test_with_a_read_token_configured_reads_need_a_credential_too() -> None:
    authz = Authorizer(ADMIN, is_local_only=True, read_token=READ)
    refusal = authz.refusal("ListNodes", [])
    assert refusal is not None and refusal.code is grpc.StatusCode.UNAUTHENTICATED
    assert "--token-file" in refusal.reason
    assert authz.refusal("ListNodes", bearer("wrong-token-0123456789")) is not None


def test_an_admin_token_alone_keeps_reads_open_and_guards_commands() -> None:
    authz = Authorizer(ADMIN, is_local_only=True)
    assert authz.refusal("GetStatus", []) is None
    refusal = authz.refusal("Drain", bearer("wrong-token-0123456789"))
    assert refusal is not None and refusal.reason.startswith("not authorized")


def test_lab_mode_allows_commands_on_loopback_only() -> None:
    assert Authorizer(None, is_local_only=True).refusal("Drain", []) is None
    remote = Authorizer(None, is_local_only=False)
    assert remote.refusal("GetStatus", []) is None
    refusal = remote.refusal("Drain", [])
    assert refusal is not None and "--operator-token-file" in refusal.reason


@pytest.mark.parametrize(
    ("identity", "method", "allowed"),
    [
        (PeerIdentity(PeerKind.OPERATOR, "alice", "admin"), "Quarantine", True),
        (PeerIdentity(PeerKind.OPERATOR, "bob", "read"), "GetStatus", True),
        (PeerIdentity(PeerKind.OPERATOR, "bob", "read"), "Quarantine", False),
        (PeerIdentity(PeerKind.NODE, "node-1"), "GetStatus", False),  # a node certificate is no operator
        (None, "GetStatus", False),
    ],
)
def test_with_mtls_the_operator_certificate_carries_the_role(identity: PeerIdentity | None, method: str, allowed: bool) -> None:
    authz = Authorizer(None, is_local_only=False, is_tls=True)
    assert (authz.refusal(method, [], identity) is None) is allowed


def test_a_read_certificate_plus_the_admin_token_is_admin() -> None:
    authz = Authorizer(ADMIN, is_local_only=False, is_tls=True)
    assert authz.refusal("Drain", bearer(ADMIN), PeerIdentity(PeerKind.OPERATOR, "bob", "read")) is None


def test_the_mode_line_never_contains_a_token() -> None:
    mode = Authorizer(ADMIN, is_local_only=False, read_token=READ, is_tls=True).mode
    assert ADMIN not in mode and READ not in mode and "admin token" in mode


def test_the_audit_principal_is_who_authenticated_never_the_token() -> None:
    authz = Authorizer(ADMIN, is_local_only=False, read_token=READ, is_tls=True)
    alice = PeerIdentity(PeerKind.OPERATOR, "alice", "admin")
    assert authz.principal(bearer(ADMIN), alice) == "operator/alice/admin"  # the certificate wins
    assert authz.principal(bearer(ADMIN), None) == "token:admin"
    assert authz.principal(bearer(READ), None) == "token:read"
    assert authz.principal([], None) == "anonymous"
    assert Authorizer(None, is_local_only=True).principal([], None) == "lab:local"
