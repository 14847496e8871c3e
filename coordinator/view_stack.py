"""Views over views on the coordinator: which views read which, the inner views' rows as
tables (schemas, reads of their groups at a transaction's timestamp), and the change rows an
async view over a sync one captures from the inner view's row changes (see DECISIONS, "Views
over views")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from aggview import errors
from aggview.keycodec import prefix_end
from aggview.partition_map import changes_table
from aggview.rowcodec import encode_row
from aggview.schema import TableSchema
from aggview.wire import ltm_pb2 as lpb
from coordinator.view_model import View
from cumulus.aggstate import Row, ViewState
from cumulus.view_rows import GroupReader, RowChanges, row_schema, rows_id

if TYPE_CHECKING:
    from coordinator.catalog import Catalog
    from coordinator.transactions import TransactionManager


def relation(views: Mapping[str, View], catalog: Catalog, name: str) -> TableSchema:
    """A table's schema, or a view's rows as a table (its columns as a read gives them)."""
    view = views.get(name)
    if view is not None:
        return row_schema(view.plan, rows_id(view.number, name))
    return catalog.table(name)


def compile_all(views: Mapping[str, View], catalog: Catalog) -> None:
    """Each view's compiled state, inner views first (a view is numbered after those it
    reads, which exist before it)."""
    for view in in_order(views.values()):
        view.compiled = ViewState(view.plan, lambda name: relation(views, catalog, name))


def in_order(views: Iterable[View]) -> list[View]:
    return sorted(views, key=lambda v: v.number)


def read_by(views: Mapping[str, View]) -> set[str]:
    """The views some view reads as a table."""
    return {t for v in views.values() for t in v.plan.base_tables() if t in views}


def dependents(views: Mapping[str, View], name: str) -> list[str]:
    """The views that read ``name``, by name."""
    return sorted(v.name for v in views.values() if name in v.plan.base_tables())


def read_by_view(views: Mapping[str, View], view: View) -> list[str]:
    """The views ``view`` reads, by name."""
    return [t for t in view.plan.base_tables() if t in views]


def check_inner(views: Mapping[str, View], name: str, outer: str) -> None:
    """A view may read a live sync view only: an async or cumulus view's rows move at its
    refreshes, not in the writing transaction, so nothing could cascade from them."""
    view = views.get(name)
    if view is None:
        return
    if view.plan.mode != "sync":
        raise errors.InvalidArgument(
            f"materialized view {outer} reads materialized view {name}, which is "
            f"{view.plan.mode}: a view over a view needs the inner view to be sync"
        )
    if view.state != "live":
        raise errors.FailedPrecondition(f"materialized view {name} is still initializing")


def group_reader(manager: TransactionManager, views: Mapping[str, View], ts: int) -> GroupReader:
    """Reads of a view's groups at ``ts`` as transaction ``ts``'s own (marked: an older
    writer's merge into them is too late afterwards, ``RowOp.guarded``)."""

    async def read(name: str, prefixes: list[bytes] | None) -> dict[bytes, Row]:
        view = views[name]
        if prefixes is None:
            rows = await manager.read_range_at(view.view_id, b"", b"", ts, own=True)
        else:
            found = await asyncio.gather(
                *(
                    manager.read_range_at(view.view_id, p, prefix_end(p) or b"", ts, own=True)
                    for p in dict.fromkeys(prefixes)
                )
            )
            rows = [row for part in found for row in part]
        return view.groups(rows)

    return read


def captured_rows(
    views: Mapping[str, View], moved: Mapping[str, RowChanges], ts: int
) -> list[lpb.RowOp]:
    """The change rows of views that capture (async, or initializing) for the row changes of
    the views they read: as an LTM writes a base row's, keyed by group key + timestamp."""
    ops = []
    suffix = ts.to_bytes(8, "big")
    for view in views.values():
        if not view.captures:
            continue
        for table in view.plan.base_tables():
            rows = moved.get(table)
            if not rows:
                continue
            changes_id = changes_table(view.number, rows_id(views[table].number, table))
            for key, (before, after) in rows.items():
                ops.append(
                    lpb.RowOp(
                        kind=lpb.RowOp.PUT,
                        table=changes_id,
                        key=key + suffix,
                        values=encode_row({"b": before, "a": after}),
                    )
                )
    return ops
