"""The coordinator's gRPC face: thin servicers over the catalog and the transaction manager."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from aggview import errors
from aggview.frames import Answer, FramedServer, answering
from aggview.keycodec import encode_key, prefix_end
from aggview.metrics import MemberState, Metrics, ViewState
from aggview.net import (
    CONTROL_OPTIONS,
    GRPC_OPTIONS,
    SERVER_OPTIONS,
    add_health,
    add_reflection,
    run_until_signalled,
)
from aggview.rowcodec import decode_row
from aggview.schema import prefix_to_storage
from aggview.security import TlsDir, Token, member_channel, member_metadata
from aggview.status import Malformed, add_service, grpc_method, tell_silent
from aggview.streams import AnswerEach
from aggview.values import decode_entries, from_row, to_row
from aggview.wire import client_pb2 as cpb
from aggview.wire import client_pb2_grpc as cpb_grpc
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc
from coordinator import leader_views, leadership
from coordinator.bulk import BulkAccess
from coordinator.catalog import Catalog
from coordinator.clock import Clock
from coordinator.clock_service import ClockServicer, FollowerClock
from coordinator.convert import Limits, key_bytes, wire_row
from coordinator.decision_log import DecisionLog
from coordinator.gate import ADMIT, CLIENT_SERVICE, ClientGate
from coordinator.leadership import Leadership, Lease
from coordinator.local_ltm import LocalLtm, LocalPartitions, MemberLtmServicer
from coordinator.ltm_channel import LtmChannel
from coordinator.member_clock import InFlight, LeaderClock, MemberClock
from coordinator.member_decisions import MemberDecisions
from coordinator.member_roles import MemberRoles, declared_dead
from coordinator.quorum import Prober, Reachability, majority_heard
from coordinator.sql import run_sql
from coordinator.timestamp_oracle import TimestampOracle
from coordinator.transactions import TransactionManager
from coordinator.views import ViewManager
from coordinator.watch import watch
from ltm.server import framed_exchange
from ltm.store import open_store, ownership
from ltm.store.base import Store

log = logging.getLogger(__name__)


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
    return answering(cpb.TransactRequests.FromString, stream.serve)


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
    return [json.dumps(manager.catalog.table(t).to_json()) for t in tables]


def _state_row(data: bytes, view: str) -> dict[str, Any]:
    try:
        row = decode_row(data)
    except ValueError:
        row = None
    if not isinstance(row, dict) or not isinstance(row.get("_count"), int):
        raise errors.InvalidArgument(f"view {view}: a group's state must be an object with _count")
    return row


class OutcomeServicer(lpb_grpc.TransactionOutcomeServicer):
    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    @grpc_method
    async def Query(self, request: lpb.OutcomeRequest, context: object) -> lpb.OutcomeReply:
        answers_for = await self.manager.answering_for()
        return lpb.OutcomeReply(
            outcomes=[self.manager.outcome(ts) for ts in request.ts], answers_for=answers_for
        )


@dataclass
class CoordinatorConfig:
    store_url: str
    log_dir: Path
    partitions: int  # how many the cluster has; this process hosts its share of them
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True
    limits: Limits = Limits()
    tls: TlsDir | None = None  # None: plaintext (``--insecure``)
    tokens: dict[str, Token] | None = None  # None: no authentication (``--insecure``)
    failover_after: float = 0.0  # seconds an LTM may stay silent before failover; 0: never
    checkpoint_interval: float = 2.0  # of the local partitions
    cache_rows: int = 1_000_000
    # Several coordinating members (``--processes P``): every member's address, in order;
    # member 0 keeps the clock and the catalog. Partition p is hosted by member p % P.
    members: list[str] = field(default_factory=list)
    member: int = 0
    take_lead: bool = False  # replicated: this member leads (every member is starting)
    # Where each member serves the members' streams on framed TCP (``aggview.frames``), in
    # member order, and the port this one listens on; none: the streams go over gRPC.
    exchanges: list[str] = field(default_factory=list)
    exchange_port: int = 0
    # Where /metrics is served (``--metrics-port``; 0: a free port); None: not served. The
    # series are kept either way (a counter's increment costs next to nothing).
    metrics_port: int | None = None

    @property
    def replicates(self) -> bool:
        """Members copy their logs to one another when they fail over (``--replicate``)."""
        return len(self.members) >= 2 and self.failover_after > 0

    def addresses(self, partitions: int) -> list[str]:
        """Where each partition is hosted (none in one process: every one is here)."""
        return _per_partition(self.members, partitions)

    def exchange_addresses(self, partitions: int) -> list[str]:
        """Where each partition's member serves framed TCP (none: gRPC carries the streams)."""
        return _per_partition(self.exchanges, partitions)

    def hosted(self, partitions: int) -> list[int] | None:
        """The partitions this process hosts (None: every one)."""
        if not self.members:
            return None
        return [p for p in range(partitions) if p % len(self.members) == self.member]


