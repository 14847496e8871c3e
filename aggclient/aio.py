"""``AsyncClient``: the client's API for asyncio programs (load generators), a shell over the
same ``aggclient.core.ClientCore`` as the blocking ``Client``, with its transactions on one
``Transact`` stream per member (framed when the member has a framed port).

A stream's replies carry no trailing metadata, so a transaction answered on one cannot say
which members the answering member hears silent, as a ``Commit`` answer does: when such a
transaction fails as unavailable, the member that answered is asked (``Members``, as
``Client`` asks it whether it answers at all) and its ``silent`` list is heard instead. An
answer that committed says nothing; a transaction too big for a stream message goes by
``Commit`` and is heard like ``Client``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from aggclient import rows, subscriptions
from aggclient.base import CaSource, ClientBase
from aggclient.core import Answer, Ask, CommitWatch, Describe, Done, Plan, step
from aggclient.routing import Router
from aggclient.subscriptions import Changes
from aggview import errors
from aggview.frames import FramedCall
from aggview.loops import done_within
from aggview.security import client_ssl
from aggview.status import CODE_BY_NUMBER, error_from_status
from aggview.streams import AskEach
from aggview.values import to_row
from aggview.wire import client_pb2 as pb
from aggview.wire import client_pb2_grpc as pb_grpc
from aggview.wire.ltm_pb2 import ExchangeHello

T = TypeVar("T")

# A Transact message carries at most this much; a transaction as big goes by its own Commit
# call instead, so one over the server's size limit (max_request_bytes, at least 64 KiB)
# fails alone instead of ending the stream of every transaction beside it.
STREAM_MESSAGE_BYTES = 32 * 1024

Stream = AskEach[pb.TransactRequest, pb.TransactReply]


class AsyncSnapshot(rows.Snapshot):
    """Reads at one held timestamp (``AsyncClient.snapshot``): the reads of
    :class:`~aggclient.rows.Snapshot`, each awaited (``await snap.get(...)``)."""


class _AsyncClientTransaction(rows.Transaction):
    def __init__(self, client: AsyncClient) -> None:
        super().__init__()
        self._client = client

    async def __aenter__(self) -> _AsyncClientTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.operations:
            self.timestamp = await self._client.commit(self.operations)


async def _grpc_status_tasks_done(limit: float = 1.0) -> None:
    """gRPC keeps a task per call until the call's status is in, which can be a few loop turns
    after the channel closed; a loop closed before then logs "Task was destroyed but it is
    pending!". Wait for those (any channel's: they end by themselves), at most ``limit`` s."""
    deadline = asyncio.get_running_loop().time() + limit
    while asyncio.get_running_loop().time() < deadline:
        if not any(
            "_handle_status_once_received" in getattr(t.get_coro(), "__qualname__", "")
            for t in asyncio.all_tasks()
            if not t.done()
        ):
            return
        await asyncio.sleep(0.001)


