"""Pass 0: subqueries -> hidden views, each a sync view the rewritten query joins as a table
(views over views maintain them: ``cumulus.cascade``). Runs before every other pass, on the
parsed SELECT; what it cannot rewrite is refused naming it, and anything it leaves is refused
by ``check_support`` as before.

- ``FROM (SELECT ...) s``: the subquery is a hidden view, joined as ``s``.
- ``x IN (SELECT c FROM ...)`` and ``EXISTS (SELECT ... WHERE inner.a = outer.b AND ...)``, as
  conjuncts of WHERE: a join with a hidden DISTINCT view of the matching columns (a semi-join:
  each outer row counts once). An IN over a grouped subquery reads a DISTINCT view over it.
  An uncorrelated EXISTS is a cross join with a hidden ``COUNT(*)`` row, kept while positive.
- a scalar subquery in WHERE: uncorrelated, an aggregate without GROUP BY (one row, NULL or 0
  over none, as SQL has it), a cross join with that hidden one-row view; correlated by
  equalities, ``SUM``/``AVG``/``MIN``/``MAX`` or arithmetic over one (``0.2 * AVG(x)``) as an
  operand of a comparison of WHERE's conjunction (NULL over no rows, so the comparison is never
  TRUE then and an inner join with a view grouped by the correlation columns means the same).

A correlation is a column qualified by a table the subquery's FROM does not have; only
equalities between such a column (or expression of them) and the subquery's own columns
correlate.
- ``NOT EXISTS`` (correlated by columns) as a conjunct of WHERE: a LEFT JOIN with the hidden
  DISTINCT view of the correlation values, kept where none matched (an anti-join: an outer
  alias, ``cumulus.delta``); uncorrelated, a cross join with its COUNT(*), kept while 0.
- ``x NOT IN (SELECT c ...)`` (x and the correlations columns): exactly SQL's, NULLs included
  (``_anti_join_in``).

Other correlations, a grouped scalar subquery, a correlated COUNT, NOT IN or NOT EXISTS over a
grouped subquery, a correlated subquery in HAVING, subqueries in SELECT, ON or GROUP BY are
refused by name. A HAVING conjunct with an uncorrelated subquery filters the groups as a WHERE
over the grouped query (``_having_as_where``), where the above applies. In cumulus, HAVING's
uncorrelated scalars are read with the view instead (``_having_scalars``), and a WHERE conjunct
comparing group columns with such a scalar over a subquery in FROM moves to HAVING first
(``_where_scalars_as_having``: TPC-H Q15).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlglot import exp

from aggview import errors
from cumulus.passes.check_support import AGGREGATES, COMPARISONS, refuse
from cumulus.plan import HIDDEN_PREFIX
from cumulus.sqltext import identifier


@dataclass(frozen=True)
class Hidden:
    """A hidden view to create before the view that reads it: its name and its SELECT (which
    may hold subqueries of its own, lifted in turn)."""

    name: str
    select: exp.Select | exp.Union  # a union: compiled by ``passes.unions``


@dataclass
class Lifter:
    """Names hidden views (``__sub_<view>_<n>``, n counted over a whole tree of them) and
    collects them."""

    view: str
    numbers: Iterator[int]
    hidden: list[Hidden] = field(default_factory=list)

    def add(self, select: exp.Select | exp.Union) -> str:
        name = f"{HIDDEN_PREFIX}{self.view[:40]}_{next(self.numbers)}"
        self.hidden.append(Hidden(name, select))
        return name


def lift_subqueries(select: exp.Select, lifter: Lifter, read_scalars: bool = False) -> exp.Select:
    """``select`` (a copy) with its subqueries replaced by hidden views ``lifter`` collects;
    ``read_scalars`` (cumulus): HAVING's uncorrelated scalars as values read with the view
    (``_having_scalars``)."""
    select = select.copy()
    if read_scalars:
        _where_scalars_as_having(select)
        _having_scalars(select, lifter)
    select = _having_as_where(select)
    _lift_derived(select, lifter)
    _lift_where(select, lifter)
    left = select.find(exp.Subquery, exp.Exists)
    if left is not None:
        raise refuse("a subquery in SELECT, ON or GROUP BY (only in FROM, WHERE and HAVING)", left)
    return select


GROUPED = "__grouped"  # the alias of a grouped query whose HAVING had a subquery


def scalar_column(hidden: str, column: str) -> str:
    """The name HAVING reads a hidden one-row view's column by (``_having_scalars``)."""
    return f"{hidden}__{column}"