def _per_partition(by_member: list[str], partitions: int) -> list[str]:
    """Partition p's entry of a per-member list: member p % members hosts it."""
    return [by_member[p % len(by_member)] for p in range(partitions)] if by_member else []


def build_manager(
    config: CoordinatorConfig, reach: Reachability | None = None
) -> TransactionManager:
    """``reach``: whether this member reaches a majority (replicated clusters), which it
    needs to drop an unreachable copy of its logs."""
    store = open_store(config.store_url)
    catalog = Catalog(store)
    count = config.partitions
    _check_partitions(catalog, count)
    metrics = Metrics()
    decisions = DecisionLog(
        config.log_dir, fsync=config.fsync, observe=metrics.wal_observer("decisions")
    )
    may_drop = reach.has_majority if reach is not None else lambda: True
    in_flight = InFlight()
    read_at = time.monotonic()  # a lease runs from the start of the read that gave it
    leader, lead = _leadership(config, store)
    if lead is not None:  # this member leads a replicated cluster: guarded, with a lease
        catalog.guard = lambda: leadership.guard(store, lead)
    # the follower clock calls back into the manager, made below with the clock
    clock = _member_clock(
        config, store, catalog, in_flight, reach, leader, lead, read_at, lambda: manager
    )
    manager = TransactionManager(catalog, clock, decisions, limits=config.limits, metrics=metrics)
    metrics.watch(functools.partial(member_state, manager))
    if reach is not None:
        manager.ltm_silent = lambda ltm: reach.silent(ltm % len(config.members))
        manager.silent_members = reach.silent_members
    manager.leader_member = leader
    if leader != config.member:
        manager.leader = config.members[leader]
    else:
        manager.epoch = catalog.first_epoch()
    manager.lead = lead
    manager.local = _local_partitions(config, store, manager, may_drop)
    if config.replicates:
        manager.replication = MemberDecisions(
            store,
            decisions,
            config.member,
            config.members,
            count,
            config.log_dir / "decision-copies",
            manager.adopt,
            tls=config.tls,
            fsync=config.fsync,
            on_superseded=declared_dead,
            may_drop=may_drop,
            silent=manager.ltm_silent,
        )
    manager.members = list(config.members)
    manager.member = config.member
    manager.transact_addresses = list(config.exchanges)
    manager.channels = _partition_channels(config, store, manager)
    views = ViewManager(manager, runtime_dir=config.log_dir / "cumulus", tls=config.tls)
    manager.views = manager.view_hooks = views  # the service's; and every transaction's hooks
    return manager


def _check_partitions(catalog: Catalog, count: int) -> None:
    """The data's number of partitions is fixed when it is first written."""
    partitions = catalog.meta("partitions")
    if partitions is None:
        catalog.set_meta("partitions", str(count))
    elif int(partitions) != count:
        raise errors.FailedPrecondition(
            f"this data was written by {partitions} LTMs; start with {partitions} "
            f"(got {count}): repartitioning is not supported"
        )


