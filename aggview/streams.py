"""Many requests on one gRPC stream, each answered on its own: how the coordinator talks to an
LTM (``Exchange``) and a client sends its transactions to the coordinator (``Transact``).

A stream message costs a Python gRPC server a fraction of what a call costs, so concurrent
requests share messages both ways, and no request waits for another one to finish.
:class:`AnswerEach` is the serving side, :class:`AskEach` the calling side.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

Request = TypeVar("Request")
Reply = TypeVar("Reply")


@dataclass
class _End:
    failure: Exception | None


class AnswerEach(Generic[Request, Reply]):
    """Serves one stream: every request of every message is handled concurrently, and the
    answers that are ready together go out as one message (nothing waits for a batch to
    fill). The stream ends when the peer has stopped writing and every request is answered;
    if ``requests_of`` raises (a message that makes no sense), it ends with that error once
    the requests already running are answered."""

    def __init__(
        self,
        requests_of: Callable[[Any], Iterable[Request]],
        handle: Callable[[Request], Awaitable[Reply]],
        pack: Callable[[list[Reply]], Any],
    ) -> None:
        self.requests_of = requests_of
        self.handle = handle  # answers every request, failures included; never raises
        self.pack = pack

    async def serve(
        self, messages: AsyncIterator[Any], send: Callable[[Any], bool] | None = None
    ) -> AsyncIterator[Any]:
        """The answers, as messages. With ``send`` (a connection of ours), the answers ready
        in one loop pass go out together at its end by a plain callback, with no task woken
        to write them, as long as ``send`` takes them (see ``aggview.frames.Send``); what it
        does not take is yielded here."""
        replies: asyncio.Queue[Reply | _End] = asyncio.Queue()
        handlers: set[asyncio.Task[None]] = set()
        ready: list[Reply] = []  # answered during this loop pass, for ``send``
        loop = asyncio.get_running_loop()

        def send_ready() -> None:
            batch = ready.copy()
            ready.clear()
            if send is None or not send(self.pack(batch)):
                for reply in batch:
                    replies.put_nowait(reply)

        async def run(request: Request) -> None:
            try:
                reply = await self.handle(request)
            except Exception:  # a bug in a handler: the others go on
                log.exception("a request on a stream got no answer")
                return
            if send is None:
                replies.put_nowait(reply)
                return
            if not ready:
                loop.call_soon(send_ready)
            ready.append(reply)

        async def read() -> None:
            failure = None
            try:
                async for message in messages:
                    for request in self.requests_of(message):
                        task = asyncio.ensure_future(run(request))
                        handlers.add(task)
                        task.add_done_callback(handlers.discard)
            except Exception as exc:  # noqa: BLE001 - ends the stream after the answers
                failure = exc
            if handlers:
                await asyncio.gather(*handlers, return_exceptions=True)
            replies.put_nowait(_End(failure))

        reader = asyncio.ensure_future(read())
        try:
            end = None
            while end is None:
                batch: list[Reply] = []
                item = await replies.get()
                while True:
                    if isinstance(item, _End):
                        end = item
                        break
                    batch.append(item)
                    if replies.empty():
                        break
                    item = replies.get_nowait()
                if batch:
                    yield self.pack(batch)
            if end.failure is not None:
                raise end.failure
        finally:
            reader.cancel()


class AskEach(Generic[Request, Reply]):
    """Calls over one stream: opened on first use and again after it ends; requests made while
    a write is under way go together in the next message (at most ``message_bytes`` of them,
    when given); each answer finds its waiter by id. Requests and answers are messages with an
    ``id`` field; ``pack`` makes a message of requests, and a message's ``replies`` are its
    answers. When the stream ends, every waiter fails with ``failure(exc)`` (exc is None for
    a stream that ended without an error, or was closed here)."""

    def __init__(
        self,
        open_call: Callable[[], Any],
        pack: Callable[[list[Request]], Any],
        failure: Callable[[BaseException | None], Exception],
        *,
        message_bytes: int | None = None,
        busy: int | None = None,
        linger: float = 0.0,
    ) -> None:
        self._open_call = open_call
        self._pack = pack
        self._failure = failure
        self._message_bytes = message_bytes
        # with ``busy`` requests or more awaiting answers, a write waits ``linger`` seconds for
        # more to join its message: fewer and fuller messages under load
        self._busy = busy
        self._linger = linger
        self._call: Any = None
        self._outbox: list[Request] = []
        self._writer_of: Any = None  # the call a write task is busy with, if any
        # answers awaited by request id (until answered, expired or the call ends), and
        # the timers that expire them
        self._waiting: dict[int, asyncio.Future[Reply]] = {}
        self._expiries: dict[int, asyncio.TimerHandle] = {}
        self._ids = itertools.count(1)
        self.messages_written = 0  # each carrying requests_written / messages_written requests
        self.requests_written = 0
        self._tasks: set[asyncio.Task[None]] = set()  # readers and writers, cancelled by close

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def ask(
        self, request: Request, timeout: float, expired: Callable[[], Exception]
    ) -> Reply:
        """Sends ``request`` (its id is set here) and returns its answer; ``expired()`` is
        raised when none came within ``timeout`` seconds."""
        return await self.send(request, timeout, expired)

    def send(
        self, request: Request, timeout: float, expired: Callable[[], Exception]
    ) -> asyncio.Future[Reply]:
        """``ask`` without awaiting: the future of the answer, for a caller that waits on it
        with other things (no task to wrap the request in)."""
        loop = asyncio.get_running_loop()
        if self._call is None:
            self._call = self._open_call()
            self._spawn(self._read(self._call))
        call = self._call
        request.id = ident = next(self._ids)  # type: ignore[attr-defined]
        answer: asyncio.Future[Reply] = loop.create_future()
        self._waiting[ident] = answer
        self._expiries[ident] = loop.call_later(timeout, self._expire, ident, expired)
        self._outbox.append(request)
        if self._writer_of is not call:  # none, or one still busy with an ended call
            self._writer_of = call
            if hasattr(call, "write_nowait"):
                loop.call_soon(self._flush, call)
            else:
                self._spawn(self._write(call))
        return answer

    def _flush(self, call: Any) -> None:
        """Writes what was asked during the loop pass that scheduled it, as ``_write`` does
        but with no task, while the call takes messages without waiting (a connection of
        ours, open, its buffer not full); what it cannot take, or a linger that is due, goes
        to a writer task."""
        try:
            while call is self._call and self._outbox and not self._lingering():
                if not call.writable():
                    break
                call.write_nowait(self._next_message())
        except Exception as exc:  # noqa: BLE001 - every waiter hears of it
            self.end(call, exc)
        if call is self._call and self._outbox:
            self._spawn(self._write(call))  # it clears ``_writer_of`` when done
        else:
            self._writer_of = None

    def _expire(self, ident: int, expired: Callable[[], Exception]) -> None:
        self._expiries.pop(ident, None)
        answer = self._waiting.pop(ident, None)
        if answer is not None and not answer.done():
            answer.set_exception(expired())

    async def _write(self, call: Any) -> None:
        try:
            if self._lingering():
                await asyncio.sleep(self._linger)
            while self._outbox and call is self._call:
                await call.write(self._next_message())
        except Exception as exc:  # noqa: BLE001 - every waiter hears of it
            self.end(call, exc)
        finally:
            if self._writer_of is call:
                self._writer_of = None

    def _lingering(self) -> bool:
        """Busy enough that the next write waits ``linger`` for more requests to join it."""
        return self._busy is not None and len(self._waiting) >= self._busy

    def _next_message(self) -> Any:
        """The next message of queued requests (at least one), taken off the queue, counted."""
        count = self._fitting()
        message = self._pack(self._outbox[:count])
        del self._outbox[:count]
        self.messages_written += 1
        self.requests_written += count
        return message

    def _fitting(self) -> int:
        """How many queued requests the next message takes (at least one)."""
        if self._message_bytes is None:
            return len(self._outbox)
        size, count = 0, 0
        for request in self._outbox:
            size += request.ByteSize() + 8  # type: ignore[attr-defined]  # and its framing
            if count and size > self._message_bytes:
                break
            count += 1
        return count

    async def _read(self, call: Any) -> None:
        try:
            async for message in call:
                for reply in message.replies:
                    answer = self._waiting.pop(reply.id, None)
                    expiry = self._expiries.pop(reply.id, None)
                    if expiry is not None:
                        expiry.cancel()
                    if answer is not None and not answer.done():
                        answer.set_result(reply)
            self.end(call, None)
        except Exception as exc:  # noqa: BLE001
            self.end(call, exc)

    def end(self, call: Any, exc: BaseException | None) -> None:
        """``call`` ended (the peer restarted, the network failed): everything waiting on it
        fails, and the next request opens a new call."""
        if call is not self._call:
            return
        self._call = None
        self._outbox.clear()
        failure = self._failure(exc)
        waiting, self._waiting = self._waiting, {}
        expiries, self._expiries = self._expiries, {}
        for expiry in expiries.values():
            expiry.cancel()
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(failure)
                answer.exception()
        with contextlib.suppress(Exception):
            call.cancel()

    def abandon(self) -> None:
        """Ends the current call at once (its waiters fail); the next request opens a new one.
        Synchronous on purpose: a caller moving the stream to another peer must not yield
        before it has pointed the next call there."""
        if self._call is not None:
            self.end(self._call, None)

    async def close(self) -> None:
        """Ends the stream (its waiters fail) and waits for its reader and writer to finish,
        so no task of it outlives the event loop."""
        call = self._call
        self.abandon()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if call is not None:  # gRPC's own task for the call ends once its status is in
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call.code(), 5)
