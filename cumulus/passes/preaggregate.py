"""Pass 0b, in refresh = 'cumulus' (and ``aggview m3``): a view over a per-row aggregate of a
LEFT JOIN becomes a view over the outer table with a LEFT JOIN lookup of the pre-aggregated
inner table, which Cumulus maintains as one nested aggregate (a map lift) instead of a
subquery over a subquery.

``FROM (SELECT t.k, ..., COUNT(s.x) AS n, SUM(s.y) AS m FROM t LEFT JOIN s ON t.k = s.fk AND
c(s) WHERE w(t) GROUP BY t.k, ...) d``, the only FROM item of the view, where the GROUP BY
covers t's primary key (each group is one row of t) and the aggregates read only s, becomes
``FROM t LEFT JOIN (SELECT s.fk, COUNT(s.x) AS n, SUM(s.y) AS m FROM s WHERE c(s) GROUP BY
s.fk) g ON t.k = g.fk WHERE w(t)``, the view's ``d.n`` read as ``COALESCE(g.n, 0)`` and
``d.m`` as ``g.m``: for one row of t, its LEFT JOIN's matches are the s rows the ON keeps, the
ones the grouped subquery aggregates at its key (NULL where none matched, 0 for a COUNT).
TPC-H Q13's histogram of orders per customer is this shape. COUNT(*) (1 for an unmatched
row), DISTINCT aggregates, a WHERE or a GROUP BY reading s, and anything else leave the query
as it was (a hidden view).
"""

from __future__ import annotations

from sqlglot import exp

from cumulus.passes.inline_from import (
    Schema,
    alias_of,
    fresh_alias,
    qualify_columns,
    replace_columns,
    table_sources,
)
from cumulus.sqltext import identifier

_PER_ROW = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)


def preaggregate_left_join(select: exp.Select, schema: Schema) -> exp.Select:
    """``select`` over the outer table and a pre-aggregated LEFT JOIN (module docstring), or
    ``select`` unchanged where its FROM is not that shape."""
    first = select.args.get("from_")
    node = first.this if first is not None else None
    if not isinstance(node, exp.Subquery) or select.args.get("joins"):
        return select
    alias = node.args.get("alias")
    if alias is None or alias.this is None or alias.args.get("columns"):
        return select
    inner = node.this
    if not isinstance(inner, exp.Select) or not _grouped_left_join(inner):
        return select
    inner = inner.copy()
    sources = table_sources(inner, schema)
    if sources is None or len(sources) != 2 or not qualify_columns(inner, sources):
        return select
    (join,) = inner.args["joins"]
    outer_table, joined = inner.args["from_"].this, join.this
    t, s = alias_of(outer_table), alias_of(joined)
    pairs, conditions = _on(join.args.get("on"), t, s)
    where = inner.args.get("where")
    if not pairs or (where is not None and _aliases(where) - {t}):
        return select
    groups = inner.args["group"].expressions
    grouped = {identifier(g.this, "column") for g in groups if _of(g, t)}
    if len(grouped) != len(groups) or not set(sources[t].primary_key) <= grouped:
        return select  # a group is one row of t only where it holds t's key
    name = identifier(alias.this, "table alias")
    lookup = fresh_alias(f"{name}_{s}", {t, s, name})
    keys = [identifier(c.this, "column") for _, c in pairs]
    outputs: dict[str, exp.Expression] = {}
    aggregates: list[exp.Expression] = []
    for item in inner.expressions:
        shown = item.alias_or_name
        value = item.unalias()
        if not shown or shown in outputs or shown in keys:
            return select
        if isinstance(value, exp.Column) and _of(value, t) and value.name in grouped:
            outputs[shown] = value.copy()
            continue
        if not _reads_only(value, s):
            return select
        aggregates.append(exp.alias_(value.copy(), shown, quoted=True))
        read: exp.Expression = exp.column(shown, table=lookup, quoted=True)
        if isinstance(value, exp.Count):  # no row matched: 0, as COUNT over the NULL row
            read = exp.func("COALESCE", read, exp.Literal.number(0))
        outputs[shown] = read
    if not aggregates:
        return select
    columns = [exp.alias_(c.copy(), identifier(c.this, "column"), quoted=True) for _, c in pairs]
    pre = exp.select(*columns, *aggregates).from_(joined.copy())
    if conditions:
        pre = pre.where(exp.and_(*conditions))
    pre = pre.group_by(*(c.copy() for _, c in pairs))
    on = exp.and_(
        *(
            exp.EQ(this=o.copy(), expression=exp.column(k, table=lookup, quoted=True))
            for (o, _), k in zip(pairs, keys, strict=True)
        )
    )
    outer = select.copy()
    if not replace_columns(outer, name, outputs, {}):
        return select
    outer.set("from_", exp.From(this=outer_table.copy()))
    subquery = exp.Subquery(
        this=pre, alias=exp.TableAlias(this=exp.to_identifier(lookup, quoted=True))
    )
    outer.set("joins", [exp.Join(this=subquery, side="LEFT", on=on)])
    if where is not None:
        kept = outer.args.get("where")
        both = exp.and_(where.this.copy(), kept.this) if kept is not None else where.this.copy()
        outer.set("where", exp.Where(this=both))
    return outer


