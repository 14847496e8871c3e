"""The client API's gRPC face: ``AggviewServicer``, thin methods over the catalog, the
transaction manager and bulk access, and a client's transactions on one stream."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
from collections.abc import Callable
from typing import Any

from aggview import errors
from aggview.frames import Answer, answering
from aggview.keycodec import encode_key, prefix_end
from aggview.rowcodec import decode_row
from aggview.schema import prefix_to_storage
from aggview.status import Malformed, grpc_method, tell_silent
from aggview.streams import AnswerEach
from aggview.values import decode_entries, from_row, to_row
from aggview.wire import client_pb2 as cpb
from aggview.wire import client_pb2_grpc as cpb_grpc
from aggview.wire import ltm_pb2 as lpb
from coordinator.bulk import BulkAccess
from coordinator.convert import key_bytes, wire_row
from coordinator.gate import ADMIT, CLIENT_SERVICE, ClientGate
from coordinator.sql import run_sql
from coordinator.transactions import TransactionManager
from coordinator.view_stack import relation
from coordinator.watch import watch

log = logging.getLogger("coordinator.service")  # the member's log, as before the split


def _transact_requests(message: cpb.TransactRequests | Malformed) -> list[cpb.TransactRequest]:
    if isinstance(message, Malformed):
        raise errors.InvalidArgument(f"malformed request: {message.reason}")
    return list(message.requests)


def _failed(id: int, exc: errors.AggviewError) -> cpb.TransactReply:
    return cpb.TransactReply(id=id, code=exc.code.value[0], message=str(exc), reason=exc.reason)


def transactions_stream(
    manager: TransactionManager, admit: Callable[[], Callable[[], None]]
) -> AnswerEach[cpb.TransactRequest, cpb.TransactReply]:
    """A client's transactions on one stream (gRPC ``Transact``, or framed TCP): each runs as
    if by its own Commit call, taking one of the client's slots (``admit``), and is answered
    on its own (its timestamp, or the status and message Commit would have ended with) as
    soon as it is decided."""

    async def commit(request: cpb.TransactRequest) -> cpb.TransactReply:
        try:
            release = admit()
        except errors.AggviewError as exc:
            return _failed(request.id, exc)
        try:
            ts = await manager.commit(list(request.operations))
            return cpb.TransactReply(id=request.id, timestamp=ts)
        except errors.AggviewError as exc:
            return _failed(request.id, exc)
        except Exception as exc:  # a bug: this transaction fails, the stream goes on
            log.exception("internal error in a transaction on a Transact stream")
            return _failed(request.id, errors.AggviewError(f"internal error: {exc!r}"))
        finally:
            release()

    return AnswerEach(
        _transact_requests, commit, lambda replies: cpb.TransactReplies(replies=replies)
    )


_framed_connections = itertools.count(1)


def framed_transactions(
    manager: TransactionManager, gate: ClientGate, hello: lpb.ExchangeHello
) -> Answer:
    """A client's transactions on the member's framed port. In a secure cluster its hello
    carries its token, checked as the gRPC ``Transact`` call's header is, and the client is
    the token's name; without tokens a client is its connection, as on gRPC. Either way each
    client has ``max_client_transactions`` slots."""
    token = gate.authenticate(hello.token or None, CLIENT_SERVICE, "Transact")
    who = token.name if token is not None else f"framed connection {next(_framed_connections)}"
    stream = transactions_stream(manager, functools.partial(gate.admit, who))
    return answering(cpb.TransactRequests.FromString, stream.serve, direct=True)


def caught_up(method: Any) -> Any:
    """At a follower member, a table or view it does not know may be younger than its copy of
    the catalog: it catches up with member 0's (one round trip) and tries once more."""

    @functools.wraps(method)
    async def wrapper(self: AggviewServicer, request: Any, context: object) -> Any:
        try:
            return await method(self, request, context)
        except errors.UnknownTable:
            if self.manager.leader is None:
                raise
            await self.manager.catch_up()
            return await method(self, request, context)

    return wrapper


