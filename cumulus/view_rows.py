"""A materialized view read as a table by a view over it: its row schema, and its groups'
stored states turned into the rows a read gives (finalized, in storage form).

A view over a view sees the inner view as a read shows it: the SELECT's columns (AVG as its
value, HAVING applied), one row per group, plus ``__count``, how many times the row counts
(a bag view's multiplicity; 1 for every other shape). ``__count`` is the row schema's primary
key only because a schema needs a NOT NULL one: the rows' keys are the inner view's group keys,
and a joined tuple counts as often as the product of its view rows' ``__count`` (see
``cumulus.delta``). ``SELECT *`` does not show it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aggview.merge import combine
from aggview.schema import Column, ColumnType, TableSchema, from_storage, to_storage
from cumulus.aggstate import NO_GROUP_KEY, Row, ViewState
from cumulus.delta import RowsWhere
from cumulus.plan import MULTIPLICITY, ViewPlan

ROWS_ID = re.compile(r"r\d+_")  # the rows of view number N, as a view over it reads them
# (view name, group key prefixes, or None for every group) -> {group key: stored state}
GroupReader = Callable[[str, list[bytes] | None], Awaitable[dict[bytes, Row]]]
# group key -> (row before, row after) of one view's rows, None where there is none
RowChanges = dict[bytes, tuple[Row | None, Row | None]]


def rows_id(number: int, name: str) -> str:
    """The table id a view's rows go by when a view over it captures their changes."""
    return f"r{number}_{name}"


def is_view_rows(schema: TableSchema) -> bool:
    return ROWS_ID.match(schema.table_id) is not None


def row_schema(plan: ViewPlan, table_id: str) -> TableSchema:
    """The view's rows as a table: ``__count`` (the key a schema needs), then its columns."""
    columns = [Column(MULTIPLICITY, ColumnType.parse("INT"), False)]
    columns += [Column(name, ColumnType.parse(plan.column_type(name))) for name in plan.output]
    return TableSchema(plan.name, table_id, tuple(columns), (MULTIPLICITY,))


def view_row(state: ViewState, key: bytes, group: Row) -> Row | None:
    """One group's row as a view over it reads it (storage form), None where a read shows
    none (no rows, or HAVING rejects it)."""
    values = state.finalize(key, group)
    if values is None:
        return None
    row: Row = {MULTIPLICITY: group.get("_count", 0) if state.plan.shape == "bag" else 1}
    for name, value in values.items():
        column = Column(name, ColumnType.parse(state.plan.column_type(name)))
        row[name] = None if value is None else to_storage(column, value, table=state.plan.name)
    return row


def view_rows(state: ViewState, groups: Mapping[bytes, Row]) -> dict[bytes, Row]:
    """Every row of a view from its groups' states; a view without GROUP BY has its one row
    even before anything was stored."""
    if not state.plan.group_by and NO_GROUP_KEY not in groups:
        groups = {**groups, NO_GROUP_KEY: {}}
    rows = ((key, view_row(state, key, group)) for key, group in groups.items())
    return {key: row for key, row in rows if row is not None}


def row_changes(
    state: ViewState, before: Mapping[bytes, Row], delta: Mapping[bytes, Row]
) -> RowChanges:
    """How a delta moves the view's rows: (before, after) per group whose row changed;
    ``before`` holds the groups' states before it (absent: nothing stored)."""
    out: RowChanges = {}
    for key, change in delta.items():
        old = before.get(key, {})
        old_row = view_row(state, key, old)
        new_row = view_row(state, key, combine(old, change))
        if old_row != new_row:
            out[key] = (old_row, new_row)
    return out


def with_views(base: RowsWhere, views: Mapping[str, ViewState], read: GroupReader) -> RowsWhere:
    """``base`` (the tables' rows) extended to views read as tables: a lookup on a view's
    leading group column reads those groups only, any other its whole state."""

    async def rows_where(
        table: str, column: str | None, values: list[Any]
    ) -> dict[Any, list[tuple[bytes, Row]]]:
        state = views.get(table)
        if state is None:
            return await base(table, column, values)
        plan = state.plan
        leading = plan.group_by[0] if plan.group_by else None
        prefixes = None
        if leading is not None and column == leading.name and column in plan.output:
            column_type = ColumnType.parse(leading.type)
            prefixes = [state.encode_group([from_storage(column_type, v)]) for v in values]
        rows = view_rows(state, await read(plan.name, prefixes))
        if column is None:
            return {None: list(rows.items())}
        wanted = set(values)
        out: dict[Any, list[tuple[bytes, Row]]] = {}
        for key, row in rows.items():
            if row.get(column) in wanted:
                out.setdefault(row[column], []).append((key, row))
        return out

    return rows_where