def _grouped_left_join(inner: exp.Select) -> bool:
    """A grouped SELECT over one table LEFT JOINed with another by ON, nothing else nested."""
    if inner.args.get("group") is None or inner.args.get("from_") is None:
        return False
    if any(inner.args.get(k) for k in ("having", "distinct", "order", "limit", "with_")):
        return False
    joins = inner.args.get("joins") or []
    if len(joins) != 1 or joins[0].side != "LEFT" or joins[0].method:
        return False
    if joins[0].args.get("using") or joins[0].args.get("on") is None:
        return False
    if any(isinstance(n, exp.Select) and n is not inner for n in inner.find_all(exp.Select)):
        return False
    return isinstance(inner.args["from_"].this, exp.Table) and isinstance(joins[0].this, exp.Table)


def _on(
    on: exp.Expression, t: str, s: str
) -> tuple[list[tuple[exp.Column, exp.Column]], list[exp.Expression]]:
    """The ON's equalities of a column of ``t`` with one of ``s`` (as (t's, s's)) and its
    conditions on ``s`` alone; no pairs where another conjunct reads ``t``."""
    pairs: list[tuple[exp.Column, exp.Column]] = []
    conditions: list[exp.Expression] = []
    for conjunct in on.flatten() if isinstance(on, exp.And) else [on]:
        left, right = conjunct.this, conjunct.expression
        if isinstance(conjunct, exp.EQ) and isinstance(left, exp.Column):
            if isinstance(right, exp.Column) and {left.table, right.table} == {t, s}:
                pairs.append((left, right) if left.table == t else (right, left))
                continue
        if _aliases(conjunct) != {s}:
            return [], []
        conditions.append(conjunct.copy())
    if len({c.name for _, c in pairs}) != len(pairs):
        return [], []  # one of s's columns twice: its subquery would show it twice
    return pairs, conditions


def _aliases(node: exp.Expression) -> set[str]:
    return {c.table for c in node.find_all(exp.Column)}


def _of(node: exp.Expression, alias: str) -> bool:
    return isinstance(node, exp.Column) and node.table == alias


def _reads_only(value: exp.Expression, s: str) -> bool:
    """An aggregate of ``_PER_ROW`` over ``s``'s columns: not DISTINCT, not COUNT(*), no
    aggregate or window inside."""
    if not isinstance(value, _PER_ROW) or isinstance(value.this, exp.Star | exp.Distinct):
        return False
    if value.find(exp.Window) or any(a is not value for a in value.find_all(*_PER_ROW)):
        return False
    return _aliases(value) == {s}
