"""Async refreshes (Algorithm 5.2: a refresher drains a view's change rows every ``interval_ms``)
and cumulus views' runtimes and epochs (fed by the members' switches,
``coordinator.view_switches``, or, over views, drained)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from aggview import errors, failpoints
from aggview.rowcodec import decode_row
from aggview.wire import ltm_pb2 as lpb
from coordinator.cumulus_hosts import start_runtime
from coordinator.cumulus_view import CumulusView
from coordinator.view_model import View, meta_row
from coordinator.view_stack import group_reader, relation
from coordinator.view_switches import ViewSwitches, over_tables
from cumulus.aggstate import Row
from cumulus.delta import Changes, touching, view_delta
from cumulus.plan import ViewPlan
from cumulus.view_rows import view_rows

log = logging.getLogger("coordinator.views")  # the view manager's log, as before the split


class ViewRefresh(ViewSwitches):
    """The view manager's refreshes and cumulus runtimes (a part of ``ViewManager``)."""

    # ------------------------------------------------------------------ async refresh

    def _start_refresher(self, view: View) -> None:
        """Refreshes ``view`` every interval (a cumulus view: an epoch every epoch_ms, and,
        with feed_ms, the changes fed to its runtime every feed_ms between epochs)."""
        plan = view.plan
        epoch = plan.interval_ms / 1000
        tick = (plan.feed_ms or plan.interval_ms) / 1000

        async def loop() -> None:
            last_epoch = time.monotonic()
            # a refresher replaced or dropped ends here even if its cancellation was lost (see
            # ``loops.stop``): ``_reconcile_refresher`` cancels without waiting
            while getattr(self.views.get(view.name), "refresher", None) is asyncio.current_task():
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
            # a draining sync view's captured changes against the tables at its cut: the
            # transactions after it maintained the view against tables holding those changes
            # (read at the drain's own timestamp, a join of both would count twice)
            at = view.drain_cut + 1 if view.drain_cut else ts  # own reads: the state before it
            delta = await view_delta(compiled, touching(view.plan, changes), self._rows_where(at))
            ops.extend(view.merge(key, d, self._home(key)) for key, d in delta.items())
            if view.plan.mode == "async":
                ops.append(meta_row(view, refreshed_at=ts))
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
        if computed is not None and over_tables(self.views, view.plan):
            if computed[0] < self._dispatch_since:  # what came between may not be here
                log.info("%s: computed at %d, before this leader; loading", view.name, computed[0])
                computed = None

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
            return [meta_row(view, refreshed_at=snapshot)]

        written = await self.manager.system_transaction(load)
        self.runtimes[view.name] = loaded[0]
        self._installed(view)
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
        members = self._members() if over_tables(self.views, plan) else None
        start = functools.partial(
            start_runtime, plan=plan, directory=directory, tls=self.tls, members=members
        )
        runtime = await asyncio.to_thread(CumulusView, plan, schemas, start, members)
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
        if runtime.members is not None:
            return await self._member_epoch(view, runtime, commit)
        drained: list[tuple[str, bytes, Row | None, Row | None]] = []

        async def drain(ts: int) -> list[lpb.RowOp]:
            ops, drained[:] = await self._take_changes(view, ts)
            return [*ops, meta_row(view, refreshed_at=ts)]

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

    async def _member_epoch(self, view: View, runtime: CumulusView, commit: bool) -> int:
        """An epoch of a runtime fed by the members' switches: a timestamp T (every older
        transaction decided, the meta row written), then every member's EPOCH END for T.
        Feeding is theirs: ``commit=False`` does nothing."""
        if not commit:
            return runtime.fed_at
        leftovers = view.leftovers

        async def mark(ts: int) -> list[lpb.RowOp]:
            ops = (await self._take_changes(view, ts))[0] if leftovers else []
            return [*ops, meta_row(view, refreshed_at=ts)]

        started = time.perf_counter()
        ts = await self.manager.system_transaction(mark)
        view.leftovers = view.leftovers and not leftovers
        try:
            await self._switched_epoch(view, runtime, ts)
        except Exception as exc:
            log.warning("epoch of cumulus view %s failed (%s); loading it again", view.name, exc)
            if self.runtimes.get(view.name) is runtime:
                self._retire(view.name)
                asyncio.get_running_loop().create_task(self._reload_runtime(view))
            raise
        self.manager.refreshes += 1
        self.manager.metrics.refreshed(view.name, time.perf_counter() - started)
        return ts

    # ------------------------------------------------------------------ reading base data

    async def _read_tables(self, view: View, ts: int) -> dict[str, dict[bytes, Row]]:
        """The view's tables at ``ts``, paged: every older transaction is decided, so the
        pages stay as read."""
        tables: dict[str, dict[bytes, Row]] = {}
        for table in view.plan.base_tables():
            if table in self.views:  # a view read as a table: its rows as a read gives them
                inner = self.views[table]
                groups = await group_reader(self.manager, self.views, ts)(table, None)
                tables[table] = view_rows(inner.compiled, groups)  # type: ignore[arg-type]
                continue
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
        ids = [view.changes_id(relation(self.views, self.catalog, table)) for table in tables]
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