class AggviewServicer(cpb_grpc.AggviewServicer):
    def __init__(self, manager: TransactionManager, store_url: str = "") -> None:
        self.manager = manager
        self.bulk = BulkAccess(manager)
        self.store_url = store_url
        self._init_leases: dict[str, int] = {}  # view being computed by a job -> its snapshot

    def _as_of(self, ts: int) -> int:
        """A read's timestamp when the client names one: only at a snapshot held here
        (HoldSnapshot), whose row versions are kept; 0 (now) otherwise."""
        if ts:
            self.bulk.leases.check(ts)
        return ts

    @grpc_method
    @caught_up
    async def Sql(self, request: cpb.SqlRequest, context: object) -> cpb.SqlReply:
        result = await run_sql(
            request.sql, self.manager, self._as_of(request.as_of), tentative=request.tentative
        )
        return result.reply()

    @grpc_method
    async def Commit(self, request: cpb.CommitRequest, context: object) -> cpb.CommitReply:
        try:
            ts = await self.manager.commit(list(request.operations))
        finally:  # with an error too: a participant's silence is why a commit fails
            tell_silent(context, self.manager.silent_members())
        return cpb.CommitReply(timestamp=ts)

    @grpc_method
    async def Transact(self, messages: Any, context: Any) -> None:
        """A client's transactions on one stream (see :func:`transactions_stream`)."""
        async for message in transactions_stream(self.manager, ADMIT.get()).serve(messages):
            await context.write(message)

    @grpc_method
    @caught_up
    async def Get(self, request: cpb.GetRequest, context: object) -> cpb.GetReply:
        schema = self.manager.catalog.table(request.table)
        key = key_bytes(schema, from_row(request.key), self.manager.limits)
        rows, ts = await self.manager.read_keys(schema.table_id, [key], self._as_of(request.as_of))
        if key not in rows:
            return cpb.GetReply(found=False, timestamp=ts)
        return cpb.GetReply(found=True, row=wire_row(schema, rows[key]), timestamp=ts)

    @grpc_method
    @caught_up
    async def Scan(self, request: cpb.ScanRequest, context: object) -> cpb.ScanReply:
        schema = self.manager.catalog.table(request.table)
        prefix = from_row(request.prefix)
        start = stop = b""
        if prefix:
            values = prefix_to_storage(schema, prefix)
            start = encode_key(schema.key_types[: len(values)], values)
            stop = prefix_end(start) or b""
        rows, ts = await self.manager.read_range(
            schema.table_id, start, stop, request.limit, self._as_of(request.as_of)
        )
        return cpb.ScanReply(
            rows=[wire_row(schema, data) for _, data in rows],
            timestamp=ts,
            columns=list(schema.column_names),
        )

    @grpc_method
    @caught_up
    async def View(self, request: cpb.ViewRequest, context: object) -> cpb.ViewReply:
        rows, ts, tentative = await self.manager.views.read(
            request.view,
            from_row(request.where),
            self._as_of(request.as_of),
            tentative=request.tentative,
        )
        view = self.manager.views.views[request.view]
        return cpb.ViewReply(
            rows=[to_row(row) for row in rows],
            timestamp=ts,
            columns=list(view.plan.output),
            tentative=tentative,
        )

    @grpc_method
    async def WatchView(self, request: cpb.WatchRequest, context: Any) -> None:
        """A view's changes as they commit (``coordinator.watch``)."""
        if request.interval_ms and not 10 <= request.interval_ms <= 60_000:
            raise errors.InvalidArgument(
                f"interval_ms must be between 10 and 60000 (0: 50 ms), got {request.interval_ms}"
            )
        interval = (request.interval_ms or 50) / 1000
        where = from_row(request.where)
        stall = self.manager.limits.watch_stall_seconds
        async for message in watch(
            self.manager, request.view, where, interval, tentative=request.tentative
        ):
            try:
                await asyncio.wait_for(context.write(message), stall)
            except TimeoutError:
                raise errors.LimitExceeded(
                    f"the subscriber to {request.view} took no message for {stall} s and was "
                    "dropped (watch_stall_seconds; the server keeps one message per subscriber)"
                ) from None

    @grpc_method
    async def Members(self, request: cpb.MembersRequest, context: object) -> cpb.MembersReply:
        return cpb.MembersReply(
            addresses=self.manager.members,
            transact_addresses=self.manager.transact_addresses,
            partitions=self.manager.partitions,
            leader=self.manager.leader_member,
            silent=self.manager.silent_members(),
        )

    @grpc_method
    async def Refresh(self, request: cpb.RefreshRequest, context: object) -> cpb.RefreshReply:
        self.manager.at_leader("a refresh asked for")
        return cpb.RefreshReply(timestamp=await self.manager.views.refresh(request.view))

    # --------------------------------------------------------------- bulk access (Spark)

    @grpc_method
    async def List(self, request: cpb.ListRequest, context: object) -> cpb.ListReply:
        views = self.manager.views.views if self.manager.views else {}
        return cpb.ListReply(tables=sorted(self.manager.catalog.tables), views=sorted(views))

    @grpc_method
    @caught_up
    async def Describe(self, request: cpb.DescribeRequest, context: object) -> cpb.DescribeReply:
        catalog = self.manager.catalog
        if request.name in catalog.tables:
            schema = catalog.tables[request.name]
            return cpb.DescribeReply(
                kind=cpb.DescribeReply.TABLE,
                store_table=schema.table_id,
                schema_json=json.dumps(schema.to_json()),
                columns=list(schema.column_names),
                store_url=self.store_url,
            )
        view = self.manager.views.views.get(request.name)
        if view is None:
            raise errors.UnknownTable(f"unknown table or materialized view {request.name!r}")
        refreshed_at = 0
        if view.plan.mode != "sync" and view.state == "live":
            refreshed_at = await self.manager.views.refreshed_at(view)
        runtime = self.manager.views.runtimes.get(view.name)
        return cpb.DescribeReply(
            kind=cpb.DescribeReply.VIEW,
            store_table=view.view_id,
            plan_json=json.dumps(view.plan.to_json()),
            base_schemas_json=_base_schemas(self.manager, view.plan.base_tables()),
            columns=list(view.plan.output),
            refreshed_at=refreshed_at,
            state=view.state,
            runtime_json=json.dumps(runtime.counts()) if runtime is not None else "",
        )

    @grpc_method
    async def HoldSnapshot(
        self, request: cpb.SnapshotRequest, context: object
    ) -> cpb.SnapshotReply:
        if request.lease:
            ts = self.bulk.leases.renew(request.lease, request.ttl_ms)
            return cpb.SnapshotReply(lease=request.lease, timestamp=ts)
        lease, ts = await self.bulk.leases.hold(request.ttl_ms)
        return cpb.SnapshotReply(lease=lease, timestamp=ts)

    @grpc_method
    async def ReleaseSnapshot(
        self, request: cpb.ReleaseRequest, context: object
    ) -> cpb.ReleaseReply:
        self.bulk.leases.release(request.lease)
        return cpb.ReleaseReply()

    @grpc_method
    async def Splits(self, request: cpb.SplitsRequest, context: object) -> cpb.SplitsReply:
        return cpb.SplitsReply(keys=await self.bulk.splits(request.name, request.count))

    @grpc_method
    async def ReadRange(self, request: cpb.ReadRangeRequest, context: Any) -> None:
        async for page in self.bulk.pages(
            request.name, request.start, request.stop, request.snapshot, request.page_rows or 5000
        ):
            await context.write(cpb.RawPage(rows=[cpb.RawRow(key=k, row=v) for k, v in page]))

    @grpc_method
    async def Load(self, request: cpb.LoadRequest, context: object) -> cpb.LoadReply:
        ts, rows = await self.bulk.load(request.table, request.staging_table)
        return cpb.LoadReply(timestamp=ts, rows=rows)

    @grpc_method
    async def BeginView(self, request: cpb.BeginViewRequest, context: object) -> cpb.BeginViewReply:
        if bool(request.sql) == bool(request.view):
            raise errors.InvalidArgument("give either the CREATE MATERIALIZED VIEW sql or a view")
        views = self.manager.views
        view = await views.begin_external(request.sql, request.view)
        try:
            lease, ts = await self.bulk.leases.hold(request.ttl_ms)
        except BaseException:
            await views.abort_external(view.name)
            raise
        assert view.external is not None
        view.external.snapshot = ts

        async def expired() -> None:
            if self._init_leases.get(view.name) == lease:
                del self._init_leases[view.name]
                log.warning("initialization of %s abandoned: its snapshot lease expired", view.name)
                await views.abort_external(view.name)

        self.bulk.leases.leases[lease].on_expiry = expired
        self._init_leases[view.name] = lease
        return cpb.BeginViewReply(
            view=view.name,
            lease=lease,
            snapshot=ts,
            plan_json=json.dumps(view.plan.to_json()),
            base_schemas_json=_base_schemas(self.manager, view.plan.base_tables()),
        )

    @grpc_method
    async def FinishView(self, request: Any, context: object) -> cpb.FinishViewReply:
        name, snapshot, raws = "", 0, []
        async for chunk in request:
            if isinstance(chunk, Malformed):
                raise errors.InvalidArgument(f"malformed request: {chunk.reason}")
            if name and (chunk.view, chunk.snapshot) != (name, snapshot):
                raise errors.InvalidArgument("every chunk must name the same view and snapshot")
            name, snapshot = chunk.view, chunk.snapshot
            raws.extend((raw.key, raw.row) for raw in chunk.rows)
        if not name:
            raise errors.InvalidArgument("no view rows sent (not even the view's name)")
        views = self.manager.views
        view = views.views.get(name)
        if view is not None and view.plan.mode == "cumulus":  # its program's map entries
            ts = await views.finish_external(name, snapshot, {}, maps=decode_entries(raws))
        else:
            groups = {key: _state_row(row, name) for key, row in raws}
            ts = await views.finish_external(name, snapshot, groups)
        self.bulk.leases.release(self._init_leases.pop(name, 0))
        return cpb.FinishViewReply(
            message=f"initialized materialized view {name} at snapshot {snapshot}", timestamp=ts
        )

    @grpc_method
    async def AbortView(self, request: cpb.AbortViewRequest, context: object) -> cpb.AbortViewReply:
        await self.manager.views.abort_external(request.view)
        self.bulk.leases.release(self._init_leases.pop(request.view, 0))
        return cpb.AbortViewReply()


def _base_schemas(manager: TransactionManager, tables: list[str]) -> list[str]:
    """The schemas of a view's tables (a view it reads: its rows as a table)."""
    views = manager.views.views if manager.views is not None else {}
    return [json.dumps(relation(views, manager.catalog, t).to_json()) for t in tables]


def _state_row(data: bytes, view: str) -> dict[str, Any]:
    try:
        row = decode_row(data)
    except ValueError:
        row = None
    if not isinstance(row, dict) or not isinstance(row.get("_count"), int):
        raise errors.InvalidArgument(f"view {view}: a group's state must be an object with _count")
    return row
