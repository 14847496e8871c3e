"""The one place where domain errors become gRPC statuses, and statuses become errors again.

A status keeps the error's code and message, and names its class in a ``google.rpc.Status``
detail: an ``ErrorInfo`` whose ``reason`` is the class's in ``errors.IDENTITIES`` (domain
``aggview``). Decoding goes by that reason, else by the code alone; never by the message."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from aggview import errors

log = logging.getLogger(__name__)

# A status code by its number, as a Transact reply or a framed refusal carries it.
CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


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
            await abort(context, errors.InvalidArgument(f"malformed request: {request.reason}"))
        try:
            return await func(self, request, context)
        except errors.AggviewError as exc:
            await abort(context, exc)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a bug: keep serving, report it
            log.exception("internal error in %s", func.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")

    return wrapper  # type: ignore[return-value]


def rich_status(exc: errors.AggviewError) -> grpc.Status:
    """``exc`` as a gRPC status: its code and message, its class's reason in an ErrorInfo."""
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=errors.DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=exc.code.value[0], message=str(exc), details=[detail])
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext, exc: errors.AggviewError) -> NoReturn:
    """Ends the call with ``exc``'s status (what every server-side error boundary does),
    keeping the trailing metadata the method set (``tell_silent``)."""
    status = rich_status(exc)
    metadata = (*(context.trailing_metadata() or ()), *status.trailing_metadata)
    await context.abort(status.code, status.details, metadata)
    raise AssertionError("unreachable")  # abort raises


# Trailing metadata of a commit's answer, ok or not: the members the answering member's
# prober hears silent ("2" or "0,2"). A client routes its next transactions around them at
# once, instead of sending one to a member cut off and waiting out its silence itself.
SILENT_MEMBERS_KEY = "aggview-silent-members"


def tell_silent(context: Any, members: list[int]) -> None:
    """Tells the client of this call which members are silent (nothing when none is)."""
    if members:
        context.set_trailing_metadata(((SILENT_MEMBERS_KEY, ",".join(map(str, members))),))


def silent_members(metadata: Any) -> list[int]:
    """The members a call's trailing metadata says are silent (``tell_silent``)."""
    for key, value in metadata or ():
        if key == SILENT_MEMBERS_KEY:
            return [int(m) for m in value.split(",") if m.isdigit()]
    return []


def reason_of(metadata: Any) -> str:
    """The aggview ErrorInfo reason in a call's trailing metadata ("" when there is none)."""
    for key, value in metadata or ():
        if key != rpc_status.GRPC_DETAILS_METADATA_KEY:
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:
            return ""
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Unpack(info) and info.domain == errors.DOMAIN:
                return info.reason
    return ""


def error_from_rpc(exc: grpc.RpcError) -> errors.AggviewError:
    """Turns a failed call into the matching domain error, keeping the server's message."""
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return error_from_status(exc.code(), exc.details() or "", reason_of(trailing))


def error_from_status(code: grpc.StatusCode, message: str, reason: str = "") -> errors.AggviewError:
    """The domain error for a status, its message and its reason (a failed call's, a failed
    transaction's on a Transact stream, a framed refusal's): the class of the reason, else of
    the code alone (``errors.decoded``)."""
    message = message or code.name
    cls = errors.decoded(code, reason)
    if not reason and code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # no reason: gRPC's own refusal, before any handler ran (our LimitExceeded has one)
        message = (
            f"{message} (a gRPC size limit, such as the server's max_request_bytes for a request)"
        )
    return cls(message)
