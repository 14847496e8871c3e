"""The error hierarchy shared by every component, and its one table of wire identities.

``IDENTITIES`` gives each class its gRPC status code and the ``reason`` of the
``google.rpc.ErrorInfo`` (domain ``aggview``) that names the class in a status's details;
``aggview.status`` turns an error into a status by it, and a status back into the error of its
reason (of its code alone when it has none). The wording of a message is never protocol.
"""

from __future__ import annotations

from typing import NamedTuple

import grpc


class AggviewError(Exception):
    """Base of every error the system reports to a user."""

    @property
    def code(self) -> grpc.StatusCode:
        """The gRPC status code it travels with (``IDENTITIES``)."""
        return identity(type(self)).code

    @property
    def reason(self) -> str:
        """What names its class on the wire (``IDENTITIES``)."""
        return identity(type(self)).reason


class InvalidArgument(AggviewError):
    """Malformed request: bad SQL, wrong type, missing key column, unsupported construct."""


class TypeMismatch(InvalidArgument):
    """A value does not fit the type of its column."""


class UnknownTable(AggviewError):
    pass


class UnknownColumn(InvalidArgument):
    pass


class RowNotFound(AggviewError):
    """Update, add or delete of a row that does not exist."""


class AlreadyExists(AggviewError):
    """Insert of a row whose key exists, or CREATE of a name in use."""


class ConditionFailed(AggviewError):
    """A ``require=`` condition did not hold; nothing of the transaction was applied."""


class FailedPrecondition(AggviewError):
    """The request is well formed but the system state forbids it (e.g. a restart with other N)."""


class NotServed(FailedPrecondition):
    """The partition asked for is not served where it was asked (it moved: handed back home,
    failed over): a read at a timestamp may be sent again to where it went."""


class TooLate(AggviewError):
    """Timestamp-order abort: a younger transaction got to a row first. Retried by the client."""


class LimitExceeded(AggviewError):
    """A request over one of the configured size limits."""


class Unauthenticated(AggviewError):
    """No token, or one the cluster does not know (or a non-member calling a member service)."""


class PermissionDenied(AggviewError):
    """The token's role does not allow this call (a read token writing, DDL without admin)."""


class Unavailable(AggviewError):
    """A server the request needs is down or unreachable."""


class StoreError(Unavailable):
    """The underlying store failed (I/O error, store unreachable). An ``Unavailable``: a client
    hearing it tries again, as it did when it travelled as UNAVAILABLE alone."""


class Identity(NamedTuple):
    code: grpc.StatusCode
    reason: str


DOMAIN = "aggview"  # the ErrorInfo domain of every reason below

_C = grpc.StatusCode
# The one table, both ways. A status with a reason decodes to that reason's class; one with a
# code alone (a peer that sends no details, or gRPC itself) to the FIRST class of its code
# here; any other code to AggviewError. A class not listed travels as its nearest listed base.
IDENTITIES: dict[type[AggviewError], Identity] = {
    AggviewError: Identity(_C.INTERNAL, "INTERNAL"),
    InvalidArgument: Identity(_C.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    TypeMismatch: Identity(_C.INVALID_ARGUMENT, "TYPE_MISMATCH"),
    UnknownColumn: Identity(_C.INVALID_ARGUMENT, "UNKNOWN_COLUMN"),
    RowNotFound: Identity(_C.NOT_FOUND, "ROW_NOT_FOUND"),
    UnknownTable: Identity(_C.NOT_FOUND, "UNKNOWN_TABLE"),
    AlreadyExists: Identity(_C.ALREADY_EXISTS, "ALREADY_EXISTS"),
    FailedPrecondition: Identity(_C.FAILED_PRECONDITION, "FAILED_PRECONDITION"),
    ConditionFailed: Identity(_C.FAILED_PRECONDITION, "CONDITION_FAILED"),
    NotServed: Identity(_C.FAILED_PRECONDITION, "NOT_SERVED"),
    TooLate: Identity(_C.ABORTED, "TOO_LATE"),
    LimitExceeded: Identity(_C.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED"),
    Unauthenticated: Identity(_C.UNAUTHENTICATED, "UNAUTHENTICATED"),
    PermissionDenied: Identity(_C.PERMISSION_DENIED, "PERMISSION_DENIED"),
    Unavailable: Identity(_C.UNAVAILABLE, "UNAVAILABLE"),
    StoreError: Identity(_C.UNAVAILABLE, "STORE_ERROR"),
}

BY_REASON: dict[str, type[AggviewError]] = {i.reason: cls for cls, i in IDENTITIES.items()}
BY_CODE: dict[grpc.StatusCode, type[AggviewError]] = {}
for _cls, _identity in IDENTITIES.items():
    BY_CODE.setdefault(_identity.code, _cls)


def identity(cls: type[AggviewError]) -> Identity:
    """The code and reason ``cls`` travels with: its own, or its nearest listed base's."""
    for base in cls.__mro__:
        found = IDENTITIES.get(base)  # type: ignore[call-overload]
        if found is not None:
            return found
    raise TypeError(f"{cls.__name__} is not an AggviewError")


def decoded(code: grpc.StatusCode, reason: str = "") -> type[AggviewError]:
    """The class a status stands for: by its reason, else by its code alone."""
    by_reason = BY_REASON.get(reason) if reason else None
    if by_reason is not None and IDENTITIES[by_reason].code == code:
        return by_reason
    return BY_CODE.get(code, AggviewError)
