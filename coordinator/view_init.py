"""A view's initialization over existing rows: computed from a snapshot while writers go on (or
installed from groups a Spark job computed, ``begin_external`` ... ``finish_external``), the
changes captured meanwhile drained, then live; and the backfill of a new secondary index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aggview import errors, failpoints
from aggview.merge import combine, negate
from aggview.rowcodec import decode_row
from aggview.wire import ltm_pb2 as lpb
from coordinator.view_model import ExternalInit, View, ViewsShared, meta_row
from cumulus.aggstate import Row
from cumulus.ddl import CreateView, parse_view_statement
from cumulus.delta import from_scratch


class ViewInit(ViewsShared):
    """The view manager's initialization (a part of ``ViewManager``)."""

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
                meta_row(view, refreshed_at=refreshed_at)
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
            # captured since the snapshot are drained once and capture stops. The cut is the
            # old catalog's last timestamp, kept readable until the view is live (or gone); a
            # drain tried before keeps it (every transaction since maintained the view).
            if not view.drain_cut:
                view.drain_cut = self.manager.clock.issued()
                self.manager.in_flight.start_reading(view.drain_cut)
                view.state = "draining"
                self.publish()
            if failpoints.ARMED:
                await failpoints.pause(failpoints.COORDINATOR_BEFORE_DRAIN)
            async with view.lock:
                await self._refresh(view)
        self._live(view)

    def _live(self, view: View) -> None:
        self._drained(view)
        view.state = "live"
        self.publish()
        self._persist(view)
        self._reconcile_refresher(view)

    def _drained(self, view: View) -> None:
        """The tables at a drained view's cut need not stay readable any longer."""
        if view.drain_cut:
            self.manager.in_flight.stop_reading(view.drain_cut)
            view.drain_cut = 0

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
