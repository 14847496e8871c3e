"""Sync maintenance inside the writing transaction (Algorithm 5.1, §5.3.1) and change capture:
the hooks the transaction path calls (``coordinator.view_hooks.ViewHooks``). The hot path: it
works on the view manager's own state, with no indirection per row."""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import Any

from aggview import errors
from aggview.keycodec import encode_key, prefix_end
from aggview.partition_map import partition_of
from aggview.rowcodec import decode_row, encode_row
from aggview.schema import TableSchema
from aggview.wire import ltm_pb2 as lpb
from coordinator.commits import Transaction
from coordinator.view_stack import captured_rows, group_reader, in_order, read_by
from coordinator.view_switches import ViewSwitches, dispatched
from cumulus.aggstate import Row
from cumulus.cascade import cascade
from cumulus.delta import Changes, RowsWhere
from cumulus.view_rows import GroupReader, with_views

_NO_COLUMNS = encode_row({})  # an index entry's row: its key says it all


class ViewMaintenance(ViewSwitches):
    """The view manager's hooks in every transaction (a part of ``ViewManager``)."""

    # ------------------------------------------------------------------ maintenance

    def watches(self, table_id: str) -> bool:
        """Whether writes to a store table need row images: it has an index, a sync view
        maintained in the transaction uses it, or a cumulus view fed by this member's switch
        reads it."""
        return table_id in self._maintained_ids() or table_id in self._dispatched_ids()

    def _maintained_ids(self) -> set[str]:
        epoch, ids = self._watched
        if epoch != self.manager.epoch:
            names = {table for table, _ in self.indexes}
            for view in self.views.values():
                if view.plan.mode == "sync" and view.state != "initializing":
                    names.update(view.plan.base_tables())
            ids = {self.catalog.tables[n].table_id for n in names if n in self.catalog.tables}
            self._watched = (self.manager.epoch, ids)
        return ids

    def lookup_tables(self) -> set[str]:
        """Tables that view maintenance joins on their whole primary key (dimension rows,
        looked up by key in every writing transaction of a sync view and in every refresh of
        an async one): the coordinator caches them."""
        ids = set()
        for view in self.views.values():
            if view.state == "initializing":
                continue
            for table, column in view.plan.join_columns():
                if table in self.views:  # a view read as a table: read by group key
                    continue
                schema = self.catalog.table(table)
                if schema.primary_key == (column,):
                    ids.add(schema.table_id)
        return ids

    def capture(self, ops: list[lpb.RowOp]) -> None:
        """Asks the LTMs to append change rows for views that are async or initializing (a
        live cumulus view over tables is sent by the members' switches instead)."""
        capturing = [
            v
            for v in self.views.values()
            if v.captures
            and not (v.state == "live" and not v.also_captures and dispatched(self.views, v))
        ]
        if not capturing:
            return
        for op in ops:
            schema = self.catalog.by_id.get(op.table)
            if schema is None:
                continue
            for view in capturing:
                if schema.name in view.plan.base_tables():
                    op.changes_tables.append(view.changes_id(schema))

    async def maintain(self, tx: Transaction, images: list[lpb.RowImage]) -> list[lpb.RowOp]:
        """The extension of §5.3.1: index entries and sync view deltas for a round's images."""
        changes: Changes = {}
        maintained = self._maintained_ids()
        for image in images:
            if image.table not in maintained:  # a cumulus view's only: for the switch
                continue
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
        ops.extend(await self._maintain_views(tx, changes, home))
        return [op for op in ops if op is not None]

    async def _maintain_views(
        self, tx: Transaction, changes: Changes, home: int
    ) -> list[lpb.RowOp]:
        """Each sync view's delta, inner views first: an inner view's row changes are the
        input changes of the views over it (their merges guarded: a younger transaction's
        read of those rows keeps this one's merge off them), and the change rows of async
        views over it."""
        maintained = [
            v.compiled
            for v in in_order(self.views.values())
            if v.plan.mode == "sync" and v.state != "initializing" and v.compiled is not None
        ]
        inner = read_by(self.views)
        reader = group_reader(self.manager, self.views, tx.ts)
        rows_where = self._rows_where(tx.ts, inner, reader)
        started = time.perf_counter()

        def measured(name: str) -> None:
            nonlocal started
            now = time.perf_counter()
            self.manager.metrics.maintained(name, now - started)
            started = now

        deltas, moved = await cascade(
            maintained, changes, rows_where, reader, inner, tx.merged, measured
        )
        ops = []
        for name, delta in deltas.items():
            view = self.views[name]
            guarded = name in inner
            for key, d in delta.items():
                op = view.merge(key, d, home)
                op.guarded = guarded
                ops.append(op)
        return ops + captured_rows(self.views, moved, tx.ts) if moved else ops

    def _home(self, group_key: bytes) -> int:
        """Where a group's partial row goes when no partition is better than another."""
        return zlib.crc32(group_key) % self.manager.partitions

    def _rows_where(
        self, ts: int, inner: set[str] | None = None, reader: GroupReader | None = None
    ) -> RowsWhere:
        """Reads of transaction ``ts`` itself: rows of a table (or of a view read as one,
        ``inner``: every view some view reads) whose column equals one of some values (or
        every row: column None)."""
        inner = read_by(self.views) if inner is None else inner
        rows_where = self._table_rows_where(ts)
        if not inner:
            return rows_where
        views = {name: self.views[name].compiled for name in inner}
        reader = reader or group_reader(self.manager, self.views, ts)
        return with_views(rows_where, views, reader)  # type: ignore[arg-type]

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
            values=b"" if erase else _NO_COLUMNS,
        )

    def _table_rows_where(self, ts: int) -> RowsWhere:
        """Rows of a table whose column equals one of some values, read as transaction
        ``ts``'s own, in as few calls as the access path allows."""
        manager = self.manager

        async def rows_where(
            table: str, column: str | None, values: list[Any]
        ) -> dict[Any, list[tuple[bytes, Row]]]:
            schema = self.catalog.table(table)
            if column is None:  # a scan step (theta join, cross product): the whole table,
                # marked read, so no older writer can add or change a row of it afterwards
                rows = await manager.read_range_at(schema.table_id, b"", b"", ts, own=True)
                return {None: [(k, decode_row(v) or {}) for k, v in rows]}
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