def _member_clock(
    config: CoordinatorConfig,
    store: Store,
    catalog: Catalog,
    in_flight: InFlight,
    reach: Reachability | None,
    leader: int,
    lead: Leadership | None,
    read_at: float,
    manager_of: Callable[[], TransactionManager],
) -> MemberClock:
    """The leader's clock here, or a follower's stream to it. ``manager_of()``: the manager,
    once it exists (the follower clock calls back into it)."""
    if leader == config.member:
        oracle = TimestampOracle(catalog.meta, catalog.set_meta)
        lease = None
        if lead is not None:
            lease = Lease()
            lease.confirmed(read_at)  # renewed from the record once serving
        return LeaderClock(
            Clock(oracle, max(1, len(config.members)), leader=leader), in_flight, lease
        )

    async def locate() -> tuple[int, str] | None:
        """Where the clock is now (after the leader's stream failed)."""
        record = await asyncio.to_thread(leadership.read, store)
        if record.member == config.member:
            return None  # this member is taking the lead
        manager = manager_of()
        manager.leader = config.members[record.member]
        manager.leader_member = record.member
        return record.member, config.members[record.member]

    clock = FollowerClock(
        config.member,
        in_flight,
        config.members[leader],
        config.tls,
        lambda epoch, configuration: manager_of().views.install(epoch, configuration),
        locate if config.replicates else None,
        leader_member=leader,
        exchanges=config.exchanges,
    )
    if reach is not None:
        clock.silent = reach.silent
    return clock


def _local_partitions(
    config: CoordinatorConfig,
    store: Store,
    manager: TransactionManager,
    may_drop: Callable[[], bool],
) -> LocalPartitions:
    """The partitions this member hosts, in process; they ask the other members about the
    transactions they coordinated."""
    others = [
        (m, _outcome_stub(address, config.tls))
        for m, address in enumerate(config.members)
        if m != config.member
    ]
    count = config.partitions
    return LocalPartitions(
        store,
        config.log_dir / "partitions",
        count,
        lambda timestamps: _outcomes(manager, others, timestamps),
        fsync=config.fsync,
        cache_rows=config.cache_rows,
        checkpoint_interval=config.checkpoint_interval,
        hosted=config.hosted(count),
        members=config.members if config.replicates else None,
        tls=config.tls,
        may_drop=may_drop,
        silent=manager.ltm_silent,
        wal_observe=manager.metrics.wal_observer("partition"),
    )


def _partition_channels(
    config: CoordinatorConfig, store: Store, manager: TransactionManager
) -> list[Any]:
    """Each partition's channel: in process if this member serves it, else to the member the
    ownership record names (after a failover, a partition lives elsewhere)."""
    count = config.partitions
    addresses = config.addresses(count)
    channels: list[Any] = []
    for p in range(count):
        record = ownership.read(store, p)
        if record.owner in manager.local.hostings:
            channels.append(
                LocalLtm(p, manager.local.hostings[record.owner], manager._watermarks, record.epoch)
            )
            continue
        channel = LtmChannel(
            p,
            addresses[record.owner],
            manager._watermarks,
            config.tls,
            owner=record.owner,
            epoch=record.epoch,
            exchanges=config.exchange_addresses(count),
        )
        channel.silent = manager.ltm_silent
        channels.append(channel)
    return channels


def member_state(manager: TransactionManager) -> MemberState:
    """What the member is now, for a scrape of its metrics (on the HTTP server's thread: the
    containers are copied before they are walked, and a walk that met a change is redone)."""
    for _ in range(10):
        try:
            return _member_state(manager)
        except RuntimeError:  # changed size during iteration: the loop moved on meanwhile
            continue
    return _member_state(manager)