def _having_scalars(select: exp.Select, lifter: Lifter) -> None:
    """Cumulus: each uncorrelated scalar subquery of HAVING (an aggregate, no GROUP BY) is a
    hidden one-row view whose value HAVING reads as a column of its own (``scalar_column``),
    unjoined: the M3 program keeps the view's groups and the scalar's maps, and HAVING
    compares them when the view is read (TPC-H Q11), where a WHERE over the grouped query
    would be a subquery over a subquery. Left as it is where any subquery of HAVING is
    another kind (``_having_as_where`` takes it)."""
    having = select.args.get("having")
    found = _outermost_subqueries(having) if having is not None else []
    subs: list[tuple[exp.Subquery, exp.Select]] = []
    for node in found:  # (a derived table of one's FROM is lifted with that one's view)
        sub = node.this
        if not isinstance(node, exp.Subquery) or not isinstance(sub, exp.Select):
            return
        if isinstance(node.parent, exp.In) or sub.args.get("group") or sub.args.get("having"):
            return
        if len(sub.expressions) != 1 or not sub.expressions[0].find(*AGGREGATES):
            return
        if _subquery_beyond_from(sub) or _outer_columns(sub, _inner_aliases(sub)):
            return
        subs.append((node, sub))
    for node, sub in subs:
        item = exp.alias_(sub.expressions[0].unalias().copy(), "v0", quoted=True)
        local = _conjuncts(sub.args["where"].this) if sub.args.get("where") else []
        name = lifter.add(_hidden_select(sub, [item], local))
        node.replace(exp.column(scalar_column(name, "v0"), quoted=True))


def _where_scalars_as_having(select: exp.Select) -> None:
    """Cumulus: a WHERE conjunct comparing the rows' group columns (GROUP BY's, or every
    SELECT item of a view without aggregates) with an uncorrelated scalar subquery over a
    subquery (TPC-H Q15's ``total_revenue = (SELECT MAX(total_revenue) FROM revenue)``) is
    moved to HAVING: it is the same for every row of a group, so it keeps or drops whole groups
    either way, and as HAVING it is compared when the view is read (``_having_scalars``), where
    in WHERE it would be a subquery over a subquery."""
    where = select.args.get("where")
    if where is None:
        return
    grouped = select.args.get("group")
    items = grouped.expressions if grouped is not None else select.expressions
    if grouped is None and any(i.find(*AGGREGATES) for i in select.expressions):
        return  # one group of every row: nothing is the same for all of it but constants
    group_columns = [i.unalias() for i in items if isinstance(i.unalias(), exp.Column)]
    kept, moved = [], []
    for conjunct in _conjuncts(where.this):
        (moved if _group_scalar_comparison(conjunct, group_columns) else kept).append(conjunct)
    if not moved:
        return
    select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
    having = select.args.get("having")
    both = [having.this, *moved] if having is not None else moved
    select.set("having", exp.Having(this=exp.and_(*both)))


def _group_scalar_comparison(conjunct: exp.Expression, group_columns: list[exp.Column]) -> bool:
    """A comparison whose one subquery is an uncorrelated scalar over a subquery in FROM,
    anything else in it a group column or a constant (``x >= (SELECT MAX(t) ...) - 1``)."""
    if not isinstance(_unparen(conjunct), tuple(COMPARISONS)):
        return False
    tops = _outermost_subqueries(conjunct)
    if len(tops) != 1 or not isinstance(tops[0], exp.Subquery):
        return False
    sub = tops[0].this
    if not isinstance(sub, exp.Select) or sub.args.get("group") or _subquery_beyond_from(sub):
        return False
    if not any(isinstance(n.parent, exp.From | exp.Join) for n in sub.find_all(exp.Subquery)):
        return False  # over tables only: WHERE takes it as it is
    if _outer_columns(sub, _inner_aliases(sub)):
        return False  # correlated
    if any(not _nested(a, conjunct) for a in conjunct.find_all(*AGGREGATES)):
        return False

    def grouped(column: exp.Column) -> bool:
        same = [
            g
            for g in group_columns
            if g.name == column.name
            and (not g.table or not column.table or g.table == column.table)
        ]
        return len(same) == 1

    outside = [c for c in conjunct.find_all(exp.Column) if not _nested(c, conjunct)]
    return all(grouped(c) for c in outside)


