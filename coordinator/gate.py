"""The coordinator's interceptor: tokens and roles on the client API, the cluster secret on
member-only services, and the per-client limit on calls in flight."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
from sqlglot import exp

from aggview import errors, status
from aggview.security import (
    OPEN_SERVICE_PREFIXES,
    ROLES,
    TOKEN_HEADER,
    Token,
    denied,
    guarded,
    member_check,
    metadata_value,
)
from coordinator.convert import Limits, check_sql_size
from coordinator.dml import CONTROL, WRITES
from coordinator.sql import read_only_block
from cumulus.ddl import parse_view_statement
from cumulus.sqltext import parse_statements

CLIENT_SERVICE = "aggview.v1.Aggview"
# Server reflection (grpcurl's `list` and `describe`) is open to any valid token, as reads are.
REFLECTION_SERVICE_PREFIX = "grpc.reflection."
# Client API methods and the role they need. Sql depends on its statement; a method not listed
# here (one added later) needs admin until someone decides otherwise: fail closed.
METHOD_ROLES = {
    "Get": "read",
    "Scan": "read",
    "View": "read",
    "Commit": "write",
    "Transact": "write",
    "Refresh": "write",
    "Members": "read",
    "WatchView": "read",
    # bulk access (the Spark layer): snapshot reads read; loads and view (re)builds are DDL-like
    "List": "read",
    "Describe": "read",
    "HoldSnapshot": "read",
    "ReleaseSnapshot": "read",
    "Splits": "read",
    "ReadRange": "read",
    "Load": "admin",
    "BeginView": "admin",
    "FinishView": "admin",
    "AbortView": "admin",
}

Check = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Callable[[], None]]]
# How a Transact stream takes a client slot per transaction (set by the gate for the task that
# serves the stream; the default, for a server without the gate, admits everything).
ADMIT: ContextVar[Callable[[], Callable[[], None]]] = ContextVar(
    "ADMIT", default=lambda: lambda: None
)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def sql_role(sql: str) -> str:
    """The role SQL needs: a plain SELECT reads; INSERT, UPDATE, DELETE (and BEGIN, COMMIT,
    ROLLBACK around them) write; anything else is DDL (admin).

    Parsed the way ``coordinator.sql.run_sql`` will parse it, so what counts as a read here is
    what runs as one; SQL that does not parse raises the parser's InvalidArgument here."""
    if parse_view_statement(sql) is not None:
        return "admin"
    statements = parse_statements(sql)
    if read_only_block(statements):
        return "read"
    if all(isinstance(s, WRITES + CONTROL) for s in statements):
        return "write"
    if len(statements) == 1 and isinstance(statements[0], exp.Select):
        return "read"
    return "admin"


def role_needed(service: str, method: str) -> str:
    """The role a call needs before its request is read (a Sql call's statement is checked
    once it is: see :func:`sql_role`)."""
    if service.startswith(REFLECTION_SERVICE_PREFIX) or method == "Sql":
        return "read"
    return METHOD_ROLES.get(method, "admin")


class ClientGate(grpc.aio.ServerInterceptor):
    """Checks every call before it runs. ``tokens=None`` (an insecure coordinator) skips
    authentication, ``secret=None`` the member check; the per-client limit always applies
    (a client is its token's name, or its connection when there are no tokens)."""

    def __init__(self, *, tokens: dict[str, Token] | None, secret: str | None, limits: Limits):
        # by digest: a lookup's timing then says nothing about how much of a guess was right
        self.tokens = None if tokens is None else {_digest(t): e for t, e in tokens.items()}
        self.secret = secret
        self.limits = limits
        self.in_flight: dict[str, int] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        service, _, method = details.method.lstrip("/").partition("/")
        metadata = details.invocation_metadata  # type: ignore[attr-defined]
        if service.startswith(OPEN_SERVICE_PREFIXES):
            return handler
        reflection = service.startswith(REFLECTION_SERVICE_PREFIX)
        if service != CLIENT_SERVICE and not reflection:  # e.g. the outcome service LTMs call
            if self.secret is None:
                return handler
            return member_check(handler, metadata, self.secret, details.method)
        presented = None
        header = metadata_value(metadata, TOKEN_HEADER)
        if header is not None:
            scheme, _, value = header.partition(" ")
            presented = value.strip() if scheme.lower() == "bearer" else ""
        try:
            token = self.authenticate(presented, service, method)
        except errors.AggviewError as exc:
            return denied(handler, exc)
        return guarded(handler, self._checker(method, token))

    def authenticate(self, presented: str | None, service: str, method: str) -> Token | None:
        """The token a call presented (None: none), checked for the role ``method`` needs;
        None when the cluster has no tokens. On gRPC it comes from the ``authorization``
        header, on a member's framed port from the client's hello."""
        if self.tokens is None:
            return None
        if presented is None:
            raise errors.Unauthenticated(
                "no token: this cluster needs 'authorization: Bearer TOKEN' on every call "
                "(Client(address, ca=..., token=...), or aggview sql --token)"
            )
        token = self.tokens.get(_digest(presented))
        if token is None:
            raise errors.Unauthenticated("unknown token")
        needed = role_needed(service, method)
        if ROLES[token.role] < ROLES[needed]:
            raise errors.PermissionDenied(
                f"{method} needs the {needed} role; token {token.name!r} has {token.role}"
            )
        return token

    def _checker(self, method: str, token: Token | None) -> Check:
        async def check(request: Any, context: grpc.aio.ServicerContext) -> Callable[[], None]:
            if method == "Sql" and hasattr(request, "sql"):
                problem = self._sql_problem(request.sql, token)
                if problem is not None:
                    await status.abort(context, problem)
            who = token.name if token is not None else context.peer()
            if method == "Transact":  # a carrier: each transaction on it takes a slot
                ADMIT.set(lambda: self.admit(who))
                return lambda: None
            try:
                return self.admit(who)
            except errors.LimitExceeded as exc:
                await status.abort(context, exc)

        return check

    def admit(self, who: str) -> Callable[[], None]:
        """Takes one of the client's slots for a call or transaction in flight; returns what
        gives it back."""
        count = self.in_flight.get(who, 0)
        limit = self.limits.max_client_transactions
        if count >= limit:
            raise errors.LimitExceeded(
                f"client {who} has {count} calls in flight; the limit is {limit} "
                "concurrent transactions per client (max_client_transactions)"
            )
        self.in_flight[who] = count + 1

        def release() -> None:
            left = self.in_flight.get(who, 1) - 1
            if left > 0:
                self.in_flight[who] = left
            else:
                self.in_flight.pop(who, None)

        return release

    def _sql_problem(self, sql: str, token: Token | None) -> errors.AggviewError | None:
        """Why this statement may not run for this token (size first: parsing costs CPU)."""
        try:
            check_sql_size(sql, self.limits)
            if token is None:
                return None
            needed = sql_role(sql)
        except errors.AggviewError as exc:
            return exc
        if ROLES[token.role] >= ROLES[needed]:
            return None
        what = {"admin": "DDL (SQL but SELECT and writes)", "write": "INSERT, UPDATE, DELETE"}.get(
            needed, "SELECT"
        )
        return errors.PermissionDenied(
            f"{what} needs the {needed} role; token {token.name!r} has {token.role}"
        )