class AsyncClient(ClientBase):
    """The same API for asyncio: ``async with client.transaction() as tx``, ``await get(...)``.
    Takes the same security, routing and ``silent_after`` arguments as :class:`Client`, and
    gives up on a silent member as it does (see this module's docstring for what a stream's
    answer cannot say)."""

    channels = grpc.aio

    def _opened(self, ca: CaSource | None, tls: bool | None, token: str | None) -> None:
        # The members' framed ports: TLS with the cluster's CA, the token in the hello.
        self._frames_ssl = client_ssl(ca, tls)
        self._token = token or ""
        # Why a stream: per transaction, a Python gRPC server spends far less CPU on a share
        # of a stream message than on a call.
        self._transactions = self._stream(self._stub)
        # streams to the address given that a leader's stream replaced (``_relearn``)
        self._replaced: list[Stream] = []
        self._routing_lock = asyncio.Lock()
        # member -> (channel, stub, its Transact stream)
        self._members: dict[int, tuple[Any, Any, Stream]] = {}
        # questions in flight, shared by the commits that ask the same at once
        self._asking: dict[tuple[Ask, Any], asyncio.Future[Answer]] = {}

    def _stream(self, stub: Any, framed: str = "") -> Stream:
        """The Transact stream of ``stub``'s server, or at ``framed``, the same stream on
        the member's framed-TCP port (a frame costs both sides a fraction of a gRPC stream
        message)."""
        if framed:
            hello = ExchangeHello(stream="transact", token=self._token).SerializeToString()
            open_call = lambda: FramedCall(  # noqa: E731
                framed, hello, pb.TransactReplies.FromString, self._frames_ssl
            )
        else:
            open_call = lambda: stub.Transact(metadata=self._metadata)  # noqa: E731
        return AskEach(
            open_call,
            lambda requests: pb.TransactRequests(requests=requests),
            self._stream_ended,
            message_bytes=STREAM_MESSAGE_BYTES,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for stream in self._replaced:
            await stream.close()
        await self._transactions.close()
        for channel, _, stream in self._members.values():
            await stream.close()
            await channel.close()
        await self._channel.close()
        await _grpc_status_tasks_done()

    async def _routing(self) -> Router:
        if self._core.router is not None:  # known: every commit asks, no lock to take
            return self._core.router
        async with self._routing_lock:
            router = self._core.router
            if router is None:
                try:
                    reply = await self._call(self._stub.Members, pb.MembersRequest())
                except errors.AggviewError:  # a server from before members
                    reply = pb.MembersReply()
                router = self._core.met(reply)
                framed = self._core.framed_port(0)
                if not router.routes and framed:
                    # A cluster of one member: its transactions on its framed port too.
                    self._replaced.append(self._transactions)
                    self._transactions = self._stream(self._stub, framed)
        return router

    async def _relearn(self) -> None:
        """As ``Client._relearn``: who leads now, and the leader in place of a dead address
        given (its calls and its transaction stream)."""
        leader = await self._drive(self._core.relearn())
        if leader is not None:
            given = self._transactions
            self._stub, self._transactions = await self._member(leader)
            if given is not self._transactions:  # closed with the client, not lost
                self._replaced.append(given)

    async def _drive(self, plan: Plan[T], pinned: Mapping[int | None, Any] | None = None) -> T:
        """As ``Client._drive``: runs a core plan, each question answered by a call."""
        question = step(plan, None)
        while not isinstance(question, Done):
            question = step(plan, await self._answer(question, pinned or {}))
        return question.value  # type: ignore[no-any-return]

    async def _answer(self, question: Ask | Describe, pinned: Mapping[int | None, Any]) -> Answer:
        if isinstance(question, Describe):
            try:
                return await self._call(
                    self._stub.Describe, pb.DescribeRequest(name=question.table)
                )
            except errors.AggviewError:
                return None
        if question.member in pinned:
            stub = pinned[question.member]
        else:
            stub = (await self._member(question.member))[0]
        # the commits in flight that ask the same member the same at once share one call
        key = (question, stub)
        if key not in self._asking:
            asking = asyncio.ensure_future(self._members_answer(stub, question.timeout))
            self._asking[key] = asking
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(self._asking[key])

    async def _members_answer(self, stub: Any, timeout: float) -> Answer:
        try:
            return await stub.Members(pb.MembersRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            return exc.code()

    async def _member(self, member: int | None) -> tuple[Any, Stream]:
        """(stub, Transact stream) of a member (None: the address this client was given)."""
        if member is None:
            return self._stub, self._transactions
        if member not in self._members:
            router = await self._routing()
            if member not in self._members:  # not opened by another task while this one waited
                channel = self._open(router.members[member])
                stub = pb_grpc.AggviewStub(channel)
                stream = self._stream(stub, self._core.framed_port(member))
                self._members[member] = (channel, stub, stream)
        _, stub, stream = self._members[member]
        return stub, stream

    async def _routed(self, operations: Sequence[pb.Operation]) -> int | None:
        """The member to send these operations to (None: the address this client was given)."""
        await self._routing()
        return await self._drive(self._core.route(operations))

    async def _leader(self) -> Any:
        """The leader, which keeps the catalog (DDL, refreshes go there)."""
        router = await self._routing()
        return (await self._member(router.leader))[0] if router.routes else self._stub

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = self._explained(exc)
        if isinstance(error, errors.Unavailable):
            await self._relearn()
        raise error

    async def sql(
        self, statement: str, *, as_of: int = 0, consistency: str = "committed"
    ) -> rows.Rows:
        stub = await self._leader()
        request = pb.SqlRequest(sql=statement, as_of=as_of, tentative=rows.tentative(consistency))
        return rows.sql_rows(await self._call(stub.Sql, request))

    def transaction(self) -> _AsyncClientTransaction:
        return _AsyncClientTransaction(self)

    async def commit(self, operations: list[pb.Operation]) -> int:
        """On the client's Transact stream; a transaction too big to share a message goes
        by its own Commit call. Given up on as ``Client.commit`` gives up (see
        ``silent_after``)."""
        # The operations as the stream carries them, made once: its size says whether the
        # transaction shares the stream (a Commit call's request has the same size). A retry
        # sends a message of its own (the first one carries the first attempt's id).
        unsent = [pb.TransactRequest(operations=operations)]
        alone = unsent[0].ByteSize() + 8 > STREAM_MESSAGE_BYTES
        request = pb.CommitRequest(operations=operations) if alone else None
        member = await self._routed(operations)
        stub, stream = await self._member(member)
        self.last_member = member

        def transact() -> pb.TransactRequest:
            return unsent.pop() if unsent else pb.TransactRequest(operations=operations)

        async def once() -> int:
            watch = self._core.watch(member)
            if watch is None:  # as before silent members: the call's deadline alone
                if request is not None:
                    return (await self._call(stub.Commit, request)).timestamp
                return _timestamp(await stream.ask(transact(), *self._deadline()))
            if request is not None:
                call = stub.Commit(request, timeout=self.timeout, metadata=self._metadata)
                committed = asyncio.ensure_future(self._committed(call))
                return await self._watched(committed, watch, {member: stub})
            # the stream's own future of the answer: no task between it and the watch
            sent = stream.send(transact(), *self._deadline())
            return _timestamp(await self._watched(sent, watch, {member: stub}))

        try:
            return await self.retry.arun(once, self._retried)
        except errors.Unavailable as exc:
            await self._drive(
                self._core.gave_up(member, exc, verdict_carried=alone), {member: stub}
            )
            await self._relearn()
            raise

    async def _watched(
        self, answer: asyncio.Future[int], watch: CommitWatch, pinned: Mapping[int | None, Any]
    ) -> int:
        """``answer`` (a commit in flight), given up on (``OutcomeUnknown``) when the core's
        checks say so (``core.CommitWatch``); the commit is cancelled then (its outcome is
        unknown: it may have reached the member). A check's questions never hide the
        answer: it is returned as soon as it comes, the check left unfinished (asking a cut
        member waited out its timeout while the commit had been answered)."""
        try:
            while True:
                if await done_within(answer, watch.wait()):
                    return answer.result()
                checking = asyncio.ensure_future(self._drive(watch.checks(), pinned))
                checking.add_done_callback(lambda task: task.cancelled() or task.exception())
                try:
                    await asyncio.wait({answer, checking}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not checking.done():
                        checking.cancel()
                if answer.done():
                    return answer.result()
                error = checking.result()
                if error is not None:
                    raise error
        finally:
            answer.cancel()

    async def _committed(self, call: Any) -> int:
        """A ``Commit`` call's timestamp; its answer's verdict on silent members is heard,
        ok or not."""
        try:
            reply = await call
        except grpc.RpcError as exc:
            self._core.heard_verdict(exc.trailing_metadata())  # type: ignore[attr-defined]
            raise self._explained(exc) from None
        finally:
            call.cancel()  # a no-op once answered; ends the call when given up on
        self._core.heard_verdict(await call.trailing_metadata())
        return reply.timestamp  # type: ignore[no-any-return]

    def _deadline(self) -> tuple[float, Callable[[], Exception]]:
        """How long a transaction on the stream waits for its answer, and what it hears then."""
        return self.timeout, lambda: errors.Unavailable(
            f"no answer within {self.timeout:g}s (the transaction may or may not have committed)"
        )

    def _stream_ended(self, exc: BaseException | None) -> errors.AggviewError:
        """What transactions still waiting hear when the stream ends (the coordinator
        restarted, a message it refused): they may or may not have committed."""
        if isinstance(exc, grpc.RpcError):
            error = self._explained(exc)
            if type(error) is not errors.AggviewError:  # a status the server chose to end it
                return error
            exc = error  # INTERNAL, CANCELLED, UNKNOWN: the call broke (a server gone mid-stream)
        if isinstance(exc, (errors.Unauthenticated, errors.PermissionDenied)):
            return exc  # the member refused the stream for its token: nothing was sent
        return errors.Unavailable(f"the transaction stream ended: {exc}")

    async def get(self, table: str, key: Mapping[str, Any], *, as_of: int = 0) -> rows.Row | None:
        request = pb.GetRequest(table=table, key=to_row(key), as_of=as_of)
        return rows.get_row(await self._call((await self._reader(as_of)).Get, request))

    async def scan(
        self,
        table: str,
        prefix: Mapping[str, Any] | None = None,
        *,
        limit: int = 0,
        as_of: int = 0,
    ) -> rows.Rows:
        request = pb.ScanRequest(table=table, prefix=to_row(prefix or {}), limit=limit, as_of=as_of)
        return rows.scan_rows(await self._call((await self._reader(as_of)).Scan, request))

    async def view(
        self,
        name: str,
        where: Mapping[str, Any] | None = None,
        *,
        as_of: int = 0,
        consistency: str = "committed",
    ) -> rows.Rows:
        request = pb.ViewRequest(
            view=name, where=to_row(where or {}), as_of=as_of, tentative=rows.tentative(consistency)
        )
        return rows.scan_rows(await self._call((await self._reader(as_of)).View, request))

    async def _reader(self, as_of: int) -> Any:
        return await self._leader() if as_of else self._stub

    @contextlib.asynccontextmanager
    async def snapshot(self, ttl_ms: int = 0) -> AsyncIterator[AsyncSnapshot]:
        """See :meth:`Client.snapshot`: ``async with client.snapshot() as snap``."""
        stub = await self._leader()
        reply = await self._call(stub.HoldSnapshot, pb.SnapshotRequest(ttl_ms=ttl_ms))
        try:
            yield AsyncSnapshot(self, reply.timestamp)  # type: ignore[arg-type]
        finally:
            await self._call(stub.ReleaseSnapshot, pb.ReleaseRequest(lease=reply.lease))

    async def query(
        self, view: str, where: Mapping[str, Any] | None = None, **how: Any
    ) -> rows.Rows:
        """See :meth:`Client.query` (``how``: rollup, order_by, limit, as_of, consistency)."""
        as_of, consistency = how.pop("as_of", 0), how.pop("consistency", "committed")
        return await self.sql(
            rows.query_sql(view, where, **how), as_of=as_of, consistency=consistency
        )

    def watch(
        self,
        view: str,
        where: Mapping[str, Any] | None = None,
        *,
        interval_ms: int = 0,
        consistency: str = "committed",
    ) -> AsyncIterator[Changes]:
        """A view's changes as they commit: ``async for changes in client.watch("v")``; the
        first is the whole view (``reset``); reconnects by itself. See :meth:`Client.watch`."""
        opened = subscriptions.opener(
            self._stub, self._metadata, view, where, interval_ms, rows.tentative(consistency)
        )
        return subscriptions.watch_changes(opened)

    async def refresh(self, name: str) -> int:
        stub = await self._leader()
        return (await self._call(stub.Refresh, pb.RefreshRequest(view=name))).timestamp


def _timestamp(reply: pb.TransactReply) -> int:
    """A transaction's answer on the stream: its commit timestamp, or the error it carries."""
    if reply.code:
        code = CODE_BY_NUMBER.get(reply.code, grpc.StatusCode.UNKNOWN)
        raise error_from_status(code, reply.message, reply.reason)
    return reply.timestamp  # type: ignore[no-any-return]
