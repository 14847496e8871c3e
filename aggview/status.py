"""The one place where domain errors become gRPC statuses, and statuses become errors again."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from aggview import errors

log = logging.getLogger(__name__)

_BY_CODE: dict[grpc.StatusCode, type[errors.AggviewError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.RowNotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.ABORTED: errors.TooLate,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.LimitExceeded,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
}

# A status detail key that tells a condition failure apart from other failed preconditions.
CONDITION_FAILED_PREFIX = "condition failed: "

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def grpc_method(func: F) -> F:
    """Wraps an async servicer method: domain errors become statuses, bugs become INTERNAL."""

    @functools.wraps(func)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await func(self, request, context)
        except errors.AggviewError as exc:
            await context.abort(exc.code, str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a bug: keep serving, report it
            log.exception("internal error in %s", func.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")

    return wrapper  # type: ignore[return-value]


def error_from_rpc(exc: grpc.RpcError) -> errors.AggviewError:
    """Turns a failed call into the matching domain error, keeping the server's message."""
    code = exc.code()
    message = exc.details() or code.name
    if code == grpc.StatusCode.FAILED_PRECONDITION and message.startswith(CONDITION_FAILED_PREFIX):
        return errors.ConditionFailed(message)
    if code == grpc.StatusCode.NOT_FOUND and message.startswith("unknown table"):
        return errors.UnknownTable(message)
    cls = _BY_CODE.get(code, errors.AggviewError)
    return cls(message)