def _outermost_subqueries(node: exp.Expression) -> list[exp.Expression]:
    """The subqueries and EXISTS of ``node`` that no other one of it holds."""
    found = node.find_all(exp.Subquery, exp.Exists)
    return [n for n in found if n is node or not _nested(n.parent, node)]


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _subquery_beyond_from(sub: exp.Select) -> bool:
    """Whether ``sub`` holds a subquery other than a derived table of its own FROM or JOINs
    (those are hidden views the scalar's own view reads, one nesting down)."""
    for found in sub.find_all(exp.Subquery, exp.Exists):
        holder = found.parent
        if not (isinstance(holder, exp.From | exp.Join) and holder.parent is sub):
            return True
    return False


def _having_as_where(select: exp.Select) -> exp.Select:
    """``SELECT g, SUM(x) AS s FROM t GROUP BY g HAVING SUM(x) > (SELECT ...)`` as ``SELECT
    g, s FROM (SELECT g, SUM(x) AS s FROM t GROUP BY g) __grouped WHERE __grouped.s > (SELECT
    ...)``: the HAVING conjuncts holding an uncorrelated subquery filter the groups as a WHERE
    over them, where subqueries are lifted (TPC-H Q11). The view is then a bag of the groups
    that pass, one row each, as the query's rows are. An aggregate those conjuncts read that no
    item shows becomes a column of the grouped query that the outer query does not show."""
    having = select.args.get("having")
    if having is None or not having.find(exp.Subquery, exp.Exists):
        return select
    if select.args.get("distinct"):
        raise refuse("DISTINCT beside a subquery in HAVING", having)
    names = []
    for item in select.expressions:
        if not isinstance(item, exp.Alias | exp.Column):
            raise refuse(
                "an unnamed expression beside a subquery in HAVING (name it: ... AS name)", item
            )
        names.append(item.alias_or_name)
    moved: list[exp.Expression] = []
    kept: list[exp.Expression] = []
    for conjunct in _conjuncts(having.this):
        (moved if conjunct.find(exp.Subquery, exp.Exists) else kept).append(conjunct)
    grouped = select.copy()
    grouped.set("having", exp.Having(this=exp.and_(*kept)) if kept else None)
    shown = {item.unalias(): item.alias_or_name for item in select.expressions}
    filters = []
    for conjunct in moved:
        for sub in conjunct.find_all(exp.Subquery, exp.Exists):
            query = sub.this
            if isinstance(query, exp.Select) and _outer_columns(query, _inner_aliases(query)):
                raise refuse("a correlated subquery in HAVING", sub)
        filters.append(_over_groups(conjunct.copy(), shown, grouped))
    outer = exp.select(*(_column(GROUPED, name) for name in names)).from_(
        exp.Subquery(this=grouped, alias=exp.TableAlias(this=exp.to_identifier(GROUPED)))
    )
    return outer.where(exp.and_(*filters))


def _over_groups(
    conjunct: exp.Expression, shown: dict[exp.Expression, str], grouped: exp.Select
) -> exp.Expression:
    """A HAVING conjunct with the grouped query's aggregates and group columns (outside its
    subqueries) as columns of ``GROUPED``; an aggregate no item shows is added as one."""

    for node in list(conjunct.find_all(*AGGREGATES, exp.Column)):
        if node.find_ancestor(exp.Subquery, exp.Exists) is not None:
            continue  # the subquery's own: lifted with it
        if isinstance(node, exp.Column) and node.find_ancestor(*AGGREGATES):
            continue
        name = shown.get(node)
        if name is None and isinstance(node, exp.Column):
            raise refuse("a column in HAVING beside a subquery that SELECT does not show", node)
        if name is None:
            name = f"having_{len(grouped.expressions)}"
            grouped.append("expressions", exp.alias_(node.copy(), name, quoted=True))
            shown[node.copy()] = name
        node.replace(_column(GROUPED, name))
    return conjunct


