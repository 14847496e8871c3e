"""Aggregate views on the coordinator: DDL, maintenance inside transactions, refreshes, reads.

- **sync** (Algorithm 5.1, §5.3.1): after the votes, the row images give ΔB; ΔV is computed with
  reads at the transaction's own timestamp and added as MERGE sub-transactions on the view rows,
  committed atomically with the base rows (and the secondary-index entries the joins need).
- **async** (Algorithm 5.2): the LTMs append each change to a change table of the view, beside
  the base row; a refresher runs one transaction every ``interval_ms`` that drains the change
  rows below its timestamp, computes ΔV against the tables at that timestamp and merges it.
- **initialization** over existing rows: changes are captured from the moment the view is
  declared; the view is computed from a snapshot, then the captured changes after the snapshot
  are drained, then the view goes live. Writers never stop.

View rows are keyed by the GROUP BY values; their state merges commutatively (``aggview.merge``),
so concurrent writers to one group never wait for each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggview import errors, failpoints
from aggview.keycodec import encode_key, encoded_width, prefix_end
from aggview.merge import combine, gather, negate
from aggview.partition_map import changes_table, index_table, partial_key, partition_of
from aggview.rowcodec import decode_row, encode_row
from aggview.schema import Column, TableSchema, to_storage
from aggview.security import TlsDir
from aggview.wire import ltm_pb2 as lpb
from coordinator import view_query
from coordinator.catalog import Catalog
from coordinator.cumulus_hosts import start_runtime
from coordinator.cumulus_view import CumulusView
from coordinator.leader_views import LeaderReads
from coordinator.transactions import Transaction, TransactionManager
from coordinator.view_query import Condition, counted_rows
from cumulus.aggstate import NO_GROUP_KEY, Row, ViewState
from cumulus.compiler import (
    AlterView,
    CreateView,
    DropView,
    altered_plan,
    compile_view,
    parse_view_statement,
)
from cumulus.delta import Changes, from_scratch, view_delta
from cumulus.plan import ViewPlan

log = logging.getLogger(__name__)
META_KEY = b"\x01"  # the one row of a view's meta table
SWITCH_WAIT_S = 30.0  # how long a read waits for a view to finish switching to sync


@dataclass
class View:
    plan: ViewPlan
    number: int
    # "initializing": its rows are being computed, changes are captured, reads are refused;
    # "draining" (sync views only, briefly): transactions already maintain it and the changes
    # captured during initialization are applied once, reads still refused; "live": readable.
    # Only "initializing" and "live" are persisted ("draining" restarts as "initializing").
    state: str
    snapshot: int = 0  # changes at or below this are in the initial computation
    compiled: ViewState | None = field(default=None, repr=False)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    refresher: asyncio.Task[None] | None = field(default=None, repr=False)
    external: ExternalInit | None = field(default=None, repr=False)
    # Kept as partial rows, one per partition that changed a group (see DECISIONS, Views);
    # views created before partial rows keep one row per group.
    partials: bool = False
    # ALTER ... SET (refresh = ...) is under way: no member refreshes it (in every member's
    # configuration: a refresh elsewhere could drain changes a new runtime needs)
    switching: bool = False
    # a sync view switching to cumulus captures its changes too (in every member's
    # configuration): the runtime loads a snapshot taken after capture started
    also_captures: bool = False

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def view_id(self) -> str:
        return f"{'u' if self.partials else 'v'}{self.number}_{self.name}"

    def merge(self, key: bytes, delta: Row, home: int) -> lpb.RowOp:
        """The operation adding ``delta`` to group ``key``: with partial rows, to the group's
        row on partition ``home`` (one the transaction writes anyway, so the view adds no
        participant; any other when none is)."""
        if self.partials:
            key = partial_key(key, home)
        return lpb.RowOp(
            kind=lpb.RowOp.MERGE, table=self.view_id, key=key, values=encode_row(delta)
        )

    def groups(self, rows: Iterable[tuple[bytes, bytes]]) -> dict[bytes, Row]:
        """Each group's state from the view's stored rows."""
        return gather(((key, decode_row(data) or {}) for key, data in rows), self.partials)

    @property
    def meta_id(self) -> str:
        return f"w{self.number}_{self.name}"

    def changes_id(self, table: TableSchema) -> str:
        return changes_table(self.number, table.table_id)

    @property
    def captures(self) -> bool:
        return self.plan.mode != "sync" or self.state == "initializing" or self.also_captures

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(),
            "number": self.number,
            "state": self.state,
            "snapshot": self.snapshot,
            "partials": self.partials,
        }

    def configured(self) -> dict[str, Any]:
        """What a member runs under: what is persisted, and the switch's flags."""
        return {**self.to_json(), "switching": self.switching, "also_captures": self.also_captures}


@dataclass
class ExternalInit:
    """A view being computed outside the coordinator (a Spark job) over a held snapshot."""

    snapshot: int
    created: bool  # a new view (forgotten if the job fails) or an existing one recomputed


