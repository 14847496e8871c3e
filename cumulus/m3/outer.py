"""LEFT JOIN in M3: a view over ``a LEFT JOIN b ON a.k = b.k`` is the sum of two SELECTs.

- T1 (matched): the inner join ``A(...) * B(...)``, the plan's factors as they are;
- T2 (unmatched): ``A(...) * (c ^= Rows_B[k]) * {c = 0 OR k IS NULL}``, every column of b
  NULL: read as a join with the hidden DISTINCT view of b's join keys, kept where none
  matched, which is how ``lift_subqueries`` writes a correlated NOT EXISTS (so the M3
  compiler's anti-join, ``_Compiler.anti_join``, maintains it: the lift's domain is the key
  an update of b binds).

The two are branches of one view whose groups add up (as a UNION ALL's). In T2 a GROUP BY
item of b is a NULL group, an aggregate whose argument is NULL there takes nothing from it
(COUNT(*) counts its rows), and WHERE is evaluated with b's columns NULL (``b.x > 5`` drops
T2, ``b.x IS NULL`` keeps it). Each outer alias splits every branch in two, so chains of
LEFT JOINs (each matched by equalities with inner tables, as the plan requires) and a FULL
JOIN's two LEFT-JOIN branches follow.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlglot import exp

from aggview import errors
from aggview.schema import TableSchema
from cumulus.compiler import CreateView, compile_view
from cumulus.expressions import STRICT, compile_predicate
from cumulus.passes.check_support import parse_select
from cumulus.passes.union_plans import NOTHING
from cumulus.plan import ColumnRef, Expr, JoinEdge, TableRef, ViewPlan, expr_columns

TableLookup = Callable[[str], TableSchema]


DEPTH_REFUSAL = (
    "an outer join (LEFT, RIGHT or FULL JOIN) is compiled at every level, not at a bounded "
    "--depth: its unmatched rows read a map of the other table's rows per key"
)


def split_outer(
    plan: ViewPlan, table: TableLookup, nested: dict[str, ViewPlan], depth: int | None = None
) -> ViewPlan:
    """``plan`` with each LEFT JOIN over a base table as matched and unmatched branches; the
    hidden DISTINCT views the unmatched ones read are added to ``nested`` (by name). At a
    bounded ``depth`` (``aggview m3 --depth``) refused: a lift reads maps, never relations."""
    pieces: list[ViewPlan] = []
    for branch in plan.branch_plans():
        done = [branch]
        for alias in branch.outer:
            filtered = _filtered_table(nested.get(branch.table_of(alias)))
            if filtered is None and branch.table_of(alias) in nested:
                continue  # NOT EXISTS, NOT IN, a grouped subquery: the compiler's to judge
            if depth is not None:
                raise errors.InvalidArgument(DEPTH_REFUSAL)
            done = [p for q in done for p in _split(q, alias, table, nested, filtered)]
        pieces += done
    if len(pieces) == 1 and pieces[0] is plan:
        return plan
    first = replace(plan, **_body(pieces[0]), branches=())
    return replace(first, branches=tuple(pieces[1:]))


def _body(piece: ViewPlan) -> dict[str, Any]:
    """The fields a branch has of its own."""
    return {
        "tables": piece.tables,
        "edges": piece.edges,
        "filters": piece.filters,
        "group_by": piece.group_by,
        "aggregates": piece.aggregates,
        "outer": piece.outer,
    }


def _filtered_table(hidden: ViewPlan | None) -> ViewPlan | None:
    """``hidden`` where it is one table's rows filtered, every column as it is (``SELECT *
    FROM b WHERE ...``: what ``push_outer_filters`` makes of a LEFT JOIN's ON conditions on
    its own table), else None."""
    if hidden is None or hidden.shape != "bag" or len(hidden.tables) != 1:
        return None
    if hidden.nested or hidden.hidden or hidden.branches or hidden.outer or not hidden.filters:
        return None
    (ref,) = hidden.tables
    for group in hidden.group_by:  # each column of the table, under its own name
        if group.ref is None or (group.ref.alias, group.ref.column) != (ref.alias, group.name):
            return None
    return hidden


def _split(
    plan: ViewPlan,
    alias: str,
    table: TableLookup,
    nested: dict[str, ViewPlan],
    filtered: ViewPlan | None = None,
) -> list[ViewPlan]:
    """The matched and unmatched branches for one outer alias (one left out where WHERE
    keeps none of its rows; at least one kept). ``filtered``: the alias reads that hidden
    view, one table's rows under the LEFT JOIN's own conditions: its table, those conditions
    in the matched branch and in the unmatched one's key view."""
    if filtered is not None:
        (inner,) = filtered.tables
        on = tuple(
            _with_columns(f, inner.alias, lambda column: {"col": [alias, column]})
            for f in filtered.filters
        )
        tables = tuple(
            replace(t, table=inner.table) if t.alias == alias else t for t in plan.tables
        )
        plan = replace(plan, tables=tables)
    else:
        on = ()
    schema = table(plan.table_of(alias))
    keys: list[str] = []
    edges: list[JoinEdge] = []
    for edge in plan.edges:
        if alias not in (edge.left.alias, edge.right.alias):
            edges.append(edge)
            continue
        mine, other = (edge.left, edge.right)
        if other.alias == alias:
            mine, other = other, mine
        edges.append(JoinEdge(other, ColumnRef(alias, f"c{len(keys)}")))
        keys.append(mine.column)
    matched = replace(
        plan, outer=tuple(a for a in plan.outer if a != alias), filters=(*plan.filters, *on)
    )
    hidden = _keys_view(plan.table_of(alias), keys, table, nested, filtered)
    types = {c.name: str(c.type) for c in schema.columns}

    def null(expr: Any) -> Any:
        """``expr`` with b's columns as typed NULLs."""
        return _with_columns(expr, alias, lambda column: {"null": True, "type": types[column]})

    filters: list[Expr] = []
    kept = True
    for pred in plan.filters:
        if not any(a == alias for a, _ in expr_columns(pred)):
            filters.append(pred)
            continue
        pred = null(pred)
        if any(True for _ in expr_columns(pred)):
            filters.append(pred)
        elif not compile_predicate(pred)(lambda _a, _c: None):
            kept = False  # b's NULL row fails WHERE: no unmatched row is there
    filters.append({"not": {"notnull": {"col": [alias, "c0"]}}})
    group_by = tuple(
        g
        if not any(a == alias for a, _ in expr_columns(g.source()))
        else replace(g, ref=None, expr=null(g.source()))
        for g in plan.group_by
    )
    aggregates = tuple(
        a
        if a.arg is None or not any(x == alias for x, _ in expr_columns(a.arg))
        else replace(a, arg=NOTHING if _null(null(a.arg)) else null(a.arg))
        for a in plan.aggregates
    )
    unmatched = replace(
        plan,
        tables=tuple(TableRef(alias, hidden) if t.alias == alias else t for t in plan.tables),
        edges=tuple(edges),
        filters=tuple(filters),
        group_by=group_by,
        aggregates=aggregates,
    )
    never = set(keys) | {c.name for c in schema.columns if not c.nullable}
    empty = any(_null_test(f, alias) in never for f in plan.filters)  # b.k IS NULL, matched
    # (kept where T2 feeds an aggregate nothing: a column needs a branch's part, here of 0)
    empty = empty and all(x.arg != NOTHING for x in aggregates if x.arg is not None)
    out = ([] if empty else [matched]) + ([unmatched] if kept else [])
    return out or [matched]