def _table(name: str, alias: str) -> exp.Table:
    return exp.Table(
        this=exp.to_identifier(name, quoted=True),
        alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
    )


def _join(select: exp.Select, table: exp.Table, on: exp.Expression | None) -> None:
    join = exp.Join(this=table, on=on) if on is not None else exp.Join(this=table, kind="CROSS")
    select.append("joins", join)


def _column(alias: str, name: str) -> exp.Column:
    return exp.column(name, table=alias, quoted=True)


def _lift_derived(select: exp.Select, lifter: Lifter) -> None:
    """``(SELECT ...) AS s`` in FROM or a JOIN -> the hidden view, as ``s``."""
    for holder in [select.args.get("from_"), *(select.args.get("joins") or [])]:
        node = holder.this if holder is not None else None
        if not isinstance(node, exp.Subquery):
            continue
        inner = node.this
        if not isinstance(inner, exp.Select | exp.Union):  # a union: ``passes.unions``
            raise refuse(f"{inner.key.upper()} in FROM", inner)
        alias = node.args.get("alias")
        if alias is None or alias.this is None:
            raise errors.InvalidArgument(
                f"a subquery in FROM needs an alias: ({inner.sql()}) AS name"
            )
        if alias.args.get("columns"):
            raise refuse("column aliases on a subquery in FROM", node)
        name = identifier(alias.this, "table alias")
        holder.set("this", _table(lifter.add(inner), name))


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    return list(node.flatten()) if isinstance(node, exp.And) else [node]


def _lift_where(select: exp.Select, lifter: Lifter) -> None:
    """Each conjunct of WHERE with a subquery -> joins with hidden views."""
    where = select.args.get("where")
    if where is None or not where.find(exp.Subquery, exp.Exists):
        return
    kept: list[exp.Expression] = []
    for conjunct in _conjuncts(where.this):
        bare = conjunct.unnest()
        if isinstance(bare, exp.In) and bare.args.get("query") is not None:
            kept.extend(_semi_join_in(select, bare, lifter))
        elif isinstance(bare, exp.Exists):
            kept.extend(_exists(select, bare, lifter, negated=False))
        elif isinstance(bare, exp.Not) and isinstance(bare.this.unnest(), exp.Exists):
            kept.extend(_exists(select, bare.this.unnest(), lifter, negated=True))
        elif (
            isinstance(bare, exp.Not)
            and isinstance(bare.this.unnest(), exp.In)
            and bare.this.unnest().args.get("query") is not None
        ):
            kept.extend(_anti_join_in(select, bare.this.unnest(), lifter))
        else:
            _refuse_negated(bare)
            kept.append(_lift_scalars(select, conjunct, lifter))
    select.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)


def _refuse_negated(node: exp.Expression) -> None:
    for found in node.find_all(exp.In, exp.Exists):
        if isinstance(found, exp.Exists) or found.args.get("query") is not None:
            negated = isinstance(found.parent, exp.Not)
            what = "EXISTS" if isinstance(found, exp.Exists) else "IN (SELECT ...)"
            if negated:
                raise refuse(f"NOT {what} under OR or an expression (only as a conjunct of WHERE)")
            raise refuse(f"{what} under OR, NOT or an expression (only as a conjunct of WHERE)")


def _inner_aliases(sub: exp.Select) -> set[str]:
    tables = [sub.args.get("from_"), *(sub.args.get("joins") or [])]
    names = set()
    for holder in tables:
        node = holder.this if holder is not None else None
        alias = node.args.get("alias") if node is not None else None
        if alias is not None and alias.this is not None:
            names.add(identifier(alias.this, "table alias"))
        elif isinstance(node, exp.Table):
            names.add(identifier(node.this, "table"))
    return names


def _outer_columns(node: exp.Expression, inner: set[str]) -> list[exp.Column]:
    """Columns of ``node`` qualified by a table the subquery does not have: correlations (a
    subquery nested in it has its own, lifted with the hidden view)."""
    return [
        c
        for c in node.find_all(exp.Column)
        if c.args.get("table") is not None
        and identifier(c.args["table"], "alias") not in inner
        and not _nested(c, node)
    ]


