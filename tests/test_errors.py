"""Error identity on the wire (``aggview.errors.IDENTITIES``): every error class raised in a real
gRPC handler reaches a sync and an asyncio caller as the same class with the same message, as
does a framed stream's refusal and a Transact reply; a status with a code alone (a peer that
sends no details, gRPC's own refusals) decodes by its code, never by its message."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

import grpc
import pytest

from aggview import errors, frames
from aggview.status import CODE_BY_NUMBER, error_from_rpc, error_from_status, grpc_method
from coordinator.client_service import _failed

SERVICE = "aggview.test.Errors"
CLASSES = list(errors.IDENTITIES)
# the wording a decoder must not read: each class's old give-away prefix, on the wrong class
MISLEADING = "condition failed: unknown table t (larger than max)"


def message_of(cls: type[errors.AggviewError]) -> str:
    return f"{cls.__name__}: what went wrong, in words — «ünïcode» too"


class _Servicer:
    @grpc_method
    async def Raise(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        cls = errors.BY_REASON[request.decode()]
        raise cls(message_of(cls))

    async def Bare(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """A peer of before reasons: the code alone, and a message made to mislead."""
        await context.abort(CODE_BY_NUMBER[int(request.decode())], MISLEADING)
        raise AssertionError("unreachable")


async def _serving(body: Callable[[str], Awaitable[None]]) -> None:
    server = grpc.aio.server()
    servicer = _Servicer()
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(getattr(servicer, name))
        for name in ("Raise", "Bare")
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await body(f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


def _sync_failure(address: str, method: str, request: bytes) -> errors.AggviewError:
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(f"/{SERVICE}/{method}")(request, timeout=10)
        except grpc.RpcError as exc:
            return error_from_rpc(exc)
    raise AssertionError("the call succeeded")


async def _async_failure(address: str, method: str, request: bytes) -> errors.AggviewError:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await channel.unary_unary(f"/{SERVICE}/{method}")(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return error_from_rpc(exc)
    raise AssertionError("the call succeeded")


def test_the_table_names_every_class_once() -> None:
    defined = {
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.AggviewError) and c.__module__ == errors.__name__
    }
    assert defined == set(errors.IDENTITIES)
    reasons = [i.reason for i in errors.IDENTITIES.values()]
    assert len(set(reasons)) == len(reasons)
    for cls, identity in errors.IDENTITIES.items():
        error = cls("x")
        assert (error.code, error.reason) == identity
        assert errors.decoded(identity.code, identity.reason) is cls


def test_every_class_round_trips_through_a_grpc_call_sync_and_async() -> None:
    async def body(address: str) -> None:
        loop = asyncio.get_running_loop()
        for cls in CLASSES:
            request = cls("").reason.encode()
            sync = await loop.run_in_executor(None, _sync_failure, address, "Raise", request)
            aio = await _async_failure(address, "Raise", request)
            for got in (sync, aio):
                assert type(got) is cls, (cls, got)
                assert str(got) == message_of(cls)

    asyncio.run(_serving(body))


def test_a_status_with_a_code_alone_decodes_by_its_code_not_its_message() -> None:
    expected = {
        grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
        grpc.StatusCode.NOT_FOUND: errors.RowNotFound,
        grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
        grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
        grpc.StatusCode.ABORTED: errors.TooLate,
        grpc.StatusCode.RESOURCE_EXHAUSTED: errors.LimitExceeded,
        grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
        grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
        grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
        grpc.StatusCode.INTERNAL: errors.AggviewError,
        grpc.StatusCode.DEADLINE_EXCEEDED: errors.AggviewError,
    }

    async def body(address: str) -> None:
        loop = asyncio.get_running_loop()
        for code, cls in expected.items():
            request = str(code.value[0]).encode()
            sync = await loop.run_in_executor(None, _sync_failure, address, "Bare", request)
            aio = await _async_failure(address, "Bare", request)
            for got in (sync, aio):
                assert type(got) is cls, (code, got)
                assert str(got).startswith(MISLEADING)

    asyncio.run(_serving(body))


def test_gRPCs_own_size_refusal_names_the_limit() -> None:
    """RESOURCE_EXHAUSTED without a reason is gRPC's own (our LimitExceeded has one)."""
    got = error_from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger")
    assert type(got) is errors.LimitExceeded and "max_request_bytes" in str(got)
    ours = error_from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "3 views", "LIMIT_EXCEEDED")
    assert str(ours) == "3 views"


def test_a_reason_that_contradicts_the_code_is_not_believed() -> None:
    got = error_from_status(grpc.StatusCode.NOT_FOUND, "gone", "CONDITION_FAILED")
    assert type(got) is errors.RowNotFound
    assert type(error_from_status(grpc.StatusCode.NOT_FOUND, "x", "NEWER_REASON")) is (
        errors.RowNotFound
    )


def test_a_subclass_travels_as_its_nearest_listed_base() -> None:
    from ltm.store.ownership import Moved

    error = Moved("partition 3 moved")
    assert (error.code, error.reason) == errors.IDENTITIES[errors.FailedPrecondition]


def test_every_class_round_trips_in_a_transact_reply() -> None:
    for cls in CLASSES:
        reply = _failed(7, cls(message_of(cls)))
        got = error_from_status(CODE_BY_NUMBER[reply.code], reply.message, reply.reason)
        assert type(got) is cls and str(got) == message_of(cls)


def _refusing(cls: type[errors.AggviewError]) -> frames.Welcome:
    def welcome(hello: bytes, certified: bool) -> frames.Answer:
        raise cls(message_of(cls))

    return welcome


async def _refused(address: str) -> errors.AggviewError:
    call = frames.FramedCall(address, b"hello", bytes, grace=2.0)
    try:
        await call.write(b"")  # type: ignore[arg-type]
    except errors.AggviewError as exc:
        return exc
    finally:
        call.cancel()
    raise AssertionError("the stream was welcomed")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_round_trips_as_a_framed_refusal(cls: type[errors.AggviewError]) -> None:
    async def main() -> None:
        server = await frames.FramedServer(_refusing(cls)).start("127.0.0.1", 0)
        try:
            got = await _refused(f"127.0.0.1:{server.port}")
        finally:
            await server.close()
        assert type(got) is cls
        assert str(got) == f"127.0.0.1:{server.port} refused the stream: {message_of(cls)}"

    asyncio.run(main())


def test_a_framed_refusal_of_before_reasons_decodes_by_its_code() -> None:
    code = grpc.StatusCode.FAILED_PRECONDITION.value[0]
    got = frames.refusal("a:1", f"{code} {MISLEADING}")
    assert type(got) is errors.FailedPrecondition
    assert str(got) == f"a:1 refused the stream: {MISLEADING}"
    got = frames.refusal("a:1", "no number here")
    assert type(got) is errors.FailedPrecondition and str(got).endswith("no number here")