def _with_columns(expr: Any, alias: str, made: Callable[[str], Expr]) -> Any:
    """``expr`` with each column of ``alias`` replaced by ``made(column)``."""
    if isinstance(expr, dict):
        col = expr.get("col")
        if col is not None and col[0] == alias:
            return made(col[1])
        return {k: _with_columns(v, alias, made) for k, v in expr.items()}
    if isinstance(expr, list):
        return [_with_columns(v, alias, made) for v in expr]
    return expr


def _null_test(pred: Expr, alias: str) -> str | None:
    """The column of ``alias`` that ``pred`` says IS NULL, else None."""
    col = pred.get("not", {}).get("notnull", {}).get("col")
    return col[1] if col is not None and col[0] == alias else None


def _null(expr: Expr) -> bool:
    """Whether ``expr`` is NULL whatever the row (a NULL outside CASE, COALESCE, GREATEST and
    LEAST)."""
    if "null" in expr:
        return True
    if "op" in expr:
        return any(_null(a) for a in expr["args"])
    if "neg" in expr:
        return _null(expr["neg"])
    if expr.get("fn") in STRICT:  # ABS, EXTRACT, SUBSTRING of NULL
        return _null(expr["args"][0])
    return False


def _keys_view(
    name: str,
    keys: list[str],
    table: TableLookup,
    nested: dict[str, ViewPlan],
    filtered: ViewPlan | None = None,
) -> str:
    """The hidden ``SELECT DISTINCT k AS c0, ... FROM b`` (its rows map: b's rows per key);
    over ``filtered`` (b's rows under the LEFT JOIN's own conditions), its FROM and WHERE."""
    hidden = f"__{name}_by_{'_'.join(keys)}"
    source: exp.Select = exp.select("*").from_(exp.table_(name, quoted=True))
    if filtered is not None:
        source = parse_select(filtered.sql)
        hidden += "_where_" + hashlib.sha1(filtered.sql.encode()).hexdigest()[:8]
    if hidden not in nested:
        items = [exp.alias_(exp.column(k, quoted=True), f"c{i}") for i, k in enumerate(keys)]
        select = source.select(*items, append=False).distinct()
        create = CreateView(hidden, False, "sync", 0, select.sql())
        nested[hidden] = compile_view(create, table)
    return hidden