def _member_state(manager: TransactionManager) -> MemberState:
    hostings = list(manager.local.hostings.values()) if manager.local is not None else []
    views = list(manager.views.views.values()) if manager.views is not None else []
    clock = getattr(manager.clock, "clock", None)  # a leader's pure clock
    copies: dict[int, bool] = {}
    for hosting in hostings:
        for partition, shipper in list(hosting.shippers.items()):
            copies[partition] = bool(shipper.in_sync)
    return MemberState(
        member=manager.member,
        leader=manager.leader is None,
        term=manager.lead.term if manager.lead is not None else 0,
        partitions=sum(len(hosting.served()) for hosting in hostings),
        lookup_hits=manager.lookups.hits,
        lookup_misses=manager.lookups.misses,
        clock_grants=clock.grants if isinstance(clock, Clock) else 0,
        views=[ViewState(v.name, v.plan.mode, v.state) for v in views],
        copies_in_sync=copies,
    )


def _leadership(config: CoordinatorConfig, store: Store) -> tuple[int, Leadership | None]:
    """Which member leads, and the record this one leads under when it is that member of a
    replicated cluster. Unreplicated, member 0 always leads; replicated, the store's record
    says (``--take-lead``: this member takes it, every member is starting)."""
    if not config.replicates:
        return 0, None
    if config.take_lead:
        return config.member, leadership.take(store, config.member, None)
    record = leadership.read(store)
    if record.member != config.member:
        return record.member, None
    return config.member, leadership.take(store, config.member, record)  # back: a new term


# An outcome question unanswered this long counts as silence (asked again in half a second,
# see ``Participant._outcome_loop``): waiting longer kept rows of a cut-off member's in-doubt
# transactions held for seconds after another member had adopted its decision log.
OUTCOME_TIMEOUT = 1.0


def _outcome_stub(address: str, tls: TlsDir | None) -> Callable[[list[int]], Awaitable[Any]]:
    stub = lpb_grpc.TransactionOutcomeStub(member_channel(address, tls, CONTROL_OPTIONS))
    metadata = member_metadata(tls)
    return lambda timestamps: stub.Query(
        lpb.OutcomeRequest(ts=timestamps), timeout=OUTCOME_TIMEOUT, metadata=metadata
    )


async def _outcomes(
    manager: TransactionManager,
    others: list[tuple[int, Callable[[list[int]], Awaitable[Any]]]],
    timestamps: list[int],
) -> list[bool | None]:
    """An in-process participant's question about undecided transactions. With several
    members, whichever coordinated a transaction knows it (its decision log, or in flight);
    the others say aborted. Presumed abort needs every member's answer: while one cannot be
    asked, nothing is known (None: ask again later), unless a member that adopted its
    decision log after it died, and holds it still, answers for it."""
    answered = {manager.member, *await manager.answering_for()}
    answers = [[manager.outcome(ts) for ts in timestamps]]
    silent: list[str] = []
    # A member whose decision log this member holds now is not asked: only the holder of the
    # log knows its transactions (the member itself, cut off, is fenced from it). The others
    # are asked at once, so one silent member costs one timeout, not one each.
    asked = [(member, query) for member, query in others if member not in answered]
    replies = await asyncio.gather(
        *(query(timestamps) for _, query in asked), return_exceptions=True
    )
    for (member, _), reply in zip(asked, replies, strict=True):
        if isinstance(reply, grpc.aio.AioRpcError):
            silent.append(f"member {member}: {reply.details()}")
            continue
        if isinstance(reply, BaseException):
            raise reply
        answers.append(list(reply.outcomes))
        answered |= {member, *reply.answers_for}
    unknown = not set(range(len(manager.members) or 1)) <= answered
    if unknown:
        log.info("outcome of %d transactions not known yet: %s", len(timestamps), silent)
    outcomes: list[bool | None] = []
    for said in zip(*answers, strict=True):
        if lpb.OutcomeReply.COMMITTED in said:
            outcomes.append(True)
        elif lpb.OutcomeReply.PENDING in said or unknown:
            outcomes.append(None)
        else:
            outcomes.append(False)
    return outcomes


