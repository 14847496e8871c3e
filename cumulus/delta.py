"""ΔV: how a set of base-row changes moves each group of a view.

For a join of aliases 1..k, V_new − V_old = Σ_i N_1 ⋈ … ⋈ N_{i−1} ⋈ Δ_i ⋈ O_{i+1} ⋈ … ⋈ O_k,
where Δ_i is +new −old for the changed rows of alias i's table, N is a table after the
changes and O before. This is the thesis's ΔA⋈B_old + A_new⋈ΔB (sync) and, read the other way,
ΔA⋈B_new + A_new⋈ΔB − ΔA⋈ΔB (async); it holds for self-joins too, since each alias takes its
own side. Rows not changed are the same on both sides, so one snapshot serves both: the sync
path reads the state before the transaction, the async path the state at the refresh, and the
changed rows are patched in from ``changes`` either way.

An outer alias (``ViewPlan.outer``: a LEFT JOIN, an anti-join) binds its matching rows or its
NULL row; the view is linear in every other table, and a change to its own table is the inner
join's delta plus the flips of the NULL rows of the keys whose matches come or go.

Evaluating from scratch is the same computation with every row "inserted" and an empty
snapshot, which is how views over existing data are initialized.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from aggview.merge import accumulate
from aggview.schema import Column, to_storage
from cumulus.aggstate import Row, ViewState
from cumulus.plan import MULTIPLICITY, ViewPlan, expr_columns

# table name -> encoded primary key -> (row before, row after), storage form; None = absent
Changes = dict[str, dict[bytes, tuple[Row | None, Row | None]]]
# (table name, column, storage values) -> {value: [(key, row)]} of the snapshot; one call per
# join step, so the lookups of a whole batch of changes travel together. A column of None asks
# for every row of the table (a scan step), answered as {None: [(key, row), ...]}.
RowsWhere = Callable[[str, str | None, list[Any]], Awaitable[dict[Any, list[tuple[bytes, Row]]]]]
# an alias a join binds and its equalities with aliases bound before it, as (its column, bound
# alias, bound column); no equality: a scan step, every row of its table
Step = tuple[str, list[tuple[str, str, str]]]
Binding = tuple[int, dict[str, Row]]  # (sign, alias -> row) of one partial joined tuple
# an outer alias's row where none matches: every column NULL, counted once
NULL_ROW: Row = {MULTIPLICITY: 1}


def touching(plan: ViewPlan, changes: Changes) -> Changes:
    """The changes to the view's tables that move a column it reads: an update of other
    columns (a stock level under a sales view) changes no group, so it costs no join. A
    view's row read by a view over it also moves when its multiplicity does."""
    out: Changes = {}
    watched = plan.once(
        "watched", lambda: {t: _watched_columns(plan, t) for t in plan.base_tables()}
    )
    for table, columns in watched.items():
        rows = changes.get(table)
        if not rows:
            continue
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


def _watched_columns(plan: ViewPlan, table: str) -> frozenset[str]:
    """Every column of ``table`` some branch of the view reads (under any alias), and the
    multiplicity."""
    return frozenset(
        c for b in plan.branch_plans() for alias in b.aliases_of(table) for c in b.columns_of(alias)
    ) | {MULTIPLICITY}


async def no_rows(
    table: str, column: str | None, values: list[Any]
) -> dict[Any, list[tuple[bytes, Row]]]:
    return {}


def join_order(plan: ViewPlan, start: int) -> list[Step]:
    """Aliases in the order a join starting at ``start`` binds them. An alias an equality
    reaches is looked up by index; only when none is left does a scan step bind one (a theta
    join or a cross product), preferring one a filter links to the aliases bound so far, so
    that scans come after lookups and their filter applies at once. An outer alias (LEFT
    JOIN) waits until every alias its equalities reach is bound: its NULL row depends on all.
    Worked out once per plan and start (callers only read it)."""
    return plan.once(("join_order", start), lambda: _join_order(plan, start))


def _join_order(plan: ViewPlan, start: int) -> list[Step]:
    bound = [plan.tables[start].alias]
    order: list[Step] = []
    remaining = [t.alias for i, t in enumerate(plan.tables) if i != start]
    linked = [{alias for alias, _ in expr_columns(f)} for f in plan.filters]
    while remaining:
        steps = [(alias, _edges_to(plan, alias, bound)) for alias in remaining]
        steps = [s for s in steps if s[0] not in plan.outer or _all_bound(plan, s[0], bound)]
        step = next((s for s in steps if s[1]), None)
        if step is None:
            inner = [a for a in remaining if a not in plan.outer]
            theta = [a for a in inner if any(a in ls and ls & set(bound) for ls in linked)]
            step = ((theta or inner)[0], [])
        order.append(step)
        bound.append(step[0])
        remaining.remove(step[0])
    return order


def _all_bound(plan: ViewPlan, alias: str, bound: list[str]) -> bool:
    """Whether every alias an outer alias's equalities reach is bound (its step needs them)."""
    return set(plan.outer_partners(alias)) <= set(bound)


