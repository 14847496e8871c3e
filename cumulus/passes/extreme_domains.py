"""Pass 0c, in refresh = 'cumulus' (and ``aggview m3``): MIN or MAX over a grouped subquery's
column, as a scalar subquery (TPC-H Q15's ``(SELECT MAX(total_revenue) FROM revenue)``), is
read over the rows the grouped subquery aggregates, each joined with its own group:

``SELECT MAX(g.t) FROM (SELECT k, SUM(y) AS t FROM f WHERE p GROUP BY k) g WHERE q`` becomes
``SELECT MAX(g.t) FROM f JOIN (SELECT k, SUM(y) AS t FROM f WHERE p GROUP BY k) g ON f.k = g.k
WHERE p AND q``.

Every row of f that p keeps has its group and every group has such a row, so both read the same
set of group values, and MIN and MAX do not count how often a value comes. Cumulus maintains the
new form as one nested aggregate (the group's value read at each row's key, its count map moved
between two values when a row changes it); the old one is a subquery over a subquery. The group
keys must be NOT NULL columns (a NULL key's group would join no row): refused by name where one
may be NULL. Anything else is left as it was (and refused further on where cumulus cannot
take it).
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from cumulus.passes.inline_from import Schema, inside, qualify_columns, table_sources
from cumulus.sqltext import identifier


def extreme_domains(select: exp.Select, schema: Schema) -> exp.Select:
    """``select`` in its domain form where it is itself that shape (a view of the top
    group's value), else with each scalar subquery of that shape in it so (module
    docstring); ``select`` itself where there is none."""
    top = _domain_form(select, schema)  # the view itself: MIN or MAX over one
    if top is not None:
        return top
    copy = select.copy()
    changed = False
    for node in list(copy.find_all(exp.Subquery)):
        if isinstance(node.parent, exp.From | exp.Join):
            continue  # a derived table, not a scalar
        form = _domain_form(node.this, schema)
        if form is not None:
            node.set("this", form)
            changed = True
    return copy if changed else select


def _domain_form(sub: exp.Expression, schema: Schema) -> exp.Select | None:
    if not isinstance(sub, exp.Select) or len(sub.expressions) != 1:
        return None
    if any(sub.args.get(k) for k in ("group", "having", "distinct", "order", "limit", "joins")):
        return None
    item = sub.expressions[0]
    extreme = item.unalias()
    if not isinstance(extreme, exp.Max | exp.Min) or not isinstance(extreme.this, exp.Column):
        return None
    derived = sub.args["from_"].this if sub.args.get("from_") is not None else None
    if not isinstance(derived, exp.Subquery) or not isinstance(derived.this, exp.Select):
        return None
    alias = derived.args.get("alias")
    if alias is None or alias.this is None or alias.args.get("columns"):
        return None
    g = identifier(alias.this, "table alias")
    inner = derived.this.copy()
    if not inner.args.get("group") or any(
        inner.args.get(k) for k in ("having", "distinct", "order", "limit", "with_")
    ):
        return None
    if inner.find(exp.Subquery, exp.Exists):
        return None
    sources = table_sources(inner, schema)
    if sources is None or g in sources or not qualify_columns(inner, sources):
        return None
    outputs = {item.alias_or_name: item.unalias() for item in inner.expressions}
    # the subquery's own columns: all of g, by g's alias or unqualified (no correlation)
    outside = [c for c in sub.find_all(exp.Column) if not inside(c, derived)]
    if any(c.table not in ("", g) or c.name not in outputs for c in outside):
        return None
    on: list[exp.Expression] = []
    for key in inner.args["group"].expressions:
        if not isinstance(key, exp.Column) or key.table not in sources:
            return None
        column = next((c for c in sources[key.table].columns if c.name == key.name), None)
        shown = [name for name, value in outputs.items() if value == key]
        if column is None or not shown:
            return None  # a key not shown: nothing to join it by
        if column.nullable:
            raise errors.InvalidArgument(
                f"MIN or MAX over a subquery grouped by {key.table}.{key.name}, which may be "
                "NULL, is maintained in refresh = 'sync' or 'async', not 'cumulus' (cumulus "
                "reads each group's value at its rows' key, and a NULL key's group matches no "
                "row; declare the column NOT NULL)"
            )
        on.append(exp.EQ(this=key.copy(), expression=exp.column(shown[0], table=g, quoted=True)))
    form = inner.copy()
    form.set("group", None)
    form.set("expressions", [_qualified(item.copy(), g)])
    joined = exp.Join(this=derived.copy(), on=exp.and_(*on))
    form.set("joins", [*(form.args.get("joins") or []), joined])
    where = sub.args.get("where")
    if where is not None:
        kept = _qualified(where.this.copy(), g)
        mine = form.args.get("where")
        form.set("where", exp.Where(this=exp.and_(mine.this, kept) if mine else kept))
    return form


def _qualified(node: exp.Expression, alias: str) -> exp.Expression:
    """``node`` with its unqualified columns read from ``alias`` (the grouped subquery's)."""
    for column in node.find_all(exp.Column):
        if not column.table:
            column.set("table", exp.to_identifier(alias))
    return node
