"""Length-prefixed frames over one TCP connection (TLS when the cluster is secure): the members'
``Exchange`` and clock streams without gRPC.

A Python gRPC stream message costs 130-220 us of CPU on each side, a frame on an asyncio stream
9-60 us (``python -m bench.messages``). That pays where a transaction's messages are few to a
message (light load: 1.11-1.13x the throughput); under load the streams already carry many
requests per message and the two are equal (docs/DECISIONS.md).

The protocol: the caller's first frame is a hello (the peer decides what it means: which
partition, the cluster secret, a client's token); the server's first frame is its welcome,
``OK``, or ``REFUSED`` followed by the status code's number, a colon, the error's reason
(``aggview.errors.IDENTITIES``), a space and why. Then every frame is a message of requests one
way and of answers the other, each frame a 4-byte big-endian length and that many bytes.
:class:`FramedCall` is the calling side, shaped as the gRPC call :class:`aggview.streams.AskEach`
drives; :class:`FramedServer` the serving side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from aggview import errors
from aggview.net import MAX_MESSAGE_BYTES, keep_alive
from aggview.retry import RetryPolicy, retry_on
from aggview.status import CODE_BY_NUMBER, Malformed, error_from_status

log = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
OK = b"\x00"
REFUSED = b"\x01"
# A peer that is starting or restarting is dialled again for this long before the call fails
# (members start one by one); a connection that neither opens nor fails within it is given up.
CONNECT_GRACE = 2.0
RETRY_EVERY = 0.05
REFUSED_CONNECTIONS = retry_on(ConnectionRefusedError, ConnectionResetError)


def framed(data: bytes) -> bytes:
    return HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """The next frame's bytes; ``asyncio.IncompleteReadError`` at the end of the stream,
    ``errors.InvalidArgument`` for a length over ``limit`` (the stream cannot go on: where the
    next frame starts is unknown)."""
    (length,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if length > limit:
        raise errors.InvalidArgument(f"a frame of {length} bytes is over the {limit}-byte limit")
    return await reader.readexactly(length)


def takes_more(transport: asyncio.WriteTransport) -> bool:
    """Whether a connection takes a write now without waiting: open, its send buffer below
    the transport's high-water mark."""
    size, (_, high) = transport.get_write_buffer_size(), transport.get_write_buffer_limits()
    return not transport.is_closing() and size < high


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) split; ValueError when the port is not a number."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class FramedCall:
    """One connection, opened at once in the background; ``write`` waits for it. Iterating
    yields the answers, parsed by ``parse``; it ends when the peer closes. ``cancel`` closes."""

    def __init__(
        self,
        address: str,
        hello: bytes,
        parse: Callable[[bytes], Any],
        context: ssl.SSLContext | None = None,
        *,
        grace: float = CONNECT_GRACE,
    ) -> None:
        self.address = address
        self._parse = parse
        self._opening = asyncio.ensure_future(self._open(hello, context, grace))
        self._writer: asyncio.StreamWriter | None = None

    async def _open(
        self, hello: bytes, context: ssl.SSLContext | None, grace: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = host_port(self.address)
        dial = RetryPolicy(  # every RETRY_EVERY seconds, for ``grace`` seconds
            attempts=None,
            first_delay=RETRY_EVERY,
            max_delay=RETRY_EVERY,
            spread=(1.0, 1.0),
            deadline=grace,
            retryable=REFUSED_CONNECTIONS,
        )
        reader, writer = await dial.arun(
            lambda: asyncio.wait_for(
                asyncio.open_connection(
                    host,
                    port,
                    ssl=context,
                    server_hostname=host if context is not None else None,
                    limit=2**20,
                ),
                grace,
            )
        )
        keep_alive(writer.get_extra_info("socket"))
        self._writer = writer
        writer.write(framed(hello))
        welcome = await asyncio.wait_for(read_frame(reader), grace)
        if welcome[:1] != OK:
            writer.transport.abort()
            raise refusal(self.address, welcome[1:].decode(errors="replace"))
        return reader, writer

    async def write(self, message: Any) -> None:
        _, writer = await self._opening
        writer.write(framed(message.SerializeToString()))
        await writer.drain()

    def writable(self) -> bool:
        """Whether ``write_nowait`` may write now: the connection open and welcomed, its send
        buffer below the transport's high-water mark (else ``write`` waits for it)."""
        opening = self._opening
        if not opening.done() or opening.cancelled() or opening.exception() is not None:
            return False
        return takes_more(opening.result()[1].transport)

    def write_nowait(self, message: Any) -> None:
        """``write`` without waiting; only when ``writable()``."""
        self._opening.result()[1].write(framed(message.SerializeToString()))

    async def _replies(self) -> AsyncIterator[Any]:
        reader, _ = await self._opening
        while True:
            try:
                frame = await read_frame(reader)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise ConnectionResetError(f"{self.address} closed mid-frame") from None
                return
            yield self._parse(frame)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._replies()

    def cancel(self) -> None:
        self._opening.cancel()
        if self._writer is not None:
            self._writer.transport.abort()

    async def code(self) -> None:
        """Returns once the connection is closed (what ``AskEach.close`` awaits of a call)."""
        await asyncio.wait([self._opening])  # opened, failed or cancelled: never raises
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()


# A connection's handler: its frames in, its answers out; ``answering``'s also take a ``Send``.
Answer = Callable[..., AsyncIterator[bytes]]
# Writes an answer message to the connection now if it can (open, its buffer below the
# high-water mark): True; False leaves it to the handler's own answers.
Send = Callable[[Any], bool]
# What a server does with a connection's hello: ``certified`` says whether the peer presented a
# certificate the cluster's CA signed (a member's; never on plaintext).
Welcome = Callable[[bytes, bool], Answer]


def refused(exc: errors.AggviewError) -> bytes:
    """A ``REFUSED`` welcome: the status code's number and the error's reason, then why."""
    return REFUSED + f"{exc.code.value[0]}:{exc.reason} {exc}".encode()


def refusal(address: str, text: str) -> errors.AggviewError:
    """The error a ``REFUSED`` welcome stands for: the class of its reason, else of its status
    code (a peer of before reasons sends ``NUMBER WHY``)."""
    head, _, message = text.partition(" ")
    number, _, reason = head.partition(":")
    code = CODE_BY_NUMBER.get(int(number)) if number.isdigit() else None
    if code is None:  # not a number first: all of it is why
        code, reason, message = grpc.StatusCode.FAILED_PRECONDITION, "", text
    return error_from_status(code, f"{address} refused the stream: {message}", reason)


def answering(
    parse: Callable[[bytes], Any],
    serve: Callable[..., AsyncIterator[Any]],
    *,
    direct: bool = False,
) -> Answer:
    """A stream's handler on frames: each frame parsed (one that does not parse reaches
    ``serve`` as ``Malformed``, as gRPC's tolerant parsing does) and each answer serialized.
    ``direct``: ``serve`` also takes ``send``, which writes an answer to the connection at
    once when it can (``Send``), so no task wakes up to write it."""

    async def answer(
        frames: AsyncIterator[bytes], send: Send | None = None
    ) -> AsyncIterator[bytes]:
        async def messages() -> AsyncIterator[Any]:
            async for frame in frames:
                try:
                    yield parse(frame)
                except DecodeError as exc:
                    yield Malformed(str(exc))

        replies = serve(messages(), send=send) if direct else serve(messages())
        async for reply in replies:
            yield reply.SerializeToString()

    return answer


class FramedServer:
    """Serves connections on ``host:port``. ``welcome(hello, certified)`` gives the function
    that turns a connection's frames into its answers, or raises ``errors.AggviewError`` to
    refuse it (the caller is told why, with the error's code). A connection that sends no hello
    within ``grace`` is closed."""

    def __init__(
        self,
        welcome: Welcome,
        context: ssl.SSLContext | None = None,
        *,
        grace: float = CONNECT_GRACE,
    ) -> None:
        self._welcome = welcome
        self._context = context
        self._grace = grace
        self._connections: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> FramedServer:
        self._server = await asyncio.start_server(
            self._connection, host, port, ssl=self._context, limit=2**20, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        keep_alive(writer.get_extra_info("socket"))
        try:
            try:
                hello = await asyncio.wait_for(read_frame(reader), self._grace)
                answer = self._welcome(hello, bool(writer.get_extra_info("peercert")))
            except errors.AggviewError as exc:
                writer.write(framed(refused(exc)))
                writer.close()
                await writer.wait_closed()
                return
            writer.write(framed(OK))

            async def frames() -> AsyncIterator[bytes]:
                with contextlib.suppress(asyncio.IncompleteReadError):
                    while True:
                        yield await read_frame(reader)

            def send(message: Any) -> bool:
                if not takes_more(writer.transport):
                    return False
                writer.write(framed(message.SerializeToString()))
                return True

            async for reply in answer(frames(), send):
                writer.write(framed(reply))
                await writer.drain()
            writer.close()  # after what is buffered has gone out
            await writer.wait_closed()
        except errors.AggviewError as exc:  # bad input: the peer sees the end, the log why
            log.warning("a member's stream from %s ended: %s", peer, exc)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.info("a member's stream from %s ended: %r", peer, exc)
        except Exception:  # a bug: this connection ends, the server stays up
            log.exception("a member's stream from %s failed", peer)
        except asyncio.CancelledError:  # close(): asyncio's own callback must not see it
            pass
        finally:
            writer.transport.abort()  # closed already, unless it failed or is being closed
            self._connections.discard(task)

    async def close(self) -> None:
        """Stops accepting and ends every open connection."""
        if self._server is None:
            return
        self._server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()