def _nested(column: exp.Column, top: exp.Expression) -> bool:
    """Whether a subquery below ``top`` holds ``column`` (one of ``top``'s descendants)."""
    node: exp.Expression | None = column
    while node is not None and node is not top:
        if isinstance(node, exp.Subquery | exp.Exists):
            return True
        node = node.parent
    return False


@dataclass
class Correlation:
    """A subquery's WHERE split: equalities (its own expression, the outer one), the rest."""

    pairs: list[tuple[exp.Expression, exp.Expression]]
    local: list[exp.Expression]
    # (its own column, the outer column) of ``inner.c <> outer.d``: EXISTS and NOT EXISTS only
    unequal: list[tuple[exp.Expression, exp.Expression]] = field(default_factory=list)


def _correlation(sub: exp.Select, unequal: bool = False) -> Correlation:
    """``unequal``: a ``<>`` between a column of its own and an outer column correlates too
    (``Correlation.unequal``; one at most, beside an equality)."""
    inner = _inner_aliases(sub)
    for key in ("expressions", "joins", "group", "having"):
        value = sub.args.get(key)  # a list, one clause (GROUP BY, HAVING) or None
        for part in value if isinstance(value, list) else [value] if value is not None else []:
            if isinstance(part, exp.Expression) and _outer_columns(part, inner):
                raise refuse("a subquery correlated outside its WHERE", part)
    where = sub.args.get("where")
    found = Correlation([], [])
    for conjunct in _conjuncts(where.this) if where is not None else []:
        if not _outer_columns(conjunct, inner):
            found.local.append(conjunct)
            continue
        bare = conjunct.unnest()
        if isinstance(bare, exp.EQ):
            left, right = bare.this, bare.expression
            if not _outer_columns(left, inner) and _outer_only(right, inner):
                found.pairs.append((left, right))
                continue
            if not _outer_columns(right, inner) and _outer_only(left, inner):
                found.pairs.append((right, left))
                continue
        if unequal and isinstance(bare, exp.NEQ) and not found.unequal:
            sides = [bare.this, bare.expression]
            owns = [isinstance(x, exp.Column) and not _outer_columns(x, inner) for x in sides]
            outers = [isinstance(x, exp.Column) and _outer_only(x, inner) for x in sides]
            if owns[0] and outers[1] or owns[1] and outers[0]:
                own, outer = sides if owns[0] else sides[::-1]
                found.unequal.append((own, outer))
                continue
        raise refuse("a subquery correlated by a condition other than an equality", conjunct)
    if found.unequal and not found.pairs:
        raise refuse("a subquery correlated by <> without an equality", found.unequal[0][0])
    return found


def _outer_only(node: exp.Expression, inner: set[str]) -> bool:
    """Whether ``node`` reads outer columns only (a column of the outer query)."""
    columns = list(node.find_all(exp.Column))
    return bool(columns) and len(_outer_columns(node, inner)) == len(columns)


def _hidden_select(
    sub: exp.Select, items: list[exp.Expression], local: list[exp.Expression]
) -> exp.Select:
    """``sub``'s FROM and joins with ``items`` as its SELECT and ``local`` as its WHERE."""
    hidden = exp.Select(expressions=items)
    hidden.set("from_", sub.args["from_"].copy())
    if sub.args.get("joins"):
        hidden.set("joins", [j.copy() for j in sub.args["joins"]])
    if local:
        hidden.set("where", exp.Where(this=exp.and_(*(c.copy() for c in local))))
    return hidden


def _grouped(sub: exp.Select) -> bool:
    return bool(sub.args.get("group") or sub.args.get("having")) or any(
        item.find(*AGGREGATES) for item in sub.expressions
    )


def _query(node: exp.Expression, what: str) -> exp.Select:
    sub = node.this if isinstance(node, exp.Subquery | exp.Exists) else node
    if not isinstance(sub, exp.Select):
        raise refuse(f"{sub.key.upper()} in {what}", sub)
    return sub


def _single(sub: exp.Select, what: str) -> exp.Expression:
    if len(sub.expressions) != 1 or isinstance(sub.expressions[0], exp.Star):
        raise errors.InvalidArgument(f"{what} needs a SELECT of one column: {sub.sql()}")
    return sub.expressions[0].unalias().copy()


