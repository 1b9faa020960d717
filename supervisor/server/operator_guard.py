"""Puts the Authorizer in front of every Operator method, read from the service descriptor.

Wrapping by descriptor (not by hand, method by method) is what makes authorization fail closed:
an RPC added to operator.proto is guarded the moment it exists, needing admin unless authz.py
lists it as read-only. Refusals are logged with the method, caller and reason, never a token.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from ftsup.common import logs
from ftsup.common.tls import peer_identity
from ftsup.supervisor.server.authz import Authorizer
from ftsup.v1 import operator_pb2, operator_pb2_grpc

log = logs.get("supervisor.operator")

Context = grpc.aio.ServicerContext

# Who authenticated for the call being served (each RPC runs in its own task, so its own context):
# the audit trail records this, not the operator name the client claims.
_principal: ContextVar[str] = ContextVar("ftsup_operator_principal", default="")


def principal() -> str:
    """The authenticated caller of the Operator call in progress ("" outside one)."""
    return _principal.get()


def guarded(servicer: operator_pb2_grpc.OperatorServicer, authorizer: Authorizer) -> operator_pb2_grpc.OperatorServicer:
    """A servicer with the same methods as `servicer`, each asking `authorizer` first."""
    namespace: dict[str, Any] = {}
    for method in operator_pb2.DESCRIPTOR.services_by_name["Operator"].methods:
        if method.client_streaming:
            raise TypeError(f"Operator.{method.name}: client-streaming methods are not guarded; add support here")
        namespace[method.name] = _wrap(method.name, getattr(servicer, method.name), method.server_streaming, authorizer)
    cls: type[operator_pb2_grpc.OperatorServicer] = type("GuardedOperator", (operator_pb2_grpc.OperatorServicer,), namespace)
    return cls()


def _wrap(name: str, inner: Callable[..., Any], is_streaming: bool, authorizer: Authorizer) -> Callable[..., Any]:
    async def check(context: Context) -> None:
        identity = peer_identity(context)
        refusal = authorizer.refusal(name, context.invocation_metadata() or (), identity)
        if refusal is not None:
            log.warning("operator call refused", method=name, peer=context.peer(),
                        identity=str(identity) if identity else None, code=refusal.code.name, reason=refusal.reason)
            await context.abort(refusal.code, refusal.reason)
        _principal.set(authorizer.principal(context.invocation_metadata() or (), identity))

    if is_streaming:
        async def stream(self: object, request: Any, context: Context) -> AsyncIterator[Any]:
            await check(context)
            async for item in inner(request, context):
                yield item

        return stream

    async def unary(self: object, request: Any, context: Context) -> Any:
        await check(context)
        return await inner(request, context)

    return unary