class ViewManager:
    def __init__(
        self,
        manager: TransactionManager,
        runtime_dir: Path | None = None,
        tls: TlsDir | None = None,
    ) -> None:
        """``runtime_dir``: where cumulus views hosted in processes keep their nodes' files;
        ``tls``: how those nodes are reached."""
        self.manager = manager
        self.runtime_dir = runtime_dir
        self.tls = tls
        self.leader_reads = LeaderReads(tls)  # a follower's cumulus view reads
        self._runtimes_started = itertools.count()
        self.catalog: Catalog = manager.catalog
        self.views: dict[str, View] = {}
        self.indexes: dict[tuple[str, str], str] = {}  # (table, column) -> index table id
        self._ddl = asyncio.Lock()
        manager.extensions.append(self._maintain)
        manager.decorators.append(self._capture)
        manager.watched = self._watches
        manager.lookup_tables = self._lookup_tables
        manager.views = self
        self._watched: tuple[int, set[str]] = (-1, set())
        # cumulus views' runtimes, at member 0 (or the one coordinator) only: in memory, so
        # loaded again from a snapshot after a restart (``_load_runtime``)
        self.runtimes: dict[str, CumulusView] = {}
        self.follow_clock()

    def follow_clock(self) -> None:
        """The leader runs a dead member's share of refreshers (its clock says who)."""
        if hasattr(self.manager.clock, "lost_changed"):
            self.manager.clock.lost_changed = self._reconcile_refreshers

    # ------------------------------------------------------------------ start, stop

    async def start(self) -> None:
        for entry in self.catalog.entries("index"):
            self.indexes[(entry["table"], entry["column"])] = entry["index_id"]
        for entry in self.catalog.entries("view"):
            view = View(
                ViewPlan.from_json(entry["plan"]),
                entry["number"],
                entry["state"],
                partials=entry.get("partials", False),
            )
            view.snapshot = entry["snapshot"]
            self._register(view)
        self.publish()  # what other members run under, tables included
        for view in list(self.views.values()):
            if view.state != "live":  # the coordinator stopped while initializing it
                asyncio.get_running_loop().create_task(self._initialize(view, fresh=False))
            elif view.plan.mode == "cumulus" and self.manager.leader is None:
                asyncio.get_running_loop().create_task(self._reload_runtime(view))
            else:
                self._reconcile_refresher(view)

    async def lead(self) -> None:
        """This member took the lead from a dead one (``coordinator.leadership``). The
        catalog is the store's (the dead leader wrote every change there before publishing
        it); then as at a leader's start: cumulus runtimes load again from a snapshot, an
        initialization cut short starts over, and refreshers are shared out again."""
        here = [v.refresher for v in self.views.values() if v.refresher is not None]
        for refresher in here:
            refresher.cancel()
        await asyncio.gather(*here, return_exceptions=True)
        self.views, self.indexes = {}, {}
        self.catalog.reload()
        self.catalog.view_names.clear()
        await self.start()

    def _reconcile_refreshers(self) -> None:
        for view in list(self.views.values()):
            if view.state == "live":
                self._reconcile_refresher(view)

    def _reconcile_refresher(self, view: View) -> None:
        """Runs ``view``'s refresher here exactly when it is a live async view whose turn is
        here: refreshers are spread over the coordinating members, view number n at member
        n % P (member 0 alone when there are none), and the leader runs a dead member's share
        until it is back (two refreshes of one view at once are ordered by timestamp)."""
        if view.plan.mode == "cumulus":  # its runtime is at the leader
            here = view.name in self.runtimes
        else:
            home = view.number % (len(self.manager.members) or 1)
            lost = getattr(self.manager.clock, "lost", ())
            here = home == self.manager.member or (self.manager.leader is None and home in lost)
        wanted = view.state == "live" and view.plan.mode != "sync" and here and not view.switching
        running = view.refresher is not None and not view.refresher.done()
        if wanted and not running:
            self._start_refresher(view)
        elif running and not wanted:
            assert view.refresher is not None
            view.refresher.cancel()
            view.refresher = None

    async def stop(self) -> None:
        for view in self.views.values():
            if view.refresher is not None:
                view.refresher.cancel()
        await asyncio.gather(
            *(v.refresher for v in self.views.values() if v.refresher), return_exceptions=True
        )
        runtimes, self.runtimes = list(self.runtimes.values()), {}
        await asyncio.gather(*(asyncio.to_thread(r.close) for r in runtimes))
        await self.leader_reads.close()

    def _register(self, view: View) -> None:
        view.compiled = ViewState(view.plan, self.catalog.table)
        self.views[view.name] = view
        self.catalog.view_names.add(view.name)
        self.publish()

    def publish(self) -> None:
        """A new catalog epoch: every transaction timestamped from now on runs under the
        tables, views and indexes as they are at this moment (other members get this very
        configuration with their next timestamps)."""
        self.manager.bump_epoch(self.configuration())

    def configuration(self) -> dict[str, Any]:
        """What a member needs to run transactions: tables, indexes, views and their state."""
        return {
            "tables": [schema.to_json() for schema in self.catalog.tables.values()],
            "indexes": [
                {"table": t, "column": c, "index_id": i} for (t, c), i in self.indexes.items()
            ],
            "views": [v.configured() for v in self.views.values()],
        }

    def install(self, epoch: int, configuration: dict[str, Any]) -> None:
        """A follower member takes the leader's configuration of ``epoch``."""
        catalog = self.catalog
        schemas = [TableSchema.from_json(t) for t in configuration["tables"]]
        catalog.tables = {s.name: s for s in schemas}
        catalog.by_id = {s.table_id: s for s in schemas}
        self.indexes = {(e["table"], e["column"]): e["index_id"] for e in configuration["indexes"]}
        views = {}
        for entry in configuration["views"]:
            view = View(
                ViewPlan.from_json(entry["plan"]),
                entry["number"],
                entry["state"],
                partials=entry["partials"],
                snapshot=entry.get("snapshot", 0),
                switching=entry.get("switching", False),
                also_captures=entry.get("also_captures", False),
            )
            view.compiled = ViewState(view.plan, catalog.table)
            before = self.views.get(view.name)
            if before is not None and before.number == view.number:
                view.lock, view.refresher = before.lock, before.refresher  # the same view
            views[view.name] = view
        for name, before in self.views.items():  # dropped, or now refreshed elsewhere
            if before.refresher is not None and (
                name not in views or views[name].refresher is not before.refresher
            ):
                before.refresher.cancel()
        self.views = views
        catalog.view_names = set(views)
        self.manager.epoch = epoch
        for view in views.values():  # this member's share of the async views' refreshes
            self._reconcile_refresher(view)

    def _persist(self, view: View) -> None:
        self.catalog.put_entry("view", view.name, view.to_json())

    # ------------------------------------------------------------------ DDL

    def handles(self, sql: str) -> Any:
        return parse_view_statement(sql)

    async def execute(self, statement: Any) -> str:
        self.manager.at_leader("CREATE, ALTER and DROP MATERIALIZED VIEW")
        async with self._ddl:
            if isinstance(statement, CreateView):
                return await self._create(statement)
            if isinstance(statement, DropView):
                return await self._drop(statement)
            if isinstance(statement, AlterView):
                return await self._alter(statement)
        raise errors.InvalidArgument("unsupported view statement")

    async def _create(self, create: CreateView) -> str:
        if create.name in self.views and create.if_not_exists:
            return f"materialized view {create.name} already exists"
        view, new_indexes = self._declare(create)
        try:
            await self._initialize(view, fresh=True, new_indexes=new_indexes)
        except BaseException:
            await self._forget(view)
            raise
        return f"created materialized view {view.name} ({view.plan.mode})"

    def _declare(self, create: CreateView) -> tuple[View, list[tuple[str, str]]]:
        """Registers a new view, initializing: from here on every commit captures its changes."""
        if create.name in self.views:
            raise errors.AlreadyExists(f"materialized view {create.name} already exists")
        if create.name in self.catalog.tables:
            raise errors.AlreadyExists(f"{create.name} is already the name of a table")
        if len(self.views) >= self.manager.limits.max_views:
            raise errors.LimitExceeded(
                f"{len(self.views)} materialized views exist; the limit is "
                f"{self.manager.limits.max_views} (max_views)"
            )
        plan = compile_view(create, self.catalog.table)
        view = View(plan, self.catalog.next_number(), "initializing", partials=True)
        store = self.catalog.store
        for table_id in (view.view_id, view.meta_id, *self._changes_ids(view)):
            store.create_table(table_id)
        # Writers pay for an index in every transaction; only sync views need the lookups
        # inside writing transactions. An async refresh scans instead (see _rows_where).
        new_indexes = self._declare_indexes(plan) if plan.mode == "sync" else []
        self._persist(view)
        self._register(view)
        return view, new_indexes

    # ------------------------------------------------------------------ external initialization

    async def begin_external(self, sql: str, name: str) -> View:
        """Declares a view (``sql``) or puts an existing one (``name``) back to initializing,
        for a job outside the coordinator to compute at a snapshot taken right after: every
        transaction after it is captured, every one before it is in the snapshot."""
        self.manager.at_leader("a view's initialization")
        async with self._ddl:
            if sql:
                statement = parse_view_statement(sql)
                if not isinstance(statement, CreateView):
                    raise errors.InvalidArgument(
                        "expected CREATE MATERIALIZED VIEW ... to initialize a new view"
                    )
                view, new_indexes = self._declare(statement)
                created = True
                try:
                    for table, column in new_indexes:
                        await self._backfill_index(table, column)
                except BaseException:
                    await self._forget(view)
                    raise
            else:
                view = self.views.get(name)
                if view is None:
                    raise errors.UnknownTable(f"unknown materialized view {name!r}")
                if view.plan.mode == "cumulus":
                    raise errors.FailedPrecondition(
                        f"materialized view {name} is maintained by Cumulus: its runtime loads "
                        "again from a snapshot itself (a Spark job initializes a new one only)"
                    )
                if view.state != "live" or view.external is not None:
                    raise errors.FailedPrecondition(
                        f"materialized view {name} is already being initialized"
                    )
                async with view.lock:  # no refresh half-way through
                    view.state = "initializing"
                    self.publish()
                    self._persist(view)
                created = False
            view.external = ExternalInit(snapshot=0, created=created)
            return view

    async def finish_external(
        self,
        name: str,
        snapshot: int,
        groups: dict[bytes, Row],
        maps: dict[str, dict[Any, Any]] | None = None,
    ) -> int:
        """Installs the groups computed at ``snapshot`` (a cumulus view: its program's
        ``maps``), then drains what was captured after it and makes the view live; returns
        the timestamp the rows were written at."""
        self.manager.at_leader("a view's initialization")
        view = self._external(name)
        if snapshot != view.external.snapshot:  # type: ignore[union-attr]
            raise errors.InvalidArgument(
                f"materialized view {name} is being computed at snapshot "
                f"{view.external.snapshot}, not {snapshot}"  # type: ignore[union-attr]
            )
        async with self._ddl:
            external, view.external = view.external, None
            assert external is not None
            try:
                return await self._initialize(
                    view, fresh=True, computed=(snapshot, groups), maps=maps
                )
            except BaseException:
                # a cumulus view installs nothing before its runtime holds every map: a new
                # one stays new (an abort forgets it)
                created = external.created and view.plan.mode == "cumulus"
                view.external = ExternalInit(snapshot, created=created)
                raise

    async def abort_external(self, name: str) -> None:
        """The job failed: a new view is forgotten; an existing one goes live again on the
        rows it had, once the changes captured meanwhile are drained into it."""
        self.manager.at_leader("a view's initialization")
        view = self._external(name)
        async with self._ddl:
            external, view.external = view.external, None
            assert external is not None
            if external.created:
                await self._forget(view)
            else:
                await self._go_live(view)

    def _external(self, name: str) -> View:
        view = self.views.get(name)
        if view is None or view.external is None:
            raise errors.FailedPrecondition(f"materialized view {name!r} is not being initialized")
        return view

    def _changes_ids(self, view: View) -> list[str]:
        return [view.changes_id(self.catalog.table(t)) for t in view.plan.base_tables()]

    def _declare_indexes(self, plan: ViewPlan) -> list[tuple[str, str]]:
        """A secondary index for every join column that is not the first key column."""
        created = []
        for table, column in plan.join_columns():
            schema = self.catalog.table(table)
            if column == schema.primary_key[0] or (table, column) in self.indexes:
                continue
            width = encoded_width(schema.column(column).type)
            index_id = index_table(self.catalog.next_number(), width, schema.table_id)
            self.catalog.store.create_table(index_id)
            self.catalog.put_entry(
                "index",
                f"{table}.{column}",
                {"table": table, "column": column, "index_id": index_id},
            )
            self.indexes[(table, column)] = index_id
            created.append((table, column))
        if created:
            self.publish()
        return created

    async def _drop(self, drop: DropView) -> str:
        view = self.views.get(drop.name)
        if view is None:
            if drop.if_exists:
                return f"no materialized view {drop.name}"
            raise errors.UnknownTable(f"unknown materialized view {drop.name!r}")
        await self._forget(view)
        return f"dropped materialized view {drop.name}"

    async def _forget(self, view: View) -> None:
        await self._stop_refresher(view)
        self.views.pop(view.name, None)
        self._retire(view.name)
        self.catalog.view_names.discard(view.name)
        self.catalog.put_entry("view", view.name, None)
        self.publish()
        unused = self._unused_indexes()
        for key in unused:  # writers stop maintaining them from the next transaction on
            del self.indexes[key]
            self.catalog.put_entry("index", f"{key[0]}.{key[1]}", None)
        if unused:
            self.publish()
        for table_id in (
            view.view_id,
            view.meta_id,
            *self._changes_ids(view),
            *unused.values(),
        ):
            with contextlib.suppress(errors.AggviewError):
                await self.manager.drop_table(table_id)
            self.catalog.store.drop_table(table_id)

    def _unused_indexes(self) -> dict[tuple[str, str], str]:
        """Indexes no sync view joins through any more (they cost every writer)."""
        needed = {
            pair
            for view in self.views.values()
            if view.plan.mode == "sync"
            for pair in view.plan.join_columns()
        }
        return {key: index for key, index in self.indexes.items() if key not in needed}

    async def _alter(self, alter: AlterView) -> str:
        """New options for a live view; a new mode takes over without losing or counting
        twice a change (see DECISIONS, "Switching a view's mode")."""
        view = self.views.get(alter.name)
        if view is None:
            raise errors.UnknownTable(f"unknown materialized view {alter.name!r}")
        if view.state != "live":
            raise errors.FailedPrecondition(f"materialized view {view.name} is still initializing")
        plan = altered_plan(view.plan, alter)
        if plan == view.plan:
            return f"materialized view {view.name} is already {_describe(plan)}"
        old, old_snapshot = view.plan, view.snapshot
        view.switching = True
        try:
            self.publish()  # every member stops refreshing it (one granted already is older)
            await self._stop_refresher(view)
            async with view.lock:  # a refresh or epoch asked for before the ALTER ends first
                pass
            same_runtime = (old.nodes, old.speculation, old.host) == (
                plan.nodes,
                plan.speculation,
                plan.host,
            )
            if old.mode == plan.mode and (plan.mode == "async" or same_runtime):
                self._replan(view, plan)  # a new interval, or epoch: the refresher restarts
            elif plan.mode == "cumulus":
                await self._switch_to_cumulus(view, plan)
            elif old.mode == "cumulus":
                await self._switch_from_cumulus(view, plan)
            elif plan.mode == "sync":
                await self._switch_to_sync(view, plan)
            else:
                self._switch_to_async(view, plan)
        except BaseException:
            if view.state == "draining":  # maintained already: the drain must finish
                asyncio.get_running_loop().create_task(self._finish_draining(view))
            elif old.mode == "cumulus" and view.plan.mode != "cumulus":
                self._replan(view, old)  # the runtime goes on from where it was
                view.state, view.snapshot = "live", old_snapshot
            raise
        finally:
            view.switching = view.also_captures = False
            if self.views.get(view.name) is view:
                self.publish()
                self._persist(view)
                self._reconcile_refresher(view)
        return f"materialized view {view.name} is now {_describe(view.plan)}"

    async def _stop_refresher(self, view: View) -> None:
        if view.refresher is not None:
            view.refresher.cancel()
            with contextlib.suppress(BaseException):
                await view.refresher
            view.refresher = None

    def _switch_to_async(self, view: View, plan: ViewPlan) -> None:
        """sync -> async: every timestamp granted so far runs under the sync catalog (a
        client's transaction commits only under its timestamp's catalog), every later one
        captures instead; so once the earlier ones are decided the rows are the view at the
        last of them, and refreshes drain the captured changes from there."""
        cut = self.manager.clock.issued()
        self._replan(view, plan)
        view.snapshot = cut
        self.publish()

    async def _switch_to_sync(self, view: View, plan: ViewPlan) -> None:
        """async -> sync: the indexes sync maintenance joins through (maintained from the
        next transaction on, backfilled), then the path a new sync view takes: maintained
        from the next transaction on, and the changes captured until then drained once
        (reads wait for that refresh)."""
        for table, column in self._declare_indexes(plan):
            await self._backfill_index(table, column)
        self._replan(view, plan)
        view.state = "initializing"  # persisted so: a crash before the drain starts over
        await self._go_live(view)

    async def _finish_draining(self, view: View) -> None:
        """A switch to sync failed in its drain: drains again until it is done."""
        while self.views.get(view.name) is view and view.state == "draining":
            await asyncio.sleep(1.0)
            try:
                async with view.lock:
                    await self._refresh(view)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("draining %s failed: %s; retrying", view.name, exc)
                continue
            self._live(view)

    async def _switch_to_cumulus(self, view: View, plan: ViewPlan) -> None:
        """To cumulus (or to a runtime on other nodes or in the other mode): the runtime
        loads a snapshot taken once every later change is captured; the old mode serves
        reads until it takes over, and the changes captured after the snapshot are its
        first epoch's."""
        if view.plan.mode == "sync":
            view.also_captures = True
            self.publish()
        async with self.manager.snapshot() as ts:
            runtime = await self._runtime_at(view, plan, ts)
        self._replan(view, plan)
        view.snapshot, view.also_captures = ts, False
        self._retire(view.name)  # the runtime it had (other nodes or mode)
        self.runtimes[view.name] = runtime

    async def _switch_from_cumulus(self, view: View, plan: ViewPlan) -> None:
        """cumulus -> sync or async: the view's rows are computed again from a snapshot, as
        a new view's (the runtime's maps are not rows of that form); the runtime serves reads
        until they are live."""
        new_indexes = self._declare_indexes(plan) if plan.mode == "sync" else []
        self._replan(view, plan)
        view.state = "initializing"
        self._persist(view)
        self.publish()
        await self._initialize(view, fresh=False, new_indexes=new_indexes)
        self._retire(view.name)

    def _replan(self, view: View, plan: ViewPlan) -> None:
        view.plan = plan
        view.compiled = ViewState(plan, self.catalog.table)

    def views_on(self, table: str) -> list[str]:
        return [v.name for v in self.views.values() if table in v.plan.base_tables()]

    # ------------------------------------------------------------------ initialization

    async def _initialize(
        self,
        view: View,
        *,
        fresh: bool,
        new_indexes: list[tuple[str, str]] | None = None,
        computed: tuple[int, dict[bytes, Row]] | None = None,
        maps: dict[str, dict[Any, Any]] | None = None,
    ) -> int:
        """Computes the view from a snapshot while writers go on (or installs groups computed
        elsewhere at ``computed``'s snapshot; a cumulus view's ``maps``), then makes it live."""
        if view.plan.mode == "cumulus":
            at = None if computed is None else (computed[0], maps or {})
            written = await self._load_runtime(view, at)
            await self._go_live(view)
            return written
        if computed is None:
            if not fresh:  # a restart mid-way: start over from an empty view
                await self._clear(view)
            for table, column in new_indexes if new_indexes is not None else list(self.indexes):
                await self._backfill_index(table, column)
        assert view.compiled is not None
        view_state = view.compiled

        async def initial(ts: int) -> list[lpb.RowOp]:
            if computed is not None:
                view.snapshot, groups = computed
                # The view may hold rows (a recomputation): move each group to its new state.
                old = await self.manager.read_range_at(view.view_id, b"", b"", ts, own=True)
                deltas = dict(groups)
                for key, state in view.groups(old).items():
                    deltas[key] = combine(deltas.get(key, {}), negate(state))
                refreshed_at = view.snapshot
            else:
                deltas = await from_scratch(view_state, await self._read_tables(view, ts))
                view.snapshot = refreshed_at = ts
            return [view.merge(key, d, self._home(key)) for key, d in deltas.items()] + [
                _meta(view, refreshed_at=refreshed_at)
            ]

        written = await self.manager.system_transaction(initial)
        await self._go_live(view)
        return written

    async def _go_live(self, view: View) -> None:
        """Ends initialization: for a sync view, maintenance takes over from the next
        transaction on and the changes captured until then are drained once."""
        self._persist(view)
        if view.plan.mode == "sync":
            # From the next transaction on, maintenance is synchronous; then the changes
            # captured since the snapshot are drained once and capture stops.
            view.state = "draining"
            self.publish()
            async with view.lock:
                await self._refresh(view)
        self._live(view)

    def _live(self, view: View) -> None:
        view.state = "live"
        self.publish()
        self._persist(view)
        self._reconcile_refresher(view)

    async def _clear(self, view: View) -> None:
        async def erase(ts: int) -> list[lpb.RowOp]:
            rows = await self.manager.read_range_at(view.view_id, b"", b"", ts, own=True)
            return [lpb.RowOp(kind=lpb.RowOp.PUT, table=view.view_id, key=k) for k, _ in rows]

        await self.manager.system_transaction(erase)

    async def _backfill_index(self, table: str, column: str) -> None:
        """Index entries for the rows a table held before the index was maintained."""
        schema = self.catalog.table(table)

        async def build(ts: int) -> AsyncIterator[list[lpb.RowOp]]:
            # Every older transaction is decided, so the pages read at ts stay what they are.
            async for page in self.manager.read_pages(schema.table_id, b"", b"", ts):
                ops = []
                for key, data in page:
                    value = (decode_row(data) or {}).get(column)
                    op = self._index_op(schema, column, key, value)
                    if op is not None:  # a younger writer's own index entry wins
                        op.kind = lpb.RowOp.BACKFILL
                        ops.append(op)
                if ops:
                    yield ops

        await self.manager.bulk_system_transaction(build)

    # ------------------------------------------------------------------ maintenance

    def _watches(self, table_id: str) -> bool:
        """Whether writes to a store table need row images: it has an index, or a sync view
        maintained in the transaction uses it."""
        epoch, ids = self._watched
        if epoch != self.manager.epoch:
            names = {table for table, _ in self.indexes}
            for view in self.views.values():
                if view.plan.mode == "sync" and view.state != "initializing":
                    names.update(view.plan.base_tables())
            ids = {self.catalog.tables[n].table_id for n in names if n in self.catalog.tables}
            self._watched = (self.manager.epoch, ids)
        return table_id in ids

    def _lookup_tables(self) -> set[str]:
        """Tables that view maintenance joins on their whole primary key (dimension rows,
        looked up by key in every writing transaction of a sync view and in every refresh of
        an async one): the coordinator caches them."""
        ids = set()
        for view in self.views.values():
            if view.state == "initializing":
                continue
            for table, column in view.plan.join_columns():
                schema = self.catalog.table(table)
                if schema.primary_key == (column,):
                    ids.add(schema.table_id)
        return ids

    def _capture(self, ops: list[lpb.RowOp]) -> None:
        """Asks the LTMs to append change rows for views that are async or initializing."""
        capturing = [v for v in self.views.values() if v.captures]
        if not capturing:
            return
        for op in ops:
            schema = self.catalog.by_id.get(op.table)
            if schema is None:
                continue
            for view in capturing:
                if schema.name in view.plan.base_tables():
                    op.changes_tables.append(view.changes_id(schema))

    async def _maintain(self, tx: Transaction, images: list[lpb.RowImage]) -> list[lpb.RowOp]:
        """The extension of §5.3.1: index entries and sync view deltas for a round's images."""
        changes: Changes = {}
        for image in images:
            schema = self.catalog.by_id.get(image.table)
            if schema is not None:
                changes.setdefault(schema.name, {})[image.key] = (
                    decode_row(image.before),
                    decode_row(image.after),
                )
        if not changes:
            return []
        if tx.epoch != self.manager.epoch:
            raise errors.TooLate("views or indexes changed during the transaction; retry it")
        # partial view rows go with the first changed row: no participant added
        home = partition_of(images[0].table, images[0].key, self.manager.partitions)
        ops: list[lpb.RowOp] = []
        for table, rows in changes.items():
            schema = self.catalog.table(table)
            for (indexed_table, column), _ in self.indexes.items():
                if indexed_table != table:
                    continue
                for key, (before, after) in rows.items():
                    old = before.get(column) if before else None
                    new = after.get(column) if after else None
                    if old == new:
                        continue
                    if old is not None:
                        ops.append(self._index_op(schema, column, key, old, erase=True))
                    if new is not None:
                        ops.append(self._index_op(schema, column, key, new))
        for view in self.views.values():
            if view.plan.mode != "sync" or view.state == "initializing":
                continue
            relevant = touching(view.plan, changes)
            if not relevant:
                continue
            assert view.compiled is not None
            started = time.perf_counter()
            delta = await view_delta(view.compiled, relevant, self._rows_where(tx.ts))
            self.manager.metrics.maintained(view.name, time.perf_counter() - started)
            ops.extend(view.merge(key, d, home) for key, d in delta.items())
        return [op for op in ops if op is not None]

    def _home(self, group_key: bytes) -> int:
        """Where a group's partial row goes when no partition is better than another."""
        return zlib.crc32(group_key) % self.manager.partitions

    def _index_op(
        self, schema: TableSchema, column: str, key: bytes, value: Any, *, erase: bool = False
    ) -> lpb.RowOp | None:
        if value is None:
            return None
        index_id = self.indexes[(schema.name, column)]
        prefix = encode_key([schema.column(column).type], [value])
        return lpb.RowOp(
            kind=lpb.RowOp.PUT,
            table=index_id,
            key=prefix + key,
            values=b"" if erase else encode_row({}),
        )

    def _rows_where(self, ts: int):  # type: ignore[no-untyped-def]
        """Reads of transaction ``ts`` itself: rows of a table whose column equals one of
        some values, in as few calls as the access path allows."""
        manager = self.manager

        async def rows_where(
            table: str, column: str, values: list[Any]
        ) -> dict[Any, list[tuple[bytes, Row]]]:
            schema = self.catalog.table(table)
            column_type = schema.column(column).type
            prefixes = {encode_key([column_type], [v]): v for v in values}
            if column == schema.primary_key[0] and len(schema.primary_key) == 1:
                found = await manager.lookup_keys_at(schema.table_id, list(prefixes), ts)
                return {prefixes[k]: [(k, decode_row(v) or {})] for k, v in found.items()}
            if column == schema.primary_key[0]:
                table_id, path = schema.table_id, None
            elif (table, column) in self.indexes:
                table_id, path = self.indexes[(table, column)], schema.table_id
            else:  # no index (async views only): one scan of the table for all the values
                # only refreshes get here (system transactions: every older one is decided)
                pages = manager.read_pages(schema.table_id, b"", b"", ts)
                rows = [row async for page in pages for row in page]
                wanted = set(values)
                out: dict[Any, list[tuple[bytes, Row]]] = {}
                for key, data in rows:
                    row = decode_row(data) or {}
                    if row.get(column) in wanted:
                        out.setdefault(row[column], []).append((key, row))
                return out
            ranges = await asyncio.gather(
                *(
                    manager.read_range_at(table_id, p, prefix_end(p) or b"", ts, own=True)
                    for p in prefixes
                )
            )
            out = {}
            if path is None:  # a leading part of the primary key: the rows themselves
                for value, rows in zip(prefixes.values(), ranges, strict=True):
                    out[value] = [(k, decode_row(v) or {}) for k, v in rows]
                return out
            base_keys = {
                entry[len(prefix) :]: value
                for (prefix, value), entries in zip(prefixes.items(), ranges, strict=True)
                for entry, _ in entries
            }
            if base_keys:
                found = await manager.read_keys_at(path, list(base_keys), ts, own=True)
                for key, data in found.items():
                    out.setdefault(base_keys[key], []).append((key, decode_row(data) or {}))
            return out

        return rows_where

    # ------------------------------------------------------------------ async refresh

    def _start_refresher(self, view: View) -> None:
        """Refreshes ``view`` every interval (a cumulus view: an epoch every epoch_ms, and,
        with feed_ms, the changes fed to its runtime every feed_ms between epochs)."""
        plan = view.plan
        epoch = plan.interval_ms / 1000
        tick = (plan.feed_ms or plan.interval_ms) / 1000

        async def loop() -> None:
            last_epoch = time.monotonic()
            while True:
                await asyncio.sleep(tick)
                try:
                    if time.monotonic() - last_epoch < epoch - tick / 2:
                        await self.feed(view.name)
                    else:
                        last_epoch = time.monotonic()
                        await self.refresh(view.name)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # e.g. an LTM down: try again next interval
                    log.warning("refresh of %s failed: %s", view.name, exc)

        view.refresher = asyncio.get_running_loop().create_task(loop())

    async def refresh(self, name: str) -> int:
        """Drains the view's change rows below a new timestamp into the view (Algorithm 5.2),
        or runs a cumulus view's epoch, now."""
        view = self.views.get(name)
        if view is None:
            raise errors.UnknownTable(f"unknown materialized view {name!r}")
        if view.plan.mode == "sync":
            raise errors.InvalidArgument(f"materialized view {name} is sync: always fresh")
        if view.state == "initializing":
            raise errors.FailedPrecondition(f"materialized view {name} is still initializing")
        if view.switching:
            raise errors.FailedPrecondition(
                f"materialized view {name} is switching modes (ALTER ... SET); refresh it after"
            )
        async with view.lock:
            return await self._refresh(view)

    async def feed(self, name: str) -> int:
        """Feeds a cumulus view's runtime the changes committed since the last feed, without
        committing an epoch: its tentative values run ahead."""
        view = self.views.get(name)
        if view is None or view.plan.mode != "cumulus" or view.switching:
            raise errors.FailedPrecondition(f"materialized view {name} takes no feed now")
        async with view.lock:
            return await self._epoch(view, commit=False)

    async def _refresh(self, view: View) -> int:
        """One refresh (the caller holds ``view.lock``). Any member may run it: two at once
        are ordered by their timestamps like any writers of the change rows they drain (the
        younger one's read makes the older one retry)."""
        if view.plan.mode == "cumulus":
            return await self._epoch(view)
        assert view.compiled is not None
        compiled = view.compiled

        async def drain(ts: int) -> list[lpb.RowOp]:
            ops, taken = await self._take_changes(view, ts)
            changes: Changes = {}
            for table, key, before, after in taken:  # key order: base key, then timestamp
                net = changes.setdefault(table, {})
                base_key = key[:-8]
                first = net[base_key][0] if base_key in net else before
                net[base_key] = (first, after)
            delta = await view_delta(compiled, touching(view.plan, changes), self._rows_where(ts))
            ops.extend(view.merge(key, d, self._home(key)) for key, d in delta.items())
            if view.plan.mode == "async":
                ops.append(_meta(view, refreshed_at=ts))
            return ops

        started = time.perf_counter()
        async with failpoints.scope("refresh"):
            ts = await self.manager.system_transaction(drain)
        self.manager.refreshes += 1
        if view.plan.mode == "async":  # not a sync view's catch-up after its initialization
            self.manager.metrics.refreshed(view.name, time.perf_counter() - started)
        return ts

    # ------------------------------------------------------------------ cumulus views

    async def _load_runtime(
        self, view: View, computed: tuple[int, dict[str, dict[Any, Any]]] | None = None
    ) -> int:
        """A cumulus view's runtime from a snapshot of its tables (a first epoch), or from
        its maps computed elsewhere at an older snapshot (``computed``). Captured changes
        after the snapshot are what each later epoch feeds; those at or below it are in."""
        loaded: list[CumulusView] = []

        async def load(ts: int) -> list[lpb.RowOp]:
            if computed is None:
                snapshot, runtime = ts, await self._runtime_at(view, view.plan, ts)
            else:
                snapshot, maps = computed
                runtime = await self._new_runtime(
                    view, view.plan, lambda fresh: fresh.load_maps(maps, snapshot)
                )
            loaded[:] = [runtime]
            view.snapshot = snapshot
            return [_meta(view, refreshed_at=snapshot)]

        written = await self.manager.system_transaction(load)
        self.runtimes[view.name] = loaded[0]
        self._persist(view)
        return written

    async def _runtime_at(self, view: View, plan: ViewPlan, ts: int) -> CumulusView:
        """A runtime for ``plan`` holding the view's tables at ``ts``: every row one insert
        (the maps' definitions over the snapshot)."""
        tables = await self._read_tables(view, ts)
        rows = {table: found.values() for table, found in tables.items()}
        return await self._new_runtime(view, plan, lambda runtime: runtime.load(rows, ts))

    async def _new_runtime(
        self, view: View, plan: ViewPlan, fill: Callable[[CumulusView], None]
    ) -> CumulusView:
        """A runtime for ``plan`` on its host, ``fill``ed (in a worker thread) before any
        update; closed again if that fails."""
        schemas = {t: self.catalog.table(t) for t in plan.base_tables()}
        directory = None
        if self.runtime_dir is not None:
            directory = self.runtime_dir / f"{view.view_id}-{next(self._runtimes_started)}"
        start = functools.partial(start_runtime, plan=plan, directory=directory, tls=self.tls)
        runtime = await asyncio.to_thread(CumulusView, plan, schemas, start)
        try:
            await asyncio.to_thread(fill, runtime)
        except BaseException:
            await asyncio.to_thread(runtime.close)
            raise
        return runtime

    def _retire(self, name: str) -> None:
        """Drops the view's runtime, stopping its nodes in the background."""
        runtime = self.runtimes.pop(name, None)
        if runtime is not None:
            asyncio.get_running_loop().run_in_executor(None, runtime.close)

    async def _reload_runtime(self, view: View) -> None:
        """After a restart: the runtime is in memory only, so it starts over from a new
        snapshot (nothing lost: the change rows after it are still there; nothing twice:
        those at or below it are skipped)."""
        while self._runtime_missing(view):
            try:
                async with view.lock:
                    await self._load_runtime(view)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. an LTM not back yet: try again
                log.warning("loading cumulus view %s failed: %s; retrying", view.name, exc)
                await asyncio.sleep(1.0)
        if view.name in self.views:
            self._reconcile_refresher(view)

    def _runtime_missing(self, view: View) -> bool:
        """A cumulus view (still, and not being switched) whose runtime is not loaded."""
        return (
            self.views.get(view.name) is view
            and view.plan.mode == "cumulus"
            and not view.switching
            and view.name not in self.runtimes
        )

    async def _epoch(self, view: View, *, commit: bool = True) -> int:
        """One epoch of a cumulus view: drains its change rows below a new timestamp (in
        timestamp order), feeds them to the runtime, and commits; reads then see exactly the
        committed transactions up to that timestamp. ``commit=False``: fed only (tentative
        reads see them; the next epoch commits them)."""
        runtime = self.runtimes.get(view.name)
        if runtime is None:
            where = self.manager.leader or "this process"
            raise errors.FailedPrecondition(
                f"materialized view {view.name} is maintained by Cumulus at {where}; its "
                "runtime is not loaded here"
            )
        drained: list[tuple[str, bytes, Row | None, Row | None]] = []

        async def drain(ts: int) -> list[lpb.RowOp]:
            ops, drained[:] = await self._take_changes(view, ts)
            return [*ops, _meta(view, refreshed_at=ts)]

        started = time.perf_counter()
        ts = await self.manager.system_transaction(drain)
        in_order = sorted(drained, key=lambda change: (change[1][-8:], change[1]))
        changes = [(table, before, after) for table, _, before, after in in_order]
        try:
            await asyncio.to_thread(runtime.apply if commit else runtime.feed, changes, ts)
        except Exception:
            # its state is unknown now (a DW node died?): load it again from a snapshot
            log.warning("epoch of cumulus view %s failed; loading it again", view.name)
            self._retire(view.name)
            asyncio.get_running_loop().create_task(self._reload_runtime(view))
            raise
        self.manager.refreshes += 1
        if commit:
            self.manager.metrics.refreshed(view.name, time.perf_counter() - started)
        return ts

    async def _read_runtime(
        self,
        view: View,
        conditions: Sequence[Condition],
        keep: Sequence[str] | None,
        at: int,
        tentative: bool,
        forward: bool,
        counted: bool = False,
    ) -> tuple[list[dict[str, Any]], int, bool]:
        runtime = self.runtimes.get(view.name)
        leader = self.manager.leader
        if runtime is None and leader is not None and forward and not at:
            rows, ts, ahead = await self.leader_reads.read(
                leader, view.name, conditions, keep, tentative
            )
            return (counted_rows(view.plan, rows, keep) if counted else rows), ts, ahead
        if runtime is None:
            where = leader or "this process, once its runtime is loaded again"
            raise errors.FailedPrecondition(
                f"materialized view {view.name} is maintained by Cumulus and read at {where}"
            )
        if at:
            raise errors.FailedPrecondition(
                f"materialized view {view.name} is maintained by Cumulus: it is read at its "
                "last committed epoch, not at a held snapshot"
            )
        if tentative:
            rows, ts = await asyncio.to_thread(runtime.tentative, conditions, keep, counted)
        else:
            rows, ts = runtime.query(conditions, keep, counted)
        assert view.compiled is not None
        if keep is None:  # in key order, as the stored views' rows are
            names = [g.name for g in view.plan.group_by]
            encode = view.compiled.encode_group
            rows.sort(key=lambda row: encode([row[n] for n in names]))
        return rows, ts, tentative

    # ------------------------------------------------------------------ reading base data

    async def _read_tables(self, view: View, ts: int) -> dict[str, dict[bytes, Row]]:
        """The view's tables at ``ts``, paged: every older transaction is decided, so the
        pages stay as read."""
        tables: dict[str, dict[bytes, Row]] = {}
        for table in view.plan.base_tables():
            pages = self.manager.read_pages(self.catalog.table(table).table_id, b"", b"", ts)
            rows = [row async for page in pages for row in page]
            tables[table] = {key: decode_row(data) or {} for key, data in rows}
        return tables

    async def _take_changes(
        self, view: View, ts: int
    ) -> tuple[list[lpb.RowOp], list[tuple[str, bytes, Row | None, Row | None]]]:
        """Inside a drain at ``ts``: the deletes of every change row of the view below it, and
        the changes after its snapshot as (table, change key, before, after), in key order
        per table (base key, then commit timestamp). Those at or below the snapshot are in
        it already (the initial computation, or the runtime's load)."""
        tables = view.plan.base_tables()
        ids = [view.changes_id(self.catalog.table(table)) for table in tables]
        found = await asyncio.gather(
            *(self.manager.read_range_at(i, b"", b"", ts, own=True) for i in ids)
        )
        ops: list[lpb.RowOp] = []
        taken: list[tuple[str, bytes, Row | None, Row | None]] = []
        for table, changes_id, rows in zip(tables, ids, found, strict=True):
            for key, data in rows:
                ops.append(lpb.RowOp(kind=lpb.RowOp.PUT, table=changes_id, key=key))
                if int.from_bytes(key[-8:], "big") > view.snapshot:
                    change = decode_row(data) or {}
                    taken.append((table, key, change.get("b"), change.get("a")))
        return ops, taken

    # ------------------------------------------------------------------ reads

    async def read(
        self,
        name: str,
        where: dict[str, Any],
        at: int = 0,
        *,
        tentative: bool = False,
        counted: bool = False,
    ) -> tuple[list[dict[str, Any]], int, bool]:
        """Rows of a view from one snapshot (now, or ``at``, a held one), the timestamp they
        are consistent at (for an async view: its last refresh), and whether they are a
        cumulus view's tentative values instead. A where on leading GROUP BY columns is a
        lookup. ``counted``: a bag view's rows once each, with their multiplicity."""
        conditions = [Condition(column, "=", value) for column, value in where.items()]
        return await self.query(name, conditions, at=at, tentative=tentative, counted=counted)

    async def query(
        self,
        name: str,
        conditions: Sequence[Condition],
        keep: Sequence[str] | None = None,
        at: int = 0,
        tentative: bool = False,
        forward: bool = True,
        counted: bool = False,
    ) -> tuple[list[dict[str, Any]], int, bool]:
        """The view's groups that meet ``conditions``, rolled up to the group columns ``keep``
        (None: the view's own), from one snapshot (see ``coordinator.view_query``), and the
        timestamp they are exact at; ``tentative``: a cumulus view's newest values instead
        (the last flag says which came; every other view's answer is exact anyway). A
        follower asks the leader for a cumulus view's rows (``forward``: unless the read
        was forwarded to it already)."""
        view = await self._readable(name)
        assert view.compiled is not None
        compiled = view.compiled
        view_query.check(compiled, name, conditions, keep)
        if view.plan.mode == "cumulus" or view.state != "live":  # a runtime serves it
            return await self._read_runtime(view, conditions, keep, at, tentative, forward, counted)
        for condition in conditions:  # type checks, each with a clear error
            group = next((g for g in view.plan.group_by if g.name == condition.column), None)
            if group is None or condition.op == "is null":
                continue
            column = Column(group.name, compiled.group_types[view.plan.group_by.index(group)])
            values = condition.value if condition.op == "in" else [condition.value, condition.high]
            for value in values:
                if value is not None:
                    to_storage(column, value, table=name)
        prefixes = view_query.prefixes(compiled, conditions)
        async with self.manager.snapshot(at) as ts:
            rows = await self._stored_groups(view, prefixes, ts)
            consistent_at = ts
            if view.plan.mode == "async":
                consistent_at = await self._refreshed_at(view, ts)
        groups = view.groups(rows)
        if not view.plan.group_by and not groups:
            groups = {NO_GROUP_KEY: {}}  # SQL: an aggregate without GROUP BY has one row
        rows = view_query.answer(compiled, groups, conditions, keep, counted)
        return rows, consistent_at, False

    async def _readable(self, name: str) -> View:
        """The view, once it can be read: live, or switching from cumulus (its runtime serves
        reads until the rows are computed); a sync view draining what it captured before (a
        new one, or one switching from async) is waited for, one refresh's time."""
        deadline = time.monotonic() + SWITCH_WAIT_S
        while True:
            view = self.views.get(name)
            if view is None:
                raise errors.UnknownTable(f"unknown materialized view {name!r}")
            if view.state == "live" or view.name in self.runtimes:
                return view
            if view.state != "draining" or time.monotonic() > deadline:
                raise errors.FailedPrecondition(f"materialized view {name} is still initializing")
            await asyncio.sleep(0.01)
            if self.manager.leader is not None:
                await self.manager.catch_up()  # a follower learns the state with a timestamp

    async def _stored_groups(
        self, view: View, prefixes: list[list[Any]] | None, ts: int
    ) -> list[tuple[bytes, bytes]]:
        """The view's stored rows under each key prefix (None: all of them)."""
        assert view.compiled is not None
        if prefixes is None:
            return await self.manager.read_range_at(view.view_id, b"", b"", ts)
        whole = [p for p in prefixes if len(p) == len(view.plan.group_by)]
        keys = [view.compiled.encode_group(p) for p in whole]
        if view.partials:
            keys = [partial_key(k, q) for k in keys for q in range(self.manager.partitions)]
        found = await self.manager.read_keys_at(view.view_id, keys, ts) if keys else {}
        rows = list(found.items())
        for prefix in prefixes:
            if len(prefix) < len(view.plan.group_by):
                start = view.compiled.encode_group(prefix)
                stop = prefix_end(start) or b""
                rows += await self.manager.read_range_at(view.view_id, start, stop, ts)
        return rows

    async def refreshed_at(self, view: View) -> int:
        """The timestamp an async view's rows are consistent at now (its last refresh), or a
        cumulus view's last committed epoch (0 where its runtime is not)."""
        if view.plan.mode == "cumulus":
            runtime = self.runtimes.get(view.name)
            return runtime.committed_at if runtime is not None else 0
        async with self.manager.snapshot() as ts:
            return await self._refreshed_at(view, ts)

    async def _refreshed_at(self, view: View, ts: int) -> int:
        """Its last refresh, or, before the first one after a switch from sync, the
        timestamp the switch cut its history at."""
        meta = await self.manager.read_keys_at(view.meta_id, [META_KEY], ts)
        refreshed = (decode_row(meta.get(META_KEY, b"")) or {}).get("refreshed_at", 0)
        return max(refreshed, view.snapshot)


def touching(plan: ViewPlan, changes: Changes) -> Changes:
    """The changes to the view's tables that move a column it reads: an update of other
    columns (a stock level under a sales view) changes no group, so it costs no join."""
    out: Changes = {}
    for table in plan.base_tables():
        rows = changes.get(table)
        if not rows:
            continue
        columns = {c for alias in plan.aliases_of(table) for c in plan.columns_of(alias)}
        kept = {
            key: (before, after)
            for key, (before, after) in rows.items()
            if before is None
            or after is None
            or any(before.get(c) != after.get(c) for c in columns)
        }
        if kept:
            out[table] = kept
    return out


def _meta(view: View, *, refreshed_at: int) -> lpb.RowOp:
    return lpb.RowOp(
        kind=lpb.RowOp.PUT,
        table=view.meta_id,
        key=META_KEY,
        values=encode_row({"refreshed_at": refreshed_at}),
    )


def _describe(plan: ViewPlan) -> str:
    if plan.mode == "async":
        return f"async, refreshed every {plan.interval_ms} ms"
    if plan.mode == "cumulus":
        return (
            f"cumulus ({plan.speculation}, {plan.nodes} nodes, an epoch every "
            f"{plan.interval_ms} ms)"
        )
    return "sync"