def _edges_to(plan: ViewPlan, alias: str, bound: list[str]) -> list[tuple[str, str, str]]:
    edges = []
    for edge in plan.edges:
        if edge.left.alias == alias and edge.right.alias in bound:
            edges.append((edge.left.column, edge.right.alias, edge.right.column))
        elif edge.right.alias == alias and edge.left.alias in bound:
            edges.append((edge.right.column, edge.left.alias, edge.left.column))
    return edges


class _Side:
    """Rows of one table matching column = value (or all of them), before or after the
    changes."""

    def __init__(self, changes: Changes, rows_where: RowsWhere) -> None:
        self.changes = changes
        self.rows_where = rows_where
        self._snapshot: dict[tuple[str, str | None, Any], list[Row]] = {}
        self._changed: dict[tuple[str, str, bool], dict[Any, list[Row]]] = {}

    async def fetch(self, table: str, column: str | None, values: set[Any]) -> None:
        """Reads the snapshot rows for every value not read yet, in one call (column None:
        the whole table, once)."""
        missing = [v for v in values if (table, column, v) not in self._snapshot]
        if not missing:
            return
        changed = self.changes.get(table, {})
        found = await self.rows_where(table, column, [] if column is None else missing)
        for value in missing:
            rows = found.get(value, [])
            self._snapshot[(table, column, value)] = [r for k, r in rows if k not in changed]

    def rows(self, table: str, column: str, value: Any, new: bool) -> list[Row]:
        snapshot = self._snapshot[(table, column, value)]
        return snapshot + self._changed_rows(table, column, new).get(value, [])

    def every_row(self, table: str, new: bool) -> list[Row]:
        """The whole table (after ``fetch(table, None, {None})``), this side of the changes."""
        changed = self.changes.get(table, {}).values()
        side = [after if new else before for before, after in changed]
        return self._snapshot[(table, None, None)] + [r for r in side if r is not None]

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
    merging them is harmless). A UNION ALL's delta is the sum of its branches' deltas, each
    over its own tables (a table in two branches counts in both)."""
    out = await _branch_delta(view, changes, rows_where)
    for branch in view.branches:
        for key, delta in (await _branch_delta(branch, changes, rows_where)).items():
            accumulate(out.setdefault(key, {}), delta)
    return out


async def _branch_delta(
    view: ViewState, changes: Changes, rows_where: RowsWhere
) -> dict[bytes, Row]:
    """One SELECT's delta. Each filter applies as soon as the aliases it reads are bound, so
    a theta join's predicate prunes the rows its scan step brings. A change to an outer
    alias's table moves its inner-join tuples and flips the NULL-row tuples of the keys whose
    matches come or go (``_flips``)."""
    plan = view.plan
    side = _Side(changes, rows_where)
    out: dict[bytes, Row] = {}
    for i, table_ref in enumerate(plan.tables):
        table_changes = changes.get(table_ref.table)
        if not table_changes:
            continue
        partial: list[Binding] = []
        for old, new in table_changes.values():
            if new is not None:
                partial.append((1, {table_ref.alias: new}))
            if old is not None:
                partial.append((-1, {table_ref.alias: old}))
        await _join_from(view, side, i, partial, {table_ref.alias}, out)
        if table_ref.alias in plan.outer:
            flips = await _flips(view, side, table_ref.alias, table_changes)
            await _join_from(view, side, i, flips, set(), out)
    return out


async def _join_from(
    view: ViewState,
    side: _Side,
    i: int,
    partial: list[Binding],
    bound: set[str],
    out: dict[bytes, Row],
) -> None:
    """Joins tuples that bind alias ``i`` with the other aliases (those before ``i`` after
    the changes, those after it before them) and merges them into ``out``. A flip's tuples
    bind the outer alias ``i`` to its key only (not in ``bound``): its NULL row, once the
    others are joined."""
    plan = view.plan
    position = plan.once("alias_positions", lambda: {t.alias: n for n, t in enumerate(plan.tables)})
    start = plan.tables[i].alias
    pending = _Filters(view)
    partial = pending.apply(partial, bound)
    for alias, edges in join_order(plan, i):
        new = position[alias] < i
        if edges:
            partial = await _lookup_step(view, side, partial, alias, edges, new=new)
        else:
            partial = await _scan_step(plan, side, partial, alias, new=new)
        bound.add(alias)
        partial = pending.apply(partial, bound)
    if start not in bound:
        partial = pending.apply([(s, {**b, start: NULL_ROW}) for s, b in partial], {*bound, start})
    for sign, binding in partial:
        for alias in view.weighted:  # a view's row counts as often as it is there
            sign *= binding[alias][MULTIPLICITY]
        lookup = view.lookup(binding)
        key = view.group_key(lookup, binding)
        accumulate(out.setdefault(key, {}), view.tuple_delta(lookup, sign, binding))


async def _flips(
    view: ViewState,
    side: _Side,
    alias: str,
    table_changes: dict[bytes, tuple[Row | None, Row | None]],
) -> list[Binding]:
    """For each key of the outer alias's equalities whose matching rows go from none to some
    (-1) or from some to none (+1) over the whole batch, a tuple binding the alias to that key:
    its NULL-row tuples leave or come. Counting over the batch's before and after states makes
    several changes to one key (0 -> 2 -> 0) one net flip or none; a NULL key matches nothing."""
    plan = view.plan
    table = plan.table_of(alias)
    columns = list(
        dict.fromkeys(c for c, _, _ in _edges_to(plan, alias, list(plan.outer_partners(alias))))
    )
    keys = set()
    for rows in table_changes.values():
        for row in rows:
            key = None if row is None else tuple(row.get(c) for c in columns)
            if key is not None and None not in key:
                keys.add(key)
    await side.fetch(table, columns[0], {key[0] for key in keys})
    flips: list[Binding] = []
    for key in keys:
        counts = [
            sum(
                all(row.get(c) == v for c, v in zip(columns, key, strict=True))
                for row in side.rows(table, columns[0], key[0], new=new)
            )
            for new in (False, True)
        ]
        if (counts[0] == 0) != (counts[1] == 0):
            flips.append(
                (1 if counts[1] == 0 else -1, {alias: dict(zip(columns, key, strict=True))})
            )
    return flips


class _Filters:
    """The view's filters not applied yet to one join's partial tuples."""

    def __init__(self, view: ViewState) -> None:
        self.view = view
        self.left: list[tuple[Callable[[Any], Any], frozenset[str]]] = []
        if view.filters:
            needs = view.plan.once("filter_aliases", lambda: _filter_aliases(view.plan))
            self.left = list(zip(view.filters, needs, strict=True))

    def apply(self, partial: list[Binding], bound: set[str]) -> list[Binding]:
        """Keeps the tuples every filter over bound aliases only passes (TRUE, not NULL)."""
        if not self.left:  # none left (or none at all): every tuple passes
            return partial
        ready = [check for check, needs in self.left if needs <= bound]
        if not ready or not partial:
            return partial
        self.left = [(check, needs) for check, needs in self.left if not needs <= bound]
        lookup = self.view.lookup
        return [(s, b) for s, b in partial if all(check(lookup(b)) for check in ready)]


def _filter_aliases(plan: ViewPlan) -> list[frozenset[str]]:
    """The aliases each of the plan's filters reads."""
    return [frozenset(alias for alias, _ in expr_columns(tree)) for tree in plan.filters]


