"""The error hierarchy shared by every component.

Each class carries the gRPC status code it maps to, so one place (``aggview.status``) turns any of
them into a status with a message, and the client turns statuses back into these classes.
"""

from __future__ import annotations

import grpc


class AggviewError(Exception):
    """Base of every error the system reports to a user."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgument(AggviewError):
    """Malformed request: bad SQL, wrong type, missing key column, unsupported construct."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class TypeMismatch(InvalidArgument):
    """A value does not fit the type of its column."""


class UnknownTable(AggviewError):
    code = grpc.StatusCode.NOT_FOUND


class UnknownColumn(InvalidArgument):
    pass


class RowNotFound(AggviewError):
    """Update, add or delete of a row that does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(AggviewError):
    """Insert of a row whose key exists, or CREATE of a name in use."""

    code = grpc.StatusCode.ALREADY_EXISTS


class ConditionFailed(AggviewError):
    """A ``require=`` condition did not hold; nothing of the transaction was applied."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class FailedPrecondition(AggviewError):
    """The request is well formed but the system state forbids it (e.g. a restart with other N)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class TooLate(AggviewError):
    """Timestamp-order abort: a younger transaction got to a row first. Retried by the client."""

    code = grpc.StatusCode.ABORTED


class LimitExceeded(AggviewError):
    """A request over one of the configured size limits."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(AggviewError):
    """No token, or one the cluster does not know (or a non-member calling a member service)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(AggviewError):
    """The token's role does not allow this call (a read token writing, DDL without admin)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(AggviewError):
    """A server the request needs is down or unreachable."""

    code = grpc.StatusCode.UNAVAILABLE


class StoreError(AggviewError):
    """The underlying store failed (I/O error, store unreachable)."""

    code = grpc.StatusCode.UNAVAILABLE