def _matching(name: str, pairs: list[tuple[exp.Expression, exp.Expression]]) -> list[exp.EQ]:
    """Each correlation as an equality of the outer expression and the hidden view's column."""
    return [
        exp.EQ(this=outer.copy(), expression=_column(name, f"c{i}"))
        for i, (_, outer) in enumerate(pairs)
    ]


def _semi_join_in(select: exp.Select, node: exp.In, lifter: Lifter) -> list[exp.Expression]:
    """``x IN (SELECT c ...)`` -> a join with the DISTINCT values (and correlation columns)."""
    sub = _query(node.args["query"], "IN (...)")
    item = _single(sub, "IN (SELECT ...)")
    if isinstance(node.this, exp.Tuple):
        raise refuse("a row of values IN (SELECT ...)", node)
    found = _correlation(sub)
    if _grouped(sub):
        if found.pairs:
            raise refuse("IN over a grouped subquery correlated with the outer query", node)
        inner = sub.copy()
        inner.set("expressions", [exp.alias_(item, "v0", quoted=True)])
        hidden = exp.Select(expressions=[_column("s", "v0")]).from_(
            exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("s")))
        )
    else:
        items = [exp.alias_(item, "v0", quoted=True)]
        items += [
            exp.alias_(own.copy(), f"c{i}", quoted=True) for i, (own, _) in enumerate(found.pairs)
        ]
        hidden = _hidden_select(sub, items, found.local)
    hidden.set("distinct", exp.Distinct())
    name = lifter.add(hidden)
    match = exp.EQ(this=node.this.copy(), expression=_column(name, "v0"))
    _join(select, _table(name, name), exp.and_(match, *_matching(name, found.pairs)))
    return []


def _exists(
    select: exp.Select, node: exp.Exists, lifter: Lifter, negated: bool
) -> list[exp.Expression]:
    """``EXISTS (SELECT ... WHERE inner.a = outer.b ...)`` -> a join with the DISTINCT
    correlation values (a semi-join); ``NOT EXISTS`` -> a LEFT JOIN with them, kept where none
    matched (``c0 IS NULL``: a matched value equals a non-NULL outer one, an anti-join).
    Uncorrelated: a cross join with its COUNT(*), kept while positive (NOT: while 0)."""
    what = "NOT EXISTS" if negated else "EXISTS"
    sub = _query(node, f"{what} (...)")
    if _grouped(sub):
        raise refuse(f"{what} over a grouped subquery", node)
    found = _correlation(sub, unequal=True)
    if found.unequal:
        return _exists_other(select, sub, found, lifter, negated)
    if not found.pairs:
        count = exp.alias_(exp.Count(this=exp.Star()), "v0", quoted=True)
        name = lifter.add(_hidden_select(sub, [count], found.local))
        _join(select, _table(name, name), None)
        compare = exp.EQ if negated else exp.GT
        return [compare(this=_column(name, "v0"), expression=exp.Literal.number(0))]
    if negated and any(not isinstance(outer, exp.Column) for _, outer in found.pairs):
        raise refuse("NOT EXISTS correlated with an expression (only with a column)", node)
    items = [exp.alias_(own.copy(), f"c{i}", quoted=True) for i, (own, _) in enumerate(found.pairs)]
    hidden = _hidden_select(sub, items, found.local)
    hidden.set("distinct", exp.Distinct())
    name = lifter.add(hidden)
    on = exp.and_(*_matching(name, found.pairs))
    if not negated:
        _join(select, _table(name, name), on)
        return []
    select.append("joins", exp.Join(this=_table(name, name), on=on, side="LEFT"))
    return [exp.Is(this=_column(name, "c0"), expression=exp.Null())]