async def _lookup_step(
    view: ViewState,
    side: _Side,
    partial: list[Binding],
    alias: str,
    edges: list[tuple[str, str, str]],
    new: bool,
) -> list[Binding]:
    """Extends each partial tuple by the rows of ``alias`` its equalities find (by index;
    none for a NULL key or a value the column cannot hold: 2.5 never equals an INT column);
    for an outer alias (a LEFT JOIN), by its NULL row where there is none."""
    table = view.plan.table_of(alias)
    column, bound_alias, bound_column = edges[0]
    target = Column(column, view.column_type(alias, column))
    # the stored value is the target's own where both columns store one exact form of it
    same_type = view.column_type(bound_alias, bound_column) == target.type
    exact = _EXACT.get(target.type.kind) if same_type else None
    wanted: list[tuple[int, dict[str, Row], Any]] = []
    for sign, binding in partial:
        stored = binding[bound_alias].get(bound_column)
        if stored is not None and type(stored) is not exact:
            value = view.lookup(binding)(bound_alias, bound_column)
            try:
                stored = to_storage(target, value, table=table)
            except Exception:
                stored = None
        wanted.append((sign, binding, stored))
    await side.fetch(table, column, {stored for _, _, stored in wanted if stored is not None})
    none = [NULL_ROW] if alias in view.plan.outer else []
    more = edges[1:]
    extended: list[Binding] = []
    for sign, binding, stored in wanted:
        rows = [] if stored is None else side.rows(table, column, stored, new=new)
        if more:
            rows = [
                row
                for row in rows
                if all(_equal(view, {**binding, alias: row}, alias, c, a, b) for c, a, b in more)
            ]
        extended += [(sign, {**binding, alias: row}) for row in rows or none]
    return extended


async def _scan_step(
    plan: ViewPlan, side: _Side, partial: list[Binding], alias: str, new: bool
) -> list[Binding]:
    """Extends each partial tuple by every row of ``alias``'s table (read once per delta, at
    the snapshot): a cross product, which the filters then prune."""
    if not partial:
        return partial
    table = plan.table_of(alias)
    await side.fetch(table, None, {None})
    rows = side.every_row(table, new=new)
    return [(sign, {**binding, alias: row}) for sign, binding in partial for row in rows]


# column kinds whose storage form is one Python type, exactly the value: a join key read
# from a column of the same type is the looked-up column's stored value as it is
_EXACT: dict[str, type] = {"INT": int, "DECIMAL": int, "TEXT": str, "DATE": int}


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
