"""The one place where domain errors become gRPC statuses, and statuses become errors again."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

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
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
}

# A status code by its number, as a Transact reply or a framed refusal carries it.
CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

# A status detail key that tells a condition failure apart from other failed preconditions.
CONDITION_FAILED_PREFIX = "condition failed: "

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class Malformed:
    """Stands in for a request whose bytes did not parse, so the method can answer clearly."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return Malformed(str(exc))

    return deserialize


def add_service(server: grpc.aio.Server, service: ServiceDescriptor, servicer: Any) -> None:
    """Registers a servicer like the generated ``add_*_to_server``, except that a request that
    does not parse reaches the method as :class:`Malformed` and gets INVALID_ARGUMENT."""
    handlers = {}
    for method in service.methods:
        request_class = GetMessageClass(method.input_type)
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_tolerant(request_class.FromString),
            response_serializer=lambda message: message.SerializeToString(),
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )


def grpc_method(func: F) -> F:
    """Wraps an async servicer method: domain errors become statuses, bugs become INTERNAL."""

    @functools.wraps(func)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.reason}"
            )
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
    return error_from_status(exc.code(), exc.details() or "")


def error_from_status(code: grpc.StatusCode, message: str) -> errors.AggviewError:
    """The domain error for a status and its message (a failed call's, or a failed
    transaction's on a Transact stream)."""
    message = message or code.name
    if code == grpc.StatusCode.FAILED_PRECONDITION and message.startswith(CONDITION_FAILED_PREFIX):
        return errors.ConditionFailed(message)
    if code == grpc.StatusCode.NOT_FOUND and message.startswith("unknown "):
        return errors.UnknownTable(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in message:
        return errors.LimitExceeded(
            f"request over the server's size limit (max_request_bytes): {message}"
        )
    cls = _BY_CODE.get(code, errors.AggviewError)
    return cls(message)