def _exists_other(
    select: exp.Select, sub: exp.Select, found: Correlation, lifter: Lifter, negated: bool
) -> list[exp.Expression]:
    """``[NOT] EXISTS (SELECT ... WHERE inner.a = outer.b AND inner.c <> outer.d ...)`` (TPC-H
    Q21: another supplier of the same order): the rows with ``c <> d`` are those with a
    non-NULL c, ``n`` per correlation, less those with ``c = d``, ``m`` per (correlation, c).
    Two hidden views, joined (``n``) and LEFT JOINed on d (``m``, none where no c equals d);
    EXISTS keeps ``d IS NOT NULL AND n - COALESCE(m, 0) > 0`` (a NULL d makes every ``<>``
    unknown), NOT EXISTS the rest (both LEFT JOINed: no row for the correlation is 0)."""
    own, outer = found.unequal[0]
    keys = [exp.alias_(k.copy(), f"c{i}", quoted=True) for i, (k, _) in enumerate(found.pairs)]
    counted = _hidden_select(
        sub, [*keys, exp.alias_(exp.Count(this=own.copy()), "n", quoted=True)], found.local
    )
    counted.set("group", exp.Group(expressions=[k.copy() for k, _ in found.pairs]))
    same = _hidden_select(
        sub,
        [
            *keys,
            exp.alias_(own.copy(), "cu", quoted=True),
            exp.alias_(exp.Count(this=exp.Star()), "m", quoted=True),
        ],
        found.local,
    )
    same.set("group", exp.Group(expressions=[*(k.copy() for k, _ in found.pairs), own.copy()]))
    n_view, m_view = lifter.add(counted), lifter.add(same)
    n_on = exp.and_(*_matching(n_view, found.pairs))
    if negated:
        select.append("joins", exp.Join(this=_table(n_view, n_view), on=n_on, side="LEFT"))
    else:
        _join(select, _table(n_view, n_view), n_on)
    m_on = exp.and_(
        *_matching(m_view, found.pairs), exp.EQ(this=outer.copy(), expression=_column(m_view, "cu"))
    )
    select.append("joins", exp.Join(this=_table(m_view, m_view), on=m_on, side="LEFT"))
    zero = exp.Literal.number(0)
    n = exp.Coalesce(this=_column(n_view, "n"), expressions=[zero.copy()])
    others = exp.Sub(
        this=n, expression=exp.Coalesce(this=_column(m_view, "m"), expressions=[zero.copy()])
    )
    if negated:
        none = exp.EQ(this=others, expression=zero.copy())
        return [exp.Paren(this=exp.or_(exp.Is(this=outer.copy(), expression=exp.Null()), none))]
    known = exp.Not(this=exp.Is(this=outer.copy(), expression=exp.Null()))
    return [known, exp.GT(this=others, expression=zero.copy())]


def _anti_join_in(select: exp.Select, node: exp.In, lifter: Lifter) -> list[exp.Expression]:
    """``x NOT IN (SELECT c ...)``, exactly as SQL has it: TRUE where the subquery (for this
    row's correlation) has no rows, else where x is not NULL, no c equals it and no c is NULL.
    Two hidden views: the DISTINCT (c, correlation) values, LEFT JOINed on x (an anti-join),
    and COUNT(*) and COUNT(c) per correlation, LEFT JOINed (uncorrelated: one row, crossed)."""
    sub = _query(node.args["query"], "NOT IN (...)")
    item = _single(sub, "NOT IN (SELECT ...)")
    found = _correlation(sub)
    if _grouped(sub):
        raise refuse("NOT IN over a grouped subquery", node)
    if not isinstance(node.this, exp.Column) or any(
        not isinstance(outer, exp.Column) for _, outer in found.pairs
    ):
        raise refuse("NOT IN of an expression or correlated with one (only columns)", node)
    owns = [exp.alias_(own.copy(), f"c{i}", quoted=True) for i, (own, _) in enumerate(found.pairs)]
    # the correlation first: a lookup by a view's leading column reads those groups only
    values = _hidden_select(sub, [*owns, exp.alias_(item, "v0", quoted=True)], found.local)
    values.set("distinct", exp.Distinct())
    name = lifter.add(values)
    on = exp.and_(
        *_matching(name, found.pairs),
        exp.EQ(this=node.this.copy(), expression=_column(name, "v0")),
    )
    select.append("joins", exp.Join(this=_table(name, name), on=on, side="LEFT"))
    counts = [
        exp.alias_(exp.Count(this=exp.Star()), "n", quoted=True),
        exp.alias_(exp.Count(this=item.copy()), "nn", quoted=True),
    ]
    counted = _hidden_select(sub, [*(o.copy() for o in owns), *counts], found.local)
    if found.pairs:
        counted.set("group", exp.Group(expressions=[own.copy() for own, _ in found.pairs]))
    total = lifter.add(counted)
    if found.pairs:
        on = exp.and_(*_matching(total, found.pairs))
        select.append("joins", exp.Join(this=_table(total, total), on=on, side="LEFT"))
        empty: exp.Expression = exp.Is(this=_column(total, "n"), expression=exp.Null())
    else:
        _join(select, _table(total, total), None)
        empty = exp.EQ(this=_column(total, "n"), expression=exp.Literal.number(0))
    absent = exp.and_(
        exp.Not(this=exp.Is(this=node.this.copy(), expression=exp.Null())),
        exp.Is(this=_column(name, "v0"), expression=exp.Null()),
        exp.EQ(this=_column(total, "n"), expression=_column(total, "nn")),
    )
    return [exp.paren(exp.or_(empty, absent))]


