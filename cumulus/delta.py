"""ΔV: how a set of base-row changes moves each group of a view.

For a join of aliases 1..k, V_new − V_old = Σ_i N_1 ⋈ … ⋈ N_{i−1} ⋈ Δ_i ⋈ O_{i+1} ⋈ … ⋈ O_k,
where Δ_i is +new −old for the changed rows of alias i's table, N is a table after the
changes and O before. This is the thesis's ΔA⋈B_old + A_new⋈ΔB (sync) and, read the other way,
ΔA⋈B_new + A_new⋈ΔB − ΔA⋈ΔB (async); it holds for self-joins too, since each alias takes its
own side. Rows not changed are the same on both sides, so one snapshot serves both: the sync
path reads the state before the transaction, the async path the state at the refresh, and the
changed rows are patched in from ``changes`` either way.

Evaluating from scratch is the same computation with every row "inserted" and an empty
snapshot, which is how views over existing data are initialized.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from aggview.merge import combine
from aggview.schema import Column, to_storage
from cumulus.aggstate import Row, ViewState
from cumulus.plan import ViewPlan

# table name -> encoded primary key -> (row before, row after), storage form; None = absent
Changes = dict[str, dict[bytes, tuple[Row | None, Row | None]]]
# (table name, column, storage values) -> {value: [(key, row)]} of the snapshot; one call per
# join step, so the lookups of a whole batch of changes travel together
RowsWhere = Callable[[str, str, list[Any]], Awaitable[dict[Any, list[tuple[bytes, Row]]]]]


async def no_rows(table: str, column: str, values: list[Any]) -> dict[Any, list[tuple[bytes, Row]]]:
    return {}


def join_order(plan: ViewPlan, start: int) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Aliases in the order a join starting at ``start`` binds them, each with the edges to
    aliases bound before it as (its column, bound alias, bound column)."""
    bound = [plan.tables[start].alias]
    order: list[tuple[str, list[tuple[str, str, str]]]] = []
    remaining = [t.alias for i, t in enumerate(plan.tables) if i != start]
    while remaining:
        for alias in remaining:
            edges = []
            for edge in plan.edges:
                if edge.left.alias == alias and edge.right.alias in bound:
                    edges.append((edge.left.column, edge.right.alias, edge.right.column))
                elif edge.right.alias == alias and edge.left.alias in bound:
                    edges.append((edge.right.column, edge.left.alias, edge.left.column))
            if edges:
                order.append((alias, edges))
                bound.append(alias)
                remaining.remove(alias)
                break
        else:
            raise ValueError(f"view {plan.name}: tables {remaining} are not joined")
    return order


class _Side:
    """Rows of one table matching column = value, before or after the changes."""

    def __init__(self, changes: Changes, rows_where: RowsWhere) -> None:
        self.changes = changes
        self.rows_where = rows_where
        self._snapshot: dict[tuple[str, str, Any], list[Row]] = {}
        self._changed: dict[tuple[str, str, bool], dict[Any, list[Row]]] = {}

    async def fetch(self, table: str, column: str, values: set[Any]) -> None:
        """Reads the snapshot rows for every value not read yet, in one call."""
        missing = [v for v in values if (table, column, v) not in self._snapshot]
        if not missing:
            return
        changed = self.changes.get(table, {})
        found = await self.rows_where(table, column, missing)
        for value in missing:
            rows = found.get(value, [])
            self._snapshot[(table, column, value)] = [r for k, r in rows if k not in changed]

    def rows(self, table: str, column: str, value: Any, new: bool) -> list[Row]:
        snapshot = self._snapshot[(table, column, value)]
        return snapshot + self._changed_rows(table, column, new).get(value, [])

    def _changed_rows(self, table: str, column: str, new: bool) -> dict[Any, list[Row]]:
        index = self._changed.get((table, column, new))
        if index is None:
            index = defaultdict(list)
            for old_row, new_row in self.changes.get(table, {}).values():
                row = new_row if new else old_row
                if row is not None and row.get(column) is not None:
                    index[row[column]].append(row)
            self._changed[(table, column, new)] = index
        return index


async def view_delta(view: ViewState, changes: Changes, rows_where: RowsWhere) -> dict[bytes, Row]:
    """The merge delta of every group the changes touch (groups whose delta is zero included:
    merging them is harmless)."""
    plan = view.plan
    aliases = [t.alias for t in plan.tables]
    side = _Side(changes, rows_where)
    out: dict[bytes, Row] = {}
    for i, table_ref in enumerate(plan.tables):
        table_changes = changes.get(table_ref.table)
        if not table_changes:
            continue
        partial: list[tuple[int, dict[str, Row]]] = []
        for old, new in table_changes.values():
            if new is not None:
                partial.append((1, {table_ref.alias: new}))
            if old is not None:
                partial.append((-1, {table_ref.alias: old}))
        for alias, edges in join_order(plan, i):
            j = aliases.index(alias)
            table = plan.tables[j].table
            column, bound_alias, bound_column = edges[0]
            target = Column(column, view.column_type(alias, column))
            wanted: list[tuple[int, dict[str, Row], Any]] = []
            for sign, binding in partial:
                value = view.lookup(binding)(bound_alias, bound_column)
                if value is None:
                    continue
                try:
                    wanted.append((sign, binding, to_storage(target, value, table=table)))
                except Exception:
                    continue  # e.g. 2.5 never equals an INT column
            await side.fetch(table, column, {stored for _, _, stored in wanted})
            extended: list[tuple[int, dict[str, Row]]] = []
            for sign, binding, stored in wanted:
                for row in side.rows(table, column, stored, new=j < i):
                    candidate = {**binding, alias: row}
                    if all(_equal(view, candidate, alias, c, a, b) for c, a, b in edges[1:]):
                        extended.append((sign, candidate))
            partial = extended
        for sign, binding in partial:
            lookup = view.lookup(binding)
            if view.passes(lookup):
                key = view.group_key(lookup)
                out[key] = combine(out.get(key, {}), view.tuple_delta(lookup, sign))
    return out


def _equal(
    view: ViewState, binding: dict[str, Row], alias: str, column: str, a: str, b: str
) -> bool:
    lookup = view.lookup(binding)
    left, right = lookup(alias, column), lookup(a, b)
    return left is not None and left == right


async def from_scratch(view: ViewState, tables: dict[str, dict[bytes, Row]]) -> dict[bytes, Row]:
    """The whole view as merge deltas onto an empty view: every row inserted."""
    changes: Changes = {
        name: {key: (None, row) for key, row in rows.items()} for name, rows in tables.items()
    }
    groups = await view_delta(view, changes, no_rows)
    return {key: state for key, state in groups.items() if state.get("_count")}
