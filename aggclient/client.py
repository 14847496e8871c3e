"""The Python client: one-shot transactions and snapshot reads over gRPC.

``Client`` is blocking; ``AsyncClient`` (``aggclient.aio``) is the same API for asyncio programs
(load generators). Both are thin shells over one ``aggclient.core.ClientCore``, which decides
where a transaction goes, who leads, which members are silent and when a commit is given up
on; the shells make the calls. Both retry timestamp-order aborts themselves with a bounded
number of attempts; every other error is raised as the matching ``aggview.errors`` class.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc

from aggclient import subscriptions
from aggclient.aio import STREAM_MESSAGE_BYTES, AsyncClient, AsyncSnapshot
from aggclient.base import TLS_SETTINGS, CaSource, ClientBase, _explain, _open_channel
from aggclient.core import (
    ASK_OTHERS_AFTER,
    ASK_OTHERS_EVERY,
    SILENT_AFTER,
    SILENT_CODES,
    Answer,
    Ask,
    Describe,
    Done,
    Plan,
    step,
)
from aggclient.core import OutcomeUnknown as _Silent
from aggclient.routing import Router
from aggclient.rows import (
    CONSISTENCY,
    Require,
    Row,
    Rows,
    Snapshot,
    Transaction,
    get_row,
    query_sql,
    scan_rows,
    sql_rows,
    tentative,
)
from aggclient.subscriptions import Changes, Watch
from aggview import errors
from aggview.retry import RetryPolicy
from aggview.values import to_row
from aggview.wire import client_pb2 as pb
from aggview.wire import client_pb2_grpc as pb_grpc

# Names this module has always offered (the CLI, aggspark, loadgen, tests import them here).
__all__ = [
    "ASK_OTHERS_AFTER",
    "ASK_OTHERS_EVERY",
    "CONSISTENCY",
    "SILENT_AFTER",
    "SILENT_CODES",
    "STREAM_MESSAGE_BYTES",
    "TLS_SETTINGS",
    "AsyncClient",
    "AsyncSnapshot",
    "CaSource",
    "Client",
    "Require",
    "RetryPolicy",
    "Row",
    "Rows",
    "Snapshot",
    "Transaction",
    "_Silent",
    "_explain",
    "_open_channel",
    "query_sql",
]

T = TypeVar("T")


class _ClientTransaction(Transaction):
    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client

    def __enter__(self) -> _ClientTransaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.operations:
            self.timestamp = self._client.commit(self.operations)


class Client(ClientBase):
    """A blocking client. Use as a context manager, or call :meth:`close`.

    A secure cluster needs ``ca=`` (the CA certificate: PEM bytes, a file, or a directory
    holding ``ca.pem``; ``tls=True`` alone trusts the system's CAs) and ``token=`` (sent as
    ``authorization: Bearer``, only ever over TLS). ``options`` adds gRPC channel options.

    Each transaction goes to the member hosting most of its rows, reads and DDL to the
    address given or the leader; ``route=False`` sends everything to the address given (a
    client that can reach only that server: behind a proxy, or a test pausing another
    member), which coordinates it at the cost of messages between members.

    ``silent_after``: a commit unanswered that long makes the client ask the member whether
    it answers at all; one that does not answer that either is given up on (``Unavailable``:
    the outcome is unknown) and avoided for a while (None: wait up to ``timeout``). Sooner,
    another member is asked whether it hears the member silent (``aggclient.core``)."""

    def _opened(self, ca: CaSource | None, tls: bool | None, token: str | None) -> None:
        self.last_read_timestamp = 0
        self._members: dict[int, tuple[Any, Any]] = {}  # member -> (channel, stub)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for channel, _ in self._members.values():
            channel.close()
        self._channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = self._explained(exc)
        if isinstance(error, errors.Unavailable):
            self._relearn()
        raise error

    def _routing(self) -> Router:
        router = self._core.router
        if router is None:
            try:
                reply = self._call(self._stub.Members, pb.MembersRequest())
            except errors.AggviewError:  # a server from before members: it serves everything
                reply = pb.MembersReply()
            router = self._core.met(reply)
        return router

    def _relearn(self) -> None:
        """A server did not answer: who leads now (``ClientCore.relearn``); if the address
        given is the one gone, the leader serves what went there."""
        leader = self._drive(self._core.relearn())
        if leader is not None:
            self._stub = self._member(leader)

    def _drive(self, plan: Plan[T], pinned: Mapping[int | None, Any] | None = None) -> T:
        """Runs a core plan, each question answered by a call (``pinned``: the stub to ask
        a member by, instead of its current one: the stub a commit went to)."""
        question = step(plan, None)
        while not isinstance(question, Done):
            question = step(plan, self._answer(question, pinned or {}))
        return question.value  # type: ignore[no-any-return]

    def _answer(self, question: Ask | Describe, pinned: Mapping[int | None, Any]) -> Answer:
        if isinstance(question, Describe):
            try:
                return self._call(self._stub.Describe, pb.DescribeRequest(name=question.table))
            except errors.AggviewError:
                return None
        stub = pinned.get(question.member) or self._member(question.member)
        try:
            return stub.Members(
                pb.MembersRequest(), timeout=question.timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            return exc.code()

    def _watched(self, stub: Any, request: pb.CommitRequest, member: int | None = None) -> Any:
        """``stub.Commit(request)`` sent to ``member`` (None: the address given), given up on
        (``OutcomeUnknown``) when the core's checks say so (``core.CommitWatch``); each
        answer's verdict on silent members is heard."""
        watch = self._core.watch(member)
        if watch is None:
            return self._call(stub.Commit, request)
        call = stub.Commit.future(request, timeout=self.timeout, metadata=self._metadata)
        try:
            while True:
                try:
                    reply = call.result(timeout=watch.wait())
                    self._core.heard_verdict(call.trailing_metadata())
                    return reply
                except grpc.FutureTimeoutError:
                    pass
                error = self._check_during(watch.checks(), {member: stub}, call)
                if error is not None:
                    call.cancel()
                    raise error
        except grpc.RpcError as exc:
            self._core.heard_verdict(exc.trailing_metadata())  # type: ignore[attr-defined]
            raise self._explained(exc) from None

    def _check_during(
        self, plan: Plan[_Silent | None], pinned: Mapping[int | None, Any], call: Any
    ) -> _Silent | None:
        """A commit's checks (``_drive``), each question asked while ``call`` is waited for
        too: None as soon as the commit answers. A question waited out to its timeout (the
        member asked is the cut one) hid a reply that had come meanwhile: the nemesis saw
        commits at a healthy member answered within 1.2 s of a cut reach the client at 2 s."""
        question = step(plan, None)
        while not isinstance(question, Done):
            if not isinstance(question, Ask):
                question = step(plan, self._answer(question, pinned))
                continue
            stub = pinned.get(question.member) or self._member(question.member)
            asked = stub.Members.future(
                pb.MembersRequest(), timeout=question.timeout, metadata=self._metadata
            )
            either = threading.Event()
            asked.add_done_callback(lambda _, done=either: done.set())
            call.add_done_callback(lambda _, done=either: done.set())
            either.wait()
            if call.done():
                asked.cancel()
                return None
            try:
                answer: Answer = asked.result()
            except grpc.RpcError as exc:
                answer = exc.code()  # type: ignore[attr-defined]
            question = step(plan, answer)
        return question.value  # type: ignore[no-any-return]

    def _member(self, member: int | None) -> Any:
        """The stub of a member (None: the address this client was given)."""
        if member is None:
            return self._stub
        if member not in self._members:
            channel = self._open(self._routing().members[member])
            self._members[member] = (channel, pb_grpc.AggviewStub(channel))
        return self._members[member][1]

    def _routed(self, operations: Sequence[pb.Operation]) -> int | None:
        """The member to send these operations to (None: the address this client was given)."""
        self._routing()
        return self._drive(self._core.route(operations))

    def _leader(self) -> Any:
        """The leader, which keeps the catalog (DDL, refreshes go there)."""
        router = self._routing()
        return self._member(router.leader) if router.routes else self._stub

    def sql(self, statement: str, *, as_of: int = 0, consistency: str = "committed") -> Rows:
        """``consistency = 'tentative'``: a SELECT of a cumulus view reads its newest values."""
        request = pb.SqlRequest(sql=statement, as_of=as_of, tentative=tentative(consistency))
        rows = sql_rows(self._call(self._leader().Sql, request))
        self.last_read_timestamp = rows.timestamp or self.last_read_timestamp
        return rows

    def transaction(self) -> _ClientTransaction:
        return _ClientTransaction(self)

    def commit(self, operations: list[pb.Operation]) -> int:
        """Sends one transaction, retrying timestamp-order aborts; returns its timestamp."""
        request = pb.CommitRequest(operations=operations)
        member = self._routed(operations)
        stub = self._member(member)
        self.last_member = member
        try:
            return self.retry.run(
                lambda: self._watched(stub, request, member).timestamp, self._retried
            )
        except errors.Unavailable as exc:
            self._drive(self._core.gave_up(member, exc), {member: stub})
            self._relearn()
            raise

    def get(self, table: str, key: Mapping[str, Any], *, as_of: int = 0) -> Row | None:
        """A row by its key, now or ``as_of`` a held snapshot (see :meth:`snapshot`)."""
        request = pb.GetRequest(table=table, key=to_row(key), as_of=as_of)
        reply = self._call(self._reader(as_of).Get, request)
        self.last_read_timestamp = reply.timestamp
        return get_row(reply)

    def scan(
        self,
        table: str,
        prefix: Mapping[str, Any] | None = None,
        *,
        limit: int = 0,
        as_of: int = 0,
    ) -> Rows:
        request = pb.ScanRequest(table=table, prefix=to_row(prefix or {}), limit=limit, as_of=as_of)
        rows = scan_rows(self._call(self._reader(as_of).Scan, request))
        self.last_read_timestamp = rows.timestamp
        return rows

    def view(
        self,
        name: str,
        where: Mapping[str, Any] | None = None,
        *,
        as_of: int = 0,
        consistency: str = "committed",
    ) -> Rows:
        """A view's rows (SELECT order) from one snapshot; ``.timestamp`` is when they were
        exact: now for a sync view, the last refresh for an async one, the last committed
        epoch for a cumulus one. ``consistency = 'tentative'``: a cumulus view's newest values
        (``.tentative``; they may mix timestamps)."""
        request = pb.ViewRequest(
            view=name, where=to_row(where or {}), as_of=as_of, tentative=tentative(consistency)
        )
        rows = scan_rows(self._call(self._reader(as_of).View, request))
        self.last_read_timestamp = rows.timestamp
        return rows

    def _reader(self, as_of: int) -> Any:
        """Reads at a held snapshot go where it is held (member 0); others, where asked."""
        return self._leader() if as_of else self._stub

    @contextlib.contextmanager
    def snapshot(self, ttl_ms: int = 0) -> Iterator[Snapshot]:
        """A read-only transaction: every read through the yielded object (``get``, ``scan``,
        ``view``, ``sql``, ``query``) is at one timestamp, ``.timestamp``, held until the block
        ends (or ``ttl_ms`` passes without a read: 60 s by default)."""
        stub = self._leader()
        reply = self._call(stub.HoldSnapshot, pb.SnapshotRequest(ttl_ms=ttl_ms))
        try:
            yield Snapshot(self, reply.timestamp)
        finally:
            self._call(stub.ReleaseSnapshot, pb.ReleaseRequest(lease=reply.lease))

    def query(
        self,
        view: str,
        where: Mapping[str, Any] | None = None,
        *,
        rollup: Sequence[str] | None = None,
        order_by: Sequence[str] = (),
        limit: int = 0,
        as_of: int = 0,
        consistency: str = "committed",
    ) -> Rows:
        """Slice, dice, roll up and drill down a view, exactly, from one snapshot
        (``consistency = 'tentative'``: a cumulus view's newest values).

        ``where``: column -> a value (equality), a list (IN), a (low, high) tuple (BETWEEN) or
        None (IS NULL). ``rollup``: the group columns to keep (fewer than the view's: each
        aggregate is re-aggregated from the groups' state, so AVG, MIN, MAX and COUNT DISTINCT
        stay exact; [] gives one total row; None, the view's own groups). ``order_by``:
        columns, "-col" descending. A column or aggregate the view cannot answer is an
        error naming it."""
        return self.sql(
            query_sql(view, where, rollup, order_by, limit), as_of=as_of, consistency=consistency
        )

    def watch(
        self,
        view: str,
        callback: Callable[[Changes, Watch], None] | None = None,
        where: Mapping[str, Any] | None = None,
        *,
        interval_ms: int = 0,
        consistency: str = "committed",
    ) -> Watch:
        """Subscribes to a view (or a slice: ``where`` equalities): ``watch.copy.rows`` is the
        view as of ``watch.copy.timestamp``, kept up to date on a thread that calls
        ``callback(changes, watch)`` after each message and reconnects by itself. The first
        message is the whole view (``changes.reset``). ``watch.close()`` (or ``stop()``, or
        the end of a ``with client.watch(...) as watch:`` block) ends it.
        ``consistency = 'tentative'``: a cumulus view's tentative changes too, as each feed of
        its runtime reaches them."""
        opened = subscriptions.opener(
            self._stub, self._metadata, view, where, interval_ms, tentative(consistency)
        )
        return Watch(opened, callback)

    def when(
        self,
        view: str,
        group: Mapping[str, Any],
        predicate: Callable[[dict[str, Any]], bool],
        *,
        interval_ms: int = 0,
    ) -> Future[dict[str, Any]]:
        """A future resolved with the row of ``group`` (its group columns' values) once
        ``predicate(row)`` holds, e.g. ``client.when("v", {"shop": 1}, lambda r: r["n"] >=
        100).result(timeout=60)``."""
        return subscriptions.when(self._watch_stream(view, group, interval_ms), predicate)

    def _watch_stream(
        self, view: str, where: Mapping[str, Any] | None, interval_ms: int
    ) -> Callable[[int], Any]:
        return subscriptions.opener(self._stub, self._metadata, view, where, interval_ms)

    def refresh(self, name: str) -> int:
        """Refreshes an async view now; returns the timestamp it is exact at."""
        return self._call(self._leader().Refresh, pb.RefreshRequest(view=name)).timestamp
