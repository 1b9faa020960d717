"""supervisorctl's credentials: one channel factory that adds mTLS and the bearer token.

Every call (reads included) carries the token when one is given, because a supervisor with a
read token configured authenticates reads too. The token travels as `authorization: Bearer`
metadata through a client interceptor, so it works over TLS and over loopback plaintext alike.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ftsup.common.tls import TlsConfigError, TlsFiles, channel_credentials, expect_supervisor, tls_files


class CredentialsError(ValueError):
    """A token or TLS file given to supervisorctl is unusable; the text names it."""


@dataclass(frozen=True, slots=True)
class Credentials:
    token: str | None
    tls: TlsFiles | None


def load(token_file: str | None, tls_cert: str | None, tls_key: str | None, tls_ca: str | None) -> Credentials:
    token = None
    if token_file:
        try:
            token = pathlib.Path(token_file).read_text().strip()
        except OSError as exc:
            raise CredentialsError(f"cannot read --token-file {token_file}: {exc}") from exc
    try:
        files = tls_files(tls_cert, tls_key, tls_ca)
    except TlsConfigError as exc:
        raise CredentialsError(str(exc)) from exc
    return Credentials(token, files)


@dataclass(frozen=True, slots=True)
class _CallDetails(grpc.ClientCallDetails):
    """A call's details as an interceptor passes them on: grpc reads these six attributes from
    whatever object it is given (its own is a private namedtuple, so not copied with _replace)."""

    method: str
    timeout: float | None
    metadata: grpc.Metadata | None
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._metadata = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = (*(details.metadata or ()), self._metadata)
        return _CallDetails(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready,
                            details.compression)

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        return continuation(self._details(details), request)


def channel(address: str, credentials: Credentials) -> grpc.Channel:
    """A channel to one supervisor replica: mTLS when configured (the handshake accepts only a
    supervisor's certificate, so the token never reaches a node or anyone else), token on every
    call when given."""
    if credentials.tls is not None:
        base = grpc.secure_channel(address, channel_credentials(credentials.tls), options=expect_supervisor())
    else:
        base = grpc.insecure_channel(address)
    if credentials.token:
        return grpc.intercept_channel(base, _BearerToken(credentials.token))
    return base