async def read_view(
    manager: TransactionManager, request: lpb.LeaderViewRequest
) -> lpb.LeaderViewReply:
    """At the leader: a cumulus view read a follower forwarded (never forwarded again)."""
    view, conditions, keep, tentative = leader_views.read_of(request)
    rows, ts, tentative = await manager.views.query(
        view, conditions, keep, tentative=tentative, forward=False
    )
    return leader_views.reply(rows, ts, tentative)


async def majority_before_records(
    config: CoordinatorConfig, reach: Reachability, prober: Prober
) -> None:
    """A replicated follower starting waits until it hears a majority before it reads or
    writes its records: serving its partitions rewrites their copies as out of sync, and it
    takes its decision log back. A deposed leader restarts while still cut off; doing that
    then kept the majority from failing its partitions and log over until the cut healed
    (and records read before the wait would be stale after it). The member the record names
    leader does not wait (the followers wait for it to listen), nor one told to take the
    lead."""
    if config.take_lead:
        return
    store = open_store(config.store_url)
    try:
        known = leadership.META_TABLE in await asyncio.to_thread(store.list_tables)
        led_by = (await asyncio.to_thread(leadership.read, store)).member if known else None
    finally:
        store.close()
    if led_by is None or led_by == config.member:
        return  # a new cluster (no records yet), or this member leads
    prober.start()

    def told() -> None:
        log.warning(
            "member %d hears no majority of the %d members (only %s): it waits for one "
            "before it serves its partitions or touches their records",
            config.member,
            len(config.members),
            sorted(reach.reachable()),
        )

    await majority_heard(reach, told)


def member_silent(manager: TransactionManager, member: int) -> None:
    """``member`` fell silent to this member's prober (``coordinator.quorum``): the streams to
    it (its partitions', the clock's if it leads) fail now, as unavailable, rather than when
    TCP gives up seconds later, and calls to it fail at once until it answers again. The
    trace of a cut showed prepares to a cut follower's partition held until its stream's TCP
    timeout (+4.3 s) and a follower's clock stream to a cut leader until +5.3 s."""
    members = len(manager.members) or 1
    for channel in manager.channels:
        if isinstance(channel, LtmChannel) and channel.owner % members == member:
            channel.owner_silent()
    if isinstance(manager.clock, FollowerClock):
        manager.clock.leader_silent(member)


async def serve(config: CoordinatorConfig, ready: asyncio.Event | None = None) -> None:
    """Runs the coordinator until SIGINT/SIGTERM."""
    reach = Reachability(len(config.members), config.member) if config.replicates else None
    prober = Prober(reach, config.members, config.tls) if reach is not None else None
    if reach is not None and prober is not None:
        await majority_before_records(config, reach, prober)
    manager = build_manager(config, reach)
    if prober is not None:
        prober.on_silent.append(functools.partial(member_silent, manager))
    await _start_manager(manager)
    roles = MemberRoles(
        manager,
        config.addresses(manager.partitions),
        failover_after=config.failover_after,
        tls=config.tls,
        replicates=config.replicates,
        lead=manager.lead,
        prober=prober,
    )
    await roles.start()
    gate = ClientGate(
        tokens=config.tokens,
        secret=config.tls.secret if config.tls is not None else None,
        limits=config.limits,
    )
    server, servicer, clock = _grpc_server(config, manager, gate, reach)
    if config.metrics_port is not None:
        port = manager.metrics.serve(config.host, config.metrics_port)
        # before the line the cluster harness waits for (``aggview.processes.Server``)
        print(f"member {config.member} metrics on http://{config.host}:{port}/metrics", flush=True)
    credentials = config.tls.server_credentials(members_only=False) if config.tls else None
    framed = await _framed_server(config, manager, gate, clock) if config.exchanges else None
    await run_until_signalled(
        server, config.host, config.port, f"member {config.member}", ready, credentials=credentials
    )
    if framed is not None:
        await framed.close()
    await roles.stop()
    await servicer.bulk.leases.close()
    await _stop_manager(manager)


