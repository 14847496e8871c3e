"""The Python client: one-shot transactions and snapshot reads over gRPC.

``Client`` is blocking; ``AsyncClient`` is the same API for asyncio programs (load generators).
Both retry timestamp-order aborts themselves with a bounded number of attempts; every other
error is raised as the matching ``aggview.errors`` class.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc

from aggclient import subscriptions
from aggclient.routing import Router
from aggclient.subscriptions import Changes, Watch
from aggview import errors
from aggview.frames import FramedCall
from aggview.net import GRPC_OPTIONS
from aggview.retry import RetryPolicy
from aggview.security import client_credentials, client_ssl
from aggview.status import CODE_BY_NUMBER, error_from_rpc, error_from_status, silent_members
from aggview.streams import AskEach
from aggview.values import from_row, to_row, to_value
from aggview.wire import client_pb2 as pb
from aggview.wire import client_pb2_grpc as pb_grpc
from aggview.wire.ltm_pb2 import ExchangeHello

_COMPARISONS = {"==": pb.EQ, "!=": pb.NE, "<": pb.LT, "<=": pb.LE, ">": pb.GT, ">=": pb.GE}
Require = Mapping[str, tuple[str, Any]]


class Row(dict):  # type: ignore[type-arg]
    """A row as a dict, with the timestamp of the snapshot it was read from."""

    timestamp: int = 0


class Rows(list):  # type: ignore[type-arg]
    """Rows from one consistent snapshot, with its timestamp (and a message for SQL); or,
    ``tentative``, a cumulus view's newest values, which may mix timestamps (``timestamp``:
    the last change fed to its runtime)."""

    timestamp: int = 0
    message: str = ""
    tentative: bool = False
    columns: list[str]
    results: list[Rows]  # SQL's BEGIN READ ONLY; SELECT …; COMMIT: one per SELECT


def _conditions(require: Require | None) -> list[pb.Condition]:
    out = []
    for column, spec in (require or {}).items():
        if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] in _COMPARISONS):
            raise errors.InvalidArgument(
                f"require[{column!r}] must be (op, value) with op one of "
                f"{', '.join(_COMPARISONS)}; got {spec!r}"
            )
        out.append(pb.Condition(column=column, op=_COMPARISONS[spec[0]], value=to_value(spec[1])))
    return out


class Transaction:
    """Buffers operations; the whole transaction is sent once, when the ``with`` block ends."""

    def __init__(self) -> None:
        self.operations: list[pb.Operation] = []
        self.timestamp: int | None = None

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        self.operations.append(
            pb.Operation(kind=pb.Operation.INSERT, table=table, values=to_row(row, table))
        )

    def update(
        self,
        table: str,
        key: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        require: Require | None = None,
    ) -> None:
        self._keyed(pb.Operation.UPDATE, table, key, changes, require)

    def add(
        self,
        table: str,
        key: Mapping[str, Any],
        deltas: Mapping[str, Any],
        *,
        require: Require | None = None,
    ) -> None:
        self._keyed(pb.Operation.ADD, table, key, deltas, require)

    def delete(self, table: str, key: Mapping[str, Any], *, require: Require | None = None) -> None:
        self._keyed(pb.Operation.DELETE, table, key, {}, require)

    def _keyed(
        self,
        kind: int,
        table: str,
        key: Mapping[str, Any],
        values: Mapping[str, Any],
        require: Require | None,
    ) -> None:
        self.operations.append(
            pb.Operation(
                kind=kind,
                table=table,
                key=to_row(key, table),
                values=to_row(values, table),
                require=_conditions(require),
            )
        )


class _ClientTransaction(Transaction):
    def __init__(self, client: Client) -> None:
        super().__init__()
        self._client = client

    def __enter__(self) -> _ClientTransaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.operations:
            self.timestamp = self._client.commit(self.operations)


class _AsyncClientTransaction(Transaction):
    def __init__(self, client: AsyncClient) -> None:
        super().__init__()
        self._client = client

    async def __aenter__(self) -> _AsyncClientTransaction:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.operations:
            self.timestamp = await self._client.commit(self.operations)


# A commit unanswered this long makes the client ask the member whether it still answers at
# all (a cheap ``Members`` call, given as long): a member that does not, cut off from the
# network or stopped, is given up on (outcome unknown) and routed around, instead of being
# waited for until the call's deadline or the network heals. A member that answers, however
# slow the commit, is waited for. Two seconds each: at 1 s, members of a cluster starved of
# CPU (four test workers on two cores) missed both and clients gave up on healthy members.
SILENT_AFTER = 2.0
# Sooner than that, and again every half second, another member is asked whether its prober
# hears the coordinating member silent (a member cut off is heard so by the others about a
# second into the cut): the cluster's view, not a guess from one slow call.
ASK_OTHERS_AFTER = 1.0
ASK_OTHERS_EVERY = 0.5
# the codes of a call nobody answered (an error the server sent back is an answer)
SILENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

CONSISTENCY = ("committed", "tentative")


def _tentative(consistency: str) -> bool:
    """``consistency``: 'committed' (one timestamp's exact answer) or 'tentative' (a cumulus
    view's newest values; every other view answers as committed)."""
    if consistency not in CONSISTENCY:
        raise errors.InvalidArgument(
            f"consistency must be 'committed' or 'tentative'; got {consistency!r}"
        )
    return consistency == "tentative"


def _sql_rows(reply: pb.SqlReply) -> Rows:
    order = list(reply.columns)
    rows = Rows(Row(_ordered(from_row(r), order)) for r in reply.rows)
    rows.timestamp, rows.message, rows.columns = reply.timestamp, reply.message, list(reply.columns)
    rows.tentative = reply.tentative
    rows.results = [_sql_rows(r) for r in reply.results]  # a read-only block's SELECTs
    return rows


def _scan_rows(reply: pb.ScanReply | pb.ViewReply) -> Rows:
    order = list(reply.columns)
    rows = Rows(Row(_ordered(from_row(r), order)) for r in reply.rows)
    for row in rows:
        row.timestamp = reply.timestamp
    rows.timestamp, rows.columns = reply.timestamp, list(reply.columns)
    rows.tentative = getattr(reply, "tentative", False)
    return rows


def _ordered(values: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """Columns in declaration (or SELECT) order: the wire's map has none."""
    return {c: values[c] for c in order if c in values} if order else values


# How a hint at a TLS mismatch tells the Python client's user to connect (the command line
# names its options instead: ``Client.tls_settings``).
TLS_SETTINGS = "ca= (its CA certificate) and token="


def _explain(exc: grpc.RpcError, plaintext: bool, settings: str) -> errors.AggviewError:
    """The server's error; a connection that fails gets a hint at the likely cause: nothing
    listening, or a TLS mismatch (``settings``: how to give the CA and a token)."""
    error = error_from_rpc(exc)
    text = str(error)
    if not isinstance(error, errors.Unavailable):
        return error
    if "connection refused" in text.lower():
        return errors.Unavailable(f"{text} (nothing listens there: is the cluster running?)")
    if plaintext and "failed to connect" in text:
        return errors.Unavailable(
            f"{text} (this client speaks plaintext: if the cluster runs with TLS, connect "
            f"with {settings})"
        )
    if not plaintext and "handshake" in text.lower():
        return errors.Unavailable(
            f"{text} (TLS handshake failed: the server may be plaintext (--insecure), or the "
            "CA given is not the one that signed its certificate)"
        )
    return error


CaSource = str | Path | bytes


class _Silent(errors.Unavailable):
    """A member that answered neither a call nor a probe (see ``Client.silent_after``)."""


def _get_row(reply: pb.GetReply) -> Row | None:
    if not reply.found:
        return None
    row = Row(from_row(reply.row))
    row.timestamp = reply.timestamp
    return row


def _open_channel(
    channels: Any,
    address: str,
    ca: CaSource | None,
    tls: bool | None,
    token: str | None,
    options: Sequence[tuple[str, Any]],
) -> tuple[Any, Any, bool]:
    """(channel, call metadata, plaintext?) from ``grpc`` or ``grpc.aio`` alike."""
    credentials, metadata = client_credentials(ca, tls, token)
    channel_options = [*GRPC_OPTIONS, *options]
    if credentials is None:
        return channels.insecure_channel(address, options=channel_options), metadata, True
    channel = channels.secure_channel(address, credentials, options=channel_options)
    return channel, metadata, False


def query_sql(
    view: str,
    where: Mapping[str, Any] | None = None,
    rollup: Sequence[str] | None = None,
    order_by: Sequence[str] = (),
    limit: int = 0,
) -> str:
    """The SQL of a query-layer call (see ``Client.query``), every value a quoted literal."""
    names = [view, *(where or {}), *(rollup or ()), *(c.lstrip("-") for c in order_by)]
    for name in names:
        if not _IDENTIFIER.match(name):
            raise errors.InvalidArgument(f"invalid name {name!r}: letters, digits and _")
    terms = []
    for column, wanted in (where or {}).items():
        if wanted is None:
            terms.append(f"{column} IS NULL")
        elif isinstance(wanted, list | set | frozenset):
            terms.append(f"{column} IN ({', '.join(_sql_literal(v) for v in wanted)})")
        elif isinstance(wanted, tuple):
            low, high = wanted
            terms.append(f"{column} BETWEEN {_sql_literal(low)} AND {_sql_literal(high)}")
        else:
            terms.append(f"{column} = {_sql_literal(wanted)}")
    sql = f"SELECT * FROM {view}"
    if terms:
        sql += " WHERE " + " AND ".join(terms)
    if rollup is not None:
        sql += f" GROUP BY {', '.join(rollup) or '()'}"
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{c[1:]} DESC" if c.startswith("-") else c for c in order_by
        )
    if limit:
        sql += f" LIMIT {int(limit)}"
    return sql


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise errors.InvalidArgument(f"cannot compare with {value!r} ({type(value).__name__})")


class Snapshot:
    """Reads at one held timestamp (``Client.snapshot``)."""

    def __init__(self, client: Client, timestamp: int) -> None:
        self.client = client
        self.timestamp = timestamp

    def get(self, table: str, key: Mapping[str, Any]) -> Row | None:
        return self.client.get(table, key, as_of=self.timestamp)

    def scan(self, table: str, prefix: Mapping[str, Any] | None = None, *, limit: int = 0) -> Rows:
        return self.client.scan(table, prefix, limit=limit, as_of=self.timestamp)

    def view(self, name: str, where: Mapping[str, Any] | None = None) -> Rows:
        return self.client.view(name, where, as_of=self.timestamp)

    def sql(self, statement: str) -> Rows:
        return self.client.sql(statement, as_of=self.timestamp)

    def query(self, view: str, where: Mapping[str, Any] | None = None, **how: Any) -> Rows:
        return self.client.query(view, where, as_of=self.timestamp, **how)


class AsyncSnapshot:
    """Reads at one held timestamp (``AsyncClient.snapshot``)."""

    def __init__(self, client: AsyncClient, timestamp: int) -> None:
        self.client = client
        self.timestamp = timestamp

    async def get(self, table: str, key: Mapping[str, Any]) -> Row | None:
        return await self.client.get(table, key, as_of=self.timestamp)

    async def scan(
        self, table: str, prefix: Mapping[str, Any] | None = None, *, limit: int = 0
    ) -> Rows:
        return await self.client.scan(table, prefix, limit=limit, as_of=self.timestamp)

    async def view(self, name: str, where: Mapping[str, Any] | None = None) -> Rows:
        return await self.client.view(name, where, as_of=self.timestamp)

    async def sql(self, statement: str) -> Rows:
        return await self.client.sql(statement, as_of=self.timestamp)

    async def query(self, view: str, where: Mapping[str, Any] | None = None, **how: Any) -> Rows:
        return await self.client.query(view, where, as_of=self.timestamp, **how)


class Client:
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
    the outcome is unknown) and avoided for a while (None: wait up to ``timeout``)."""

    tls_settings = TLS_SETTINGS  # how a TLS-mismatch hint says to connect (see _explain)

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        ca: CaSource | None = None,
        tls: bool | None = None,
        token: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
        route: bool = True,
        silent_after: float | None = SILENT_AFTER,
    ):
        self.address = address
        self.timeout = timeout
        self.silent_after = silent_after
        self.retry = retry or RetryPolicy()
        self.retries = 0  # timestamp-order aborts retried so far
        self.last_read_timestamp = 0
        self._channel, self._metadata, self._plaintext = _open_channel(
            grpc, address, ca, tls, token, options
        )
        self._stub = pb_grpc.AggviewStub(self._channel)
        self._open = lambda member: _open_channel(grpc, member, ca, tls, token, options)[0]
        self._router: Router | None = None if route else Router([], 0)
        self._members: dict[int, tuple[Any, Any]] = {}  # member -> (channel, stub)
        self._relearn_after = 0.0
        self.last_member: int | None = None  # the member the last commit went to (None: given)

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
            error = _explain(exc, self._plaintext, self.tls_settings)
        if isinstance(error, errors.Unavailable):
            self._relearn()
        raise error

    def _routing(self) -> Router:
        if self._router is None:
            try:
                reply = self._call(self._stub.Members, pb.MembersRequest())
            except errors.AggviewError:  # a server from before members: it serves everything
                reply = pb.MembersReply()
            self._router = Router(reply.addresses, reply.partitions, reply.leader)
        return self._router

    def _relearn(self) -> None:
        """A server did not answer: who leads now (another member took the lead from a dead
        one), asked of the address given and then of each member; if the address given is
        the one gone, the leader serves what went there. At most once a second."""
        router, now = self._router, time.monotonic()
        if router is None or not router.routes or now < self._relearn_after:
            return
        self._relearn_after = now + 1.0
        # members that did not answer lately are not asked (each would cost the timeout)
        given = router.members.index(self.address) if self.address in router.members else None
        for member in [None, *range(len(router.members))]:
            index = given if member is None else member
            if router.avoided(index, now):
                continue
            stub = self._member(member)
            try:
                reply = stub.Members(
                    pb.MembersRequest(), timeout=self._probe_timeout, metadata=self._metadata
                )
            except grpc.RpcError:
                router.unreachable(index, time.monotonic())
                continue
            router.leader = reply.leader
            if member is not None:  # the address given did not answer
                self._stub = self._member(reply.leader)
            return

    @property
    def _probe_timeout(self) -> float:
        return min(2.0, self.silent_after or 2.0)

    def _answers(self, stub: Any) -> bool:
        """Whether the member behind ``stub`` answers a cheap call within the probe timeout
        (an error it sends back is an answer too)."""
        try:
            stub.Members(pb.MembersRequest(), timeout=self._probe_timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            return exc.code() not in SILENT_CODES
        return True

    def _watched(self, stub: Any, request: pb.CommitRequest, member: int | None = None) -> Any:
        """``stub.Commit(request)`` sent to ``member`` (None: the address given), given up on
        (``Unavailable``) when the member stops answering altogether while it runs (see
        ``silent_after``), or when another member says it hears it silent."""
        if self.silent_after is None:
            return self._call(stub.Commit, request)
        call = stub.Commit.future(request, timeout=self.timeout, metadata=self._metadata)
        now = time.monotonic()
        ask_at, probe_at = now + ASK_OTHERS_AFTER, now + self.silent_after
        try:
            while True:
                try:
                    reply = call.result(timeout=max(0.0, min(ask_at, probe_at) - now))
                    self._heard_silent(call.trailing_metadata())
                    return reply
                except grpc.FutureTimeoutError:
                    pass
                now = time.monotonic()
                if now >= ask_at:
                    ask_at = now + ASK_OTHERS_EVERY
                    if self._others_hear_silent(member):
                        call.cancel()
                        raise _Silent(
                            f"member {member}, coordinating this transaction, did not answer "
                            "and the others hear it silent: its outcome is unknown"
                        )
                if now >= probe_at:
                    if not self._answers(stub):
                        call.cancel()
                        raise _Silent(
                            "the member coordinating this transaction did not answer for "
                            f"{self.silent_after + self._probe_timeout:g}s: its outcome is "
                            "unknown"
                        )
                    now = time.monotonic()
                    probe_at = now + self.silent_after
        except grpc.RpcError as exc:
            self._heard_silent(exc.trailing_metadata())  # type: ignore[attr-defined]
            raise _explain(exc, self._plaintext, self.tls_settings) from None

    def _others_hear_silent(self, member: int | None) -> bool:
        """Whether another member's prober hears ``member`` silent (asked of the first other
        member not avoided; False when there is none or it does not answer either)."""
        router = self._router
        if member is None or router is None or not router.routes:
            return False
        now = time.monotonic()
        others = [m for m in range(len(router.members)) if m != member]
        other = next((m for m in others if not router.avoided(m, now)), None)
        if other is None:
            return False
        try:
            reply = self._member(other).Members(
                pb.MembersRequest(), timeout=ASK_OTHERS_EVERY * 2, metadata=self._metadata
            )
        except grpc.RpcError:
            return False
        if member in reply.silent:
            router.unreachable(member, time.monotonic())
            return True
        return False

    def _heard_silent(self, metadata: Any) -> None:
        """The answering member said which members its prober hears silent: the next
        transactions are routed around them (``Router.unreachable``)."""
        members = silent_members(metadata)
        if members and self._router is not None:
            now = time.monotonic()
            for member in members:
                self._router.unreachable(member, now)

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
        router = self._routing()
        if not router.routes:
            return None
        for table in router.unknown(operations):
            try:
                reply = self._call(self._stub.Describe, pb.DescribeRequest(name=table))
            except errors.AggviewError:
                reply = None
            router.learn(table, reply)
        return router.member_for(operations, time.monotonic())

    def _leader(self) -> Any:
        """The leader, which keeps the catalog (DDL, refreshes go there)."""
        router = self._routing()
        return self._member(router.leader) if router.routes else self._stub

    def sql(self, statement: str, *, as_of: int = 0, consistency: str = "committed") -> Rows:
        """``consistency = 'tentative'``: a SELECT of a cumulus view reads its newest values."""
        request = pb.SqlRequest(sql=statement, as_of=as_of, tentative=_tentative(consistency))
        rows = _sql_rows(self._call(self._leader().Sql, request))
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
            # avoided only if it does not answer: one that answers unavailable (a participant
            # of this transaction is) coordinates the next ones as well as any other, and
            # avoiding it sent them to the leader, which may be the silent one
            if isinstance(exc, _Silent) or not self._answers(stub):
                self._routing().unreachable(member, time.monotonic())
            self._relearn()
            raise

    def _retried(self, exc: BaseException, failed: int, wait: float) -> None:
        self.retries += 1

    def get(self, table: str, key: Mapping[str, Any], *, as_of: int = 0) -> Row | None:
        """A row by its key, now or ``as_of`` a held snapshot (see :meth:`snapshot`)."""
        request = pb.GetRequest(table=table, key=to_row(key), as_of=as_of)
        reply = self._call(self._reader(as_of).Get, request)
        self.last_read_timestamp = reply.timestamp
        return _get_row(reply)

    def scan(
        self,
        table: str,
        prefix: Mapping[str, Any] | None = None,
        *,
        limit: int = 0,
        as_of: int = 0,
    ) -> Rows:
        request = pb.ScanRequest(table=table, prefix=to_row(prefix or {}), limit=limit, as_of=as_of)
        rows = _scan_rows(self._call(self._reader(as_of).Scan, request))
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
            view=name, where=to_row(where or {}), as_of=as_of, tentative=_tentative(consistency)
        )
        rows = _scan_rows(self._call(self._reader(as_of).View, request))
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
            self._stub, self._metadata, view, where, interval_ms, _tentative(consistency)
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


# A Transact message carries at most this much; a transaction as big goes by its own Commit
# call instead, so one over the server's size limit (max_request_bytes, at least 64 KiB)
# fails alone instead of ending the stream of every transaction beside it.
STREAM_MESSAGE_BYTES = 32 * 1024


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


class AsyncClient:
    """The same API for asyncio: ``async with client.transaction() as tx``, ``await get(...)``.
    Takes the same security and routing arguments as :class:`Client`."""

    tls_settings = TLS_SETTINGS

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        ca: CaSource | None = None,
        tls: bool | None = None,
        token: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
        route: bool = True,
    ):
        self.address = address
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.retries = 0
        self._channel, self._metadata, self._plaintext = _open_channel(
            grpc.aio, address, ca, tls, token, options
        )
        self._stub = pb_grpc.AggviewStub(self._channel)
        self._open = lambda member: _open_channel(grpc.aio, member, ca, tls, token, options)[0]
        # The members' framed ports: TLS with the cluster's CA, the token in the hello.
        self._frames_ssl = client_ssl(ca, tls)
        self._token = token or ""
        # Why a stream: per transaction, a Python gRPC server spends far less CPU on a share
        # of a stream message than on a call.
        self._transactions = self._stream(self._stub)
        self._router: Router | None = None if route else Router([], 0)
        self._routing_lock = asyncio.Lock()
        # member -> (channel, stub, its Transact stream)
        self._members: dict[int, tuple[Any, Any, AskEach[pb.TransactRequest, pb.TransactReply]]]
        self._members = {}
        self._framed: list[str] = []  # the members' framed ports for transactions, if any
        self._relearn_after = 0.0

    def _stream(self, stub: Any, framed: str = "") -> AskEach[pb.TransactRequest, pb.TransactReply]:
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
        await self._transactions.close()
        for channel, _, stream in self._members.values():
            await stream.close()
            await channel.close()
        await self._channel.close()
        await _grpc_status_tasks_done()

    async def _routing(self) -> Router:
        async with self._routing_lock:
            if self._router is None:
                try:
                    reply = await self._call(self._stub.Members, pb.MembersRequest())
                except errors.AggviewError:  # a server from before members
                    reply = pb.MembersReply()
                self._router = Router(reply.addresses, reply.partitions, reply.leader)
                self._framed = list(reply.transact_addresses)
        return self._router

    async def _relearn(self) -> None:
        """As ``Client._relearn``: who leads now, and the leader in place of a dead address
        given (its calls and its transaction stream)."""
        router, now = self._router, time.monotonic()
        if router is None or not router.routes or now < self._relearn_after:
            return
        self._relearn_after = now + 1.0
        for member in [None, *range(len(router.members))]:
            stub, _ = await self._member(member)
            try:
                reply = await stub.Members(pb.MembersRequest(), timeout=2, metadata=self._metadata)
            except grpc.RpcError:
                continue
            router.leader = reply.leader
            if member is not None:  # the address given did not answer
                self._stub, self._transactions = await self._member(reply.leader)
            return

    async def _member(self, member: int | None) -> tuple[Any, Any]:
        """(stub, Transact stream) of a member (None: the address this client was given)."""
        if member is None:
            return self._stub, self._transactions
        if member not in self._members:
            router = await self._routing()
            channel = self._open(router.members[member])
            stub = pb_grpc.AggviewStub(channel)
            framed = self._framed[member] if member < len(self._framed) else ""
            self._members[member] = (channel, stub, self._stream(stub, framed))
        _, stub, stream = self._members[member]
        return stub, stream

    async def _routed(self, operations: Sequence[pb.Operation]) -> int | None:
        """The member to send these operations to (None: the address this client was given)."""
        router = await self._routing()
        if not router.routes:
            return None
        for table in router.unknown(operations):
            try:
                reply = await self._call(self._stub.Describe, pb.DescribeRequest(name=table))
            except errors.AggviewError:
                reply = None
            router.learn(table, reply)
        return router.member_for(operations, time.monotonic())

    async def _leader(self) -> Any:
        """The leader, which keeps the catalog (DDL, refreshes go there)."""
        router = await self._routing()
        return (await self._member(router.leader))[0] if router.routes else self._stub

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            error = _explain(exc, self._plaintext, self.tls_settings)
        if isinstance(error, errors.Unavailable):
            await self._relearn()
        raise error

    async def sql(self, statement: str, *, as_of: int = 0, consistency: str = "committed") -> Rows:
        stub = await self._leader()
        request = pb.SqlRequest(sql=statement, as_of=as_of, tentative=_tentative(consistency))
        return _sql_rows(await self._call(stub.Sql, request))

    def transaction(self) -> _AsyncClientTransaction:
        return _AsyncClientTransaction(self)

    async def commit(self, operations: list[pb.Operation]) -> int:
        """On the client's Transact stream; a transaction too big to share a message goes
        by its own Commit call."""
        request = pb.CommitRequest(operations=operations)
        alone = request.ByteSize() + 8 > STREAM_MESSAGE_BYTES
        member = await self._routed(operations)
        stub, stream = await self._member(member)

        async def once() -> int:
            if alone:
                return (await self._call(stub.Commit, request)).timestamp
            return await self._transact(stream, request)

        try:
            return await self.retry.arun(once, self._retried)
        except errors.Unavailable:
            (await self._routing()).unreachable(member, time.monotonic())
            await self._relearn()
            raise

    def _retried(self, exc: BaseException, failed: int, wait: float) -> None:
        self.retries += 1

    async def _transact(
        self, stream: AskEach[pb.TransactRequest, pb.TransactReply], request: pb.CommitRequest
    ) -> int:
        reply = await stream.ask(
            pb.TransactRequest(operations=request.operations),
            self.timeout,
            lambda: errors.Unavailable(
                f"no answer within {self.timeout:g}s (the transaction may or may not have "
                "committed)"
            ),
        )
        if reply.code:
            code = CODE_BY_NUMBER.get(reply.code, grpc.StatusCode.UNKNOWN)
            raise error_from_status(code, reply.message, reply.reason)
        return reply.timestamp

    def _stream_ended(self, exc: BaseException | None) -> errors.AggviewError:
        """What transactions still waiting hear when the stream ends (the coordinator
        restarted, a message it refused): they may or may not have committed."""
        if isinstance(exc, grpc.RpcError):
            error = _explain(exc, self._plaintext, self.tls_settings)
            if type(error) is not errors.AggviewError:  # a status the server chose to end it
                return error
            exc = error  # INTERNAL, CANCELLED, UNKNOWN: the call broke (a server gone mid-stream)
        if isinstance(exc, (errors.Unauthenticated, errors.PermissionDenied)):
            return exc  # the member refused the stream for its token: nothing was sent
        return errors.Unavailable(f"the transaction stream ended: {exc}")

    async def get(self, table: str, key: Mapping[str, Any], *, as_of: int = 0) -> Row | None:
        request = pb.GetRequest(table=table, key=to_row(key), as_of=as_of)
        return _get_row(await self._call((await self._reader(as_of)).Get, request))

    async def scan(
        self,
        table: str,
        prefix: Mapping[str, Any] | None = None,
        *,
        limit: int = 0,
        as_of: int = 0,
    ) -> Rows:
        request = pb.ScanRequest(table=table, prefix=to_row(prefix or {}), limit=limit, as_of=as_of)
        return _scan_rows(await self._call((await self._reader(as_of)).Scan, request))

    async def view(
        self,
        name: str,
        where: Mapping[str, Any] | None = None,
        *,
        as_of: int = 0,
        consistency: str = "committed",
    ) -> Rows:
        request = pb.ViewRequest(
            view=name, where=to_row(where or {}), as_of=as_of, tentative=_tentative(consistency)
        )
        return _scan_rows(await self._call((await self._reader(as_of)).View, request))

    async def _reader(self, as_of: int) -> Any:
        return await self._leader() if as_of else self._stub

    @contextlib.asynccontextmanager
    async def snapshot(self, ttl_ms: int = 0) -> AsyncIterator[AsyncSnapshot]:
        """See :meth:`Client.snapshot`: ``async with client.snapshot() as snap``."""
        stub = await self._leader()
        reply = await self._call(stub.HoldSnapshot, pb.SnapshotRequest(ttl_ms=ttl_ms))
        try:
            yield AsyncSnapshot(self, reply.timestamp)
        finally:
            await self._call(stub.ReleaseSnapshot, pb.ReleaseRequest(lease=reply.lease))

    async def query(self, view: str, where: Mapping[str, Any] | None = None, **how: Any) -> Rows:
        """See :meth:`Client.query` (``how``: rollup, order_by, limit, as_of, consistency)."""
        as_of, consistency = how.pop("as_of", 0), how.pop("consistency", "committed")
        return await self.sql(query_sql(view, where, **how), as_of=as_of, consistency=consistency)

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
            self._stub, self._metadata, view, where, interval_ms, _tentative(consistency)
        )
        return subscriptions.watch_changes(opened)

    async def refresh(self, name: str) -> int:
        stub = await self._leader()
        return (await self._call(stub.Refresh, pb.RefreshRequest(view=name))).timestamp
