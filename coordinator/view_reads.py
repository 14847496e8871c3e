"""Reads of a view: its stored groups at one snapshot (``coordinator.view_query`` answers the
query over them), a cumulus view's runtime, or the leader's for a follower."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from aggview import errors
from aggview.keycodec import prefix_end
from aggview.partition_map import partial_key
from aggview.rowcodec import decode_row
from aggview.schema import Column, to_storage
from coordinator import view_query
from coordinator.view_model import META_KEY, View, ViewsShared
from coordinator.view_query import Condition, counted_rows
from cumulus.aggstate import NO_GROUP_KEY

SWITCH_WAIT_S = 30.0  # how long a read waits for a view to finish switching to sync


class ViewReads(ViewsShared):
    """The view manager's reads (a part of ``ViewManager``)."""

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
            names = []  # the leading group columns a row shows (not a union's branch)
            for group in view.plan.group_by:
                if group.name not in view.plan.output:
                    break
                names.append(group.name)
            encode = view.compiled.encode_group
            rows.sort(key=lambda row: encode([row[n] for n in names]))
        return rows, ts, tentative