async def _start_manager(manager: TransactionManager) -> None:
    """The member's parts, in the order each needs the one before."""
    await manager.local.start()
    if manager.replication is not None:  # before re-delivery: it may adopt a log to deliver
        await manager.replication.start()
    if isinstance(manager.clock, FollowerClock):
        await manager.clock.start()  # its first answer brings the catalog
    await manager.start()
    for channel in manager.channels:  # before anyone else's message: see Participant.observe
        if isinstance(channel, LocalLtm):
            channel.participant.observe(*manager._watermarks())


def _grpc_server(
    config: CoordinatorConfig,
    manager: TransactionManager,
    gate: ClientGate,
    reach: Reachability | None,
) -> tuple[grpc.aio.Server, AggviewServicer, ClockServicer | None]:
    """The member's gRPC server with its services: clients', outcome questions, and with
    other members the partitions' and (where a member may lead) the clock's."""
    server = grpc.aio.server(
        interceptors=[gate],
        options=[  # first: gRPC takes the first of two values of one option
            ("grpc.max_receive_message_length", config.limits.max_request_bytes),
            *GRPC_OPTIONS,
            *SERVER_OPTIONS,
        ],
    )
    servicer = AggviewServicer(manager, config.store_url)
    add_service(server, cpb.DESCRIPTOR.services_by_name["Aggview"], servicer)
    add_service(
        server, lpb.DESCRIPTOR.services_by_name["TransactionOutcome"], OutcomeServicer(manager)
    )
    clock: ClockServicer | None = None
    services = [
        cpb.DESCRIPTOR.services_by_name["Aggview"],
        lpb.DESCRIPTOR.services_by_name["TransactionOutcome"],
    ]
    if config.members:  # other members' streams to our partitions
        add_service(
            server,
            lpb.DESCRIPTOR.services_by_name["Ltm"],
            MemberLtmServicer(manager.local, manager, manager.replication, reach),
        )
        services.append(lpb.DESCRIPTOR.services_by_name["Ltm"])
        if manager.leader is None or config.replicates:  # a follower may take the lead
            clock = ClockServicer(lambda: manager.clock, functools.partial(read_view, manager))
            add_service(server, lpb.DESCRIPTOR.services_by_name["Clock"], clock)
            services.append(lpb.DESCRIPTOR.services_by_name["Clock"])
    add_health(server)
    add_reflection(server, [service.full_name for service in services])
    return server, servicer, clock


async def _framed_server(
    config: CoordinatorConfig,
    manager: TransactionManager,
    gate: ClientGate,
    clock: ClockServicer | None,
) -> FramedServer:
    """Other members' streams to our partitions on framed TCP, with the followers' clock
    streams and clients' transactions."""
    streams = {}
    if clock is not None:
        streams["clock"] = lambda hello: clock.framed()
    if manager.transact_addresses:  # see build_manager
        streams["transact"] = functools.partial(framed_transactions, manager, gate)
    welcome = framed_exchange(
        manager.local.participant,
        config.tls.secret if config.tls else None,
        streams,
        client_streams=frozenset({"transact"}),
    )
    return await FramedServer(welcome, config.tls.frames_server_ssl if config.tls else None).start(
        config.host, config.exchange_port
    )


async def _stop_manager(manager: TransactionManager) -> None:
    for channel in manager.channels:
        log.info(
            "LTM %d: %d decisions in %d calls",
            channel.index,
            channel.decisions.items,
            channel.decisions.calls,
        )
    await manager.views.stop()
    await manager.close()
    if isinstance(manager.clock, FollowerClock):
        await manager.clock.close()
    if manager.replication is not None:
        await manager.replication.stop()
    await manager.local.stop()
    await manager.decisions.close()
    manager.catalog.store.close()
    manager.metrics.close()
