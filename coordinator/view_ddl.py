"""CREATE, DROP and ALTER MATERIALIZED VIEW: declaring a view and its indexes, forgetting one,
and switching a live view between sync, async and cumulus without losing or counting twice a
change (see DECISIONS, "Switching a view's mode")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aggview import errors, loops
from aggview.keycodec import encoded_width
from aggview.partition_map import index_table
from aggview.schema import TableSchema
from coordinator.view_model import View, ViewsShared
from coordinator.view_stack import check_inner, dependents, read_by_view, relation
from coordinator.view_switches import over_tables
from cumulus.aggstate import ViewState
from cumulus.compiler import compile_views
from cumulus.ddl import AlterView, CreateView, DropView, altered_plan, parse_view_statement
from cumulus.passes.lift_subqueries import HIDDEN_PREFIX
from cumulus.plan import ViewPlan

log = logging.getLogger("coordinator.views")  # the view manager's log, as before the split


class ViewDdl(ViewsShared):
    """The view manager's DDL (a part of ``ViewManager``)."""

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
        if create.name.startswith(HIDDEN_PREFIX):
            raise errors.InvalidArgument(
                f"view names starting with {HIDDEN_PREFIX} are the hidden views of subqueries"
            )
        # every plan first (a refusal creates nothing), then each view, hidden views first
        plans = compile_views(create, self._relation_for(create.name))
        made: list[View] = []
        try:
            for plan in plans:
                view, new_indexes = self._declare(create, plan)
                made.append(view)
                await self._initialize(view, fresh=True, new_indexes=new_indexes)
        except BaseException:
            for view in reversed(made):
                await self._forget(view)
            raise
        return f"created materialized view {view.name} ({view.plan.mode})"

    def _declare(
        self, create: CreateView, plan: ViewPlan | None = None
    ) -> tuple[View, list[tuple[str, str]]]:
        """Registers a new view (``plan``, compiled already: the view or a hidden view of its
        subqueries), initializing: from here on every commit captures its changes."""
        if plan is None:
            plans = compile_views(create, self._relation_for(create.name))
            if len(plans) > 1:
                raise errors.InvalidArgument(
                    f"materialized view {create.name} has subqueries: Spark initializes views "
                    "over base tables only (CREATE it through the coordinator)"
                )
            plan = plans[0]
        if plan.name in self.views:
            raise errors.AlreadyExists(f"materialized view {plan.name} already exists")
        if plan.name in self.catalog.tables:
            raise errors.AlreadyExists(f"{plan.name} is already the name of a table")
        if len(self.views) >= self.manager.limits.max_views:
            raise errors.LimitExceeded(
                f"{len(self.views)} materialized views exist; the limit is "
                f"{self.manager.limits.max_views} (max_views)"
            )
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

    def _relation_for(self, outer: str) -> Callable[[str], TableSchema]:
        """Names in a new view's FROM: tables, and live sync views (``view_stack``)."""

        def table(name: str) -> TableSchema:
            check_inner(self.views, name, outer)
            return relation(self.views, self.catalog, name)

        return table

    def _changes_ids(self, view: View) -> list[str]:
        tables = view.plan.base_tables()
        return [view.changes_id(relation(self.views, self.catalog, t)) for t in tables]

    def _declare_indexes(self, plan: ViewPlan) -> list[tuple[str, str]]:
        """A secondary index for every join column that is not the first key column."""
        created = []
        for table, column in plan.join_columns():
            if table in self.views:  # a view read as a table: read by group key
                continue
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
        readers = dependents(self.views, view.name)
        if readers:
            raise errors.FailedPrecondition(
                f"materialized view {view.name} is read by {', '.join(readers)}; drop "
                f"{'it' if len(readers) == 1 else 'them'} first"
            )
        await self._forget(view)
        for hidden in reversed(view.plan.hidden):  # its subqueries' views, and theirs
            await self._drop(DropView(hidden, if_exists=True))
        return f"dropped materialized view {drop.name}"

    async def _forget(self, view: View) -> None:
        await self._stop_refresher(view)
        self._drained(view)
        self.views.pop(view.name, None)
        self._retire(view.name)
        self._unfed.pop(view.name, None)
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
        layered = dependents(self.views, view.name) or read_by_view(self.views, view)
        if plan.mode != view.plan.mode and layered:
            raise errors.FailedPrecondition(
                f"materialized view {view.name} reads or is read by another view: switching "
                "the mode of views over views is not supported"
            )
        if plan == view.plan:
            return f"materialized view {view.name} is already {_describe(plan)}"
        old, old_snapshot = view.plan, view.snapshot
        view.switching = True
        try:
            self.publish()  # every member stops refreshing it (one granted already is older)
            await self._stop_refresher(view)
            async with view.lock:  # a refresh or epoch asked for before the ALTER ends first
                pass
            same_runtime = (old.nodes, old.speculation, old.host, old.depth) == (
                plan.nodes,
                plan.speculation,
                plan.host,
                plan.depth,
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
            await loops.stop(view.refresher)
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
        if view.plan.mode != "cumulus" or over_tables(self.views, plan):
            # captured, and sent by the members' switches (a runtime over tables), before
            # the snapshot
            view.also_captures = True
            self.publish()
        async with self.manager.snapshot() as ts:
            runtime = await self._runtime_at(view, plan, ts)
        self._replan(view, plan)
        view.snapshot, view.also_captures = ts, False
        self._retire(view.name)  # the runtime it had (other nodes or mode)
        self.runtimes[view.name] = runtime
        self._installed(view)

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
        self._unfed.pop(view.name, None)

    def _replan(self, view: View, plan: ViewPlan) -> None:
        view.plan = plan
        view.compiled = ViewState(plan, lambda t: relation(self.views, self.catalog, t))

    def views_on(self, table: str) -> list[str]:
        return [v.name for v in self.views.values() if table in v.plan.base_tables()]


def _describe(plan: ViewPlan) -> str:
    if plan.mode == "async":
        return f"async, refreshed every {plan.interval_ms} ms"
    if plan.mode == "cumulus":
        depth = f", depth {plan.depth}" if plan.depth else ""
        return (
            f"cumulus ({plan.speculation}, {plan.nodes} nodes, an epoch every "
            f"{plan.interval_ms} ms{depth})"
        )
    return "sync"
