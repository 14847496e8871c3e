"""Pass 0d, in refresh = 'cumulus' (and ``aggview m3``): a view of rows without aggregates whose
WHERE keeps them ``x IN (SELECT y FROM t ... WHERE w)`` (or ``EXISTS (SELECT ... FROM t ...
WHERE w)``, the same without ``x = y``), where ``w`` holds a subquery of its own (TPC-H Q20:
suppliers with a part whose stock exceeds half of what they shipped), is read as a join with
the subquery's rows, grouped by every key of the view's own tables:

``SELECT a.c FROM a WHERE a.x IN (SELECT t.y FROM t WHERE w)`` becomes
``SELECT a.c FROM a, t WHERE a.x = t.y AND w GROUP BY a.<primary key>, a.c`` (SELECT
DISTINCT: ``GROUP BY a.c`` alone, each shown row once).

A row of ``a`` joins as many rows of ``t`` as ``y`` matches its ``x`` (none: a NULL ``x``, or
no match); grouped by ``a``'s primary key it is one group while it joins any, and the group's
row shows ``a.c`` once: the rows ``IN`` keeps, once each, duplicates of ``a.c`` from distinct
rows of ``a`` included (primary keys are NOT NULL, so every row of ``a`` is a group of its
own). ``w``'s subqueries become the view's own, one level of nesting where ``IN`` over them was
two, which cumulus maintains. Left as it was (and refused further on where cumulus cannot take
it): a view with aggregates, GROUP BY, a star, an outer join or a FROM subquery; an
``IN`` subquery that is not a plain filtered inner join of tables (``inline_from``'s simple
subquery) of one column, or whose aliases the view uses.
"""

from __future__ import annotations

from sqlglot import exp

from cumulus.passes.check_support import AGGREGATES
from cumulus.passes.inline_from import (
    Schema,
    alias_of,
    inner_joins_of_tables,
    inside,
    naming_scope,
    qualify_columns,
    simple,
    table_sources,
)
from cumulus.passes.typecheck import conjuncts


def grouped_semi_joins(
    select: exp.Select, schema: Schema, *, only_reaching_out: bool = False
) -> exp.Select:
    """``select`` with each such ``IN`` read as a join and the view grouped by its tables'
    keys (module docstring); ``select`` itself where there is none. ``only_reaching_out``
    (refresh = 'sync' and 'async', whose hidden views take one level of correlation): only
    where a subquery inside the IN's reads the view's own tables, two levels out."""
    if not _plain_rows(select):
        return select
    outer = table_sources(select, schema)
    if outer is None:
        return select
    form = select.copy()
    if not qualify_columns(form, outer):
        return select
    where = form.args.get("where")
    terms = list(conjuncts(where.this)) if where is not None else []
    taken = set(outer)
    kept: list[exp.Expression] = []
    added: list[exp.Expression] = []
    for conjunct in terms:
        merged = _merged(conjunct, schema, taken, set(outer) if only_reaching_out else None)
        if merged is None:
            kept.append(conjunct)
            continue
        tables, conditions = merged
        form.set("joins", [*(form.args.get("joins") or []), *(exp.Join(this=t) for t in tables)])
        added += conditions
    if not added:
        return select
    form.set("where", exp.Where(this=exp.and_(*kept, *added)))
    keys = [
        exp.column(name, table=alias, quoted=True)
        for alias, table in outer.items()
        for name in table.primary_key
    ]
    if form.args.get("distinct") is not None:  # its rows once each: grouped by them alone
        keys = []
        form.set("distinct", None)
    shown = [item.unalias().copy() for item in form.expressions]
    form.set("group", exp.Group(expressions=[*keys, *(s for s in shown if s not in keys)]))
    return form


def _plain_rows(select: exp.Select) -> bool:
    """A view of rows (or of DISTINCT rows): no aggregate, grouping, star or outer join."""
    if any(select.args.get(k) for k in ("group", "having", "order", "limit", "with_")):
        return False
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        return False  # DISTINCT ON
    for item in select.expressions:
        if item.find(exp.Star) or item.find(exp.Subquery, exp.Exists, *AGGREGATES):
            return False
    return inner_joins_of_tables(select)


def _merged(
    conjunct: exp.Expression, schema: Schema, taken: set[str], reaching: set[str] | None
) -> tuple[list[exp.Expression], list[exp.Expression]] | None:
    """For ``x IN (SELECT y FROM t ... WHERE w)`` with a subquery in ``w`` (that reads one of
    the aliases ``reaching``, unless None): ``t ...`` (its tables) and the terms of ``x = y AND
    w``, its aliases added to ``taken``; for ``EXISTS (SELECT ... FROM t ... WHERE w)``, the
    terms of ``w``; else None."""
    if isinstance(conjunct, exp.In) and conjunct.args.get("query") is not None:
        sub = conjunct.args["query"].this
        if not isinstance(sub, exp.Select) or len(sub.expressions) != 1:
            return None
    elif isinstance(conjunct, exp.Exists):
        sub = conjunct.this
    else:
        return None
    if not simple(sub) or sub.args.get("where") is None:
        return None
    if not any(s is not sub for s in sub.find_all(exp.Select)):
        return None  # one level already: IN over it is maintained as it is
    if reaching is not None and not _reads_out(sub, reaching):
        return None
    sub = sub.copy()
    sources = table_sources(sub, schema)
    if sources is None or set(sources) & taken or not qualify_columns(sub, sources):
        return None
    taken |= set(sources)
    joins = sub.args.get("joins") or []
    tables = [sub.args["from_"].this, *(join.this for join in joins)]
    assert [alias_of(t) for t in tables] == list(sources)
    ons = [join.args["on"] for join in joins if join.args.get("on") is not None]  # inner joins
    conditions = [c.copy() for on in ons for c in conjuncts(on)]
    if isinstance(conjunct, exp.In):
        shown = sub.expressions[0].unalias().copy()
        conditions.insert(0, exp.EQ(this=conjunct.this.copy(), expression=shown))
    conditions += [c.copy() for c in conjuncts(sub.args["where"].this)]
    return [t.copy() for t in tables], conditions


def _reads_out(sub: exp.Select, outer: set[str]) -> bool:
    """Whether a subquery inside ``sub`` reads a column of an ``outer`` alias named outside
    ``sub`` (two levels out or more; ``sub``'s own correlation is one level, which hidden
    views take)."""
    for column in sub.find_all(exp.Column):
        if column.table in outer:
            scope, levels = naming_scope(column)
            if scope is not None and levels >= 2 and scope is not sub and not inside(scope, sub):
                return True
    return False
