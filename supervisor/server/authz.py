"""Who may change anything: operator commands that mutate need a bearer token.

A supervisor started with --operator-token-file accepts mutating calls only with metadata
`authorization: Bearer <token>` (compared in constant time). Without a token file it accepts
them only when it listens on loopback alone, i.e. from someone already on the machine. Read-only
calls (status, nodes, events) need nothing. mTLS identities come with the security issue.
"""

from __future__ import annotations

import hmac
import ipaddress
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass


class AuthzConfigError(ValueError):
    """The token file is unusable; the text says why."""


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
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Authorizer:
    token: str | None
    is_local_only: bool

    def refusal(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        """Why a mutating call must be refused, or None to allow it."""
        if self.token is None:
            if self.is_local_only:
                return None
            return ("operator commands are disabled: this supervisor listens beyond loopback without"
                    " --operator-token-file")
        presented = next((str(v) for k, v in metadata if k == "authorization"), "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            return "not authorized: pass the operator token (supervisorctl --token-file)"
        return None