def _lift_scalars(select: exp.Select, conjunct: exp.Expression, lifter: Lifter) -> exp.Expression:
    """Each scalar subquery of a WHERE conjunct -> a column of a hidden view joined to it."""
    for node in list(conjunct.find_all(exp.Subquery)):
        if node is not conjunct and _nested(node.parent, conjunct):
            continue  # a subquery in a scalar subquery (its FROM): lifted with that one's view
        sub = _query(node, "a scalar subquery")
        item = _single(sub, "a scalar subquery")
        found = _correlation(sub)
        if sub.args.get("group") or sub.args.get("having"):
            raise refuse(
                "a scalar subquery with GROUP BY or HAVING (more than one row, or none, is "
                "an error or NULL in SQL)",
                node,
            )
        if not found.pairs:
            if not item.find(*AGGREGATES):
                raise refuse(
                    "a scalar subquery without an aggregate (it may give more than one row)", node
                )
            name = lifter.add(
                _hidden_select(sub, [exp.alias_(item, "v0", quoted=True)], found.local)
            )
            _join(select, _table(name, name), None)
        else:
            _check_correlated_scalar(conjunct, node, item)
            owns = [own for own, _ in found.pairs]
            items = [exp.alias_(own.copy(), f"c{i}", quoted=True) for i, own in enumerate(owns)]
            hidden = _hidden_select(sub, [*items, exp.alias_(item, "v0", quoted=True)], found.local)
            hidden.set("group", exp.Group(expressions=[own.copy() for own in owns]))
            name = lifter.add(hidden)
            _join(select, _table(name, name), exp.and_(*_matching(name, found.pairs)))
        column = _column(name, "v0")
        if node is conjunct:
            return column
        node.replace(column)
    return conjunct


ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Paren)


def _null_over_no_rows(item: exp.Expression) -> bool:
    """Whether a subquery's item is NULL when no row matches, so that the hidden view's
    missing row (an inner join finds none) means what SQL's NULL does: SUM, AVG, MIN or MAX,
    or arithmetic with one of them as an operand (``0.2 * AVG(x)``, ``SUM(a) / COUNT(*)``:
    NULL in, NULL out). COUNT alone is 0 then, and COALESCE or CASE may be anything."""
    if isinstance(item, exp.Sum | exp.Avg | exp.Min | exp.Max):
        return True
    if isinstance(item, ARITHMETIC):
        operands = [item.this, item.args.get("expression")]
        return any(_null_over_no_rows(o) for o in operands if isinstance(o, exp.Expression))
    return False


def _check_correlated_scalar(
    conjunct: exp.Expression, node: exp.Subquery, item: exp.Expression
) -> None:
    """A correlated scalar must be NULL over no rows (``_null_over_no_rows``); as an operand
    of a comparison that is a conjunct of WHERE, a NULL keeps no row, as the join does."""
    if not _null_over_no_rows(item):
        if item.find(exp.Count):
            raise refuse(
                "a correlated COUNT subquery (over no rows it is 0, which needs an outer join)",
                node,
            )
        raise refuse(
            "a correlated scalar subquery other than SUM, AVG, MIN or MAX, or arithmetic over them",
            node,
        )
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    if not isinstance(parent, tuple(COMPARISONS)) or parent is not conjunct.unnest():
        raise refuse(
            "a correlated scalar subquery outside a comparison in WHERE's conjunction", node
        )
