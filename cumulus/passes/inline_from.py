"""Pass 0a, before subqueries are lifted: common table expressions inlined, and simple subqueries
in FROM merged into the query that reads them, so every mode takes what pg_ivm takes.

- ``WITH t AS (q) ... FROM t``: every reference to ``t`` becomes ``(q) AS t`` (a CTE may read
  the ones before it). ``WITH RECURSIVE`` and column lists (``WITH t(a, b)``) are refused.
- ``FROM (SELECT e1 AS c1, ... FROM t1 JOIN t2 ON ... WHERE w) s``, the first item of FROM, whose
  SELECT has no aggregate, GROUP BY, HAVING, DISTINCT, ORDER BY, LIMIT, outer join or union,
  and subqueries only in ``w``, read by a query without outer joins: its tables (and inner joins)
  come first in the outer FROM, ``w`` is added to the outer WHERE, and each column of ``s`` is
  replaced by its expression. ``w``'s subqueries keep their scopes (their references to the
  subquery's tables are qualified first, by ``qualify_correlations``): TPC-H Q22's customers
  above the average and without orders become one level of nesting, which Cumulus maintains.
  A bag of rows filtered and joined is the same whether it is named first or not, so the view
  means the same, and it is maintained as one view over base tables (Cumulus takes it; sync and
  async save a hidden view). Under an outer join the subquery stays whole: moved out of
  a RIGHT JOIN's nullable side, its WHERE would drop the NULL rows.

Anything else is left as it was (a hidden view: ``lift_subqueries``), including a merge that
would need a column the outer query names ambiguously.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from aggview import errors
from aggview.schema import TableSchema
from cumulus.passes.check_support import AGGREGATES, refuse
from cumulus.sqltext import identifier

Schema = Callable[[str], TableSchema]


def inline_ctes(statement: exp.Expression) -> exp.Expression:
    """``statement`` (a SELECT or a union) without its WITH: each CTE's query in place of every
    reference to it, as a subquery aliased as the reference was."""
    with_ = statement.args.get("with_")
    if with_ is None:
        return statement
    if with_.args.get("recursive"):
        raise refuse("WITH RECURSIVE", with_)
    bodies: dict[str, exp.Expression] = {}
    for cte in with_.expressions:
        alias = cte.args.get("alias")
        if alias is not None and alias.args.get("columns"):
            raise refuse("a column list on a common table expression", cte)
        name = identifier(alias.this if alias is not None else None, "common table expression")
        bodies[name] = _substituted(cte.this.copy(), bodies)
    statement = statement.copy()
    statement.set("with_", None)
    return _substituted(statement, bodies)


def _substituted(node: exp.Expression, bodies: dict[str, exp.Expression]) -> exp.Expression:
    for table in list(node.find_all(exp.Table)):
        if table.args.get("db") or not isinstance(table.this, exp.Identifier):
            continue
        name = identifier(table.this, "table")
        if name not in bodies:
            continue
        alias = table.args.get("alias")
        alias_name = alias.this if alias is not None and alias.this is not None else table.this
        subquery = exp.Subquery(
            this=bodies[name].copy(), alias=exp.TableAlias(this=alias_name.copy())
        )
        if table is node:
            return subquery
        table.replace(subquery)
    return node


def merge_first_subquery(select: exp.Select, schema: Schema) -> exp.Select:
    """``select`` with its first FROM item merged when that is a simple subquery (module
    docstring), repeatedly; otherwise ``select`` unchanged."""
    while True:
        merged = _merge_once(select, schema)
        if merged is None:
            return select
        select = merged


def _merge_once(select: exp.Select, schema: Schema) -> exp.Select | None:
    first = select.args.get("from_")
    node = first.this if first is not None else None
    if not isinstance(node, exp.Subquery) or not isinstance(node.this, exp.Select):
        return None
    inner = merge_first_subquery(node.this.copy(), schema)  # its own first, inside out
    if not simple(inner):
        return None
    alias = node.args.get("alias")
    if alias is None or alias.this is None or alias.args.get("columns"):
        return None
    for found in select.find_all(exp.Subquery, exp.Exists):
        if found is not node and not inside(found, node):
            return None  # a nested scope's columns would need its own resolution: a hidden view
    if any(j.side for j in select.args.get("joins") or []):
        # an outer join keeps the subquery whole: under a RIGHT JOIN its WHERE would filter the
        # NULL rows away, and a LEFT JOIN's ON must stay equalities of columns
        return None
    sources = table_sources(inner, schema)
    if sources is None or not qualify_columns(inner, sources):
        return None
    name = identifier(alias.this, "table alias")
    outer = select.copy()
    others = _outer_sources(outer, schema)
    if others is None:
        return None
    taken = set(others) | {name}
    renames = {a: fresh_alias(f"{name}_{a}", taken) for a in sources if a in taken}
    if renames and inner.find(exp.Subquery, exp.Exists):
        return None  # a subquery's own tables may have the alias renamed: left whole
    for column in inner.find_all(exp.Column):
        qualifier = column.table
        if qualifier in renames:
            column.set("table", exp.to_identifier(renames[qualifier], quoted=True))
    for table in [inner.args["from_"].this, *(j.this for j in inner.args.get("joins") or [])]:
        alias_now = alias_of(table)
        if alias_now in renames:
            table.set("alias", exp.TableAlias(this=exp.to_identifier(renames[alias_now], True)))
    outputs = _outputs(inner, {renames.get(a, a): s for a, s in sources.items()})
    if outputs is None or not replace_columns(outer, name, outputs, others):
        return None
    outer.set("from_", exp.From(this=inner.args["from_"].this.copy()))
    joins = [j.copy() for j in inner.args.get("joins") or []]
    outer.set("joins", joins + list(outer.args.get("joins") or []) or None)
    where = inner.args.get("where")
    if where is not None:
        kept = outer.args.get("where")
        both = exp.and_(where.this.copy(), kept.this) if kept is not None else where.this.copy()
        outer.set("where", exp.Where(this=both))
    return outer


def inside(node: exp.Expression, ancestor: exp.Expression) -> bool:
    """Whether ``ancestor`` holds ``node`` below it."""
    parent = node.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def simple(inner: exp.Expression) -> bool:
    """A SELECT of rows filtered and inner-joined, nothing that groups or orders, and subqueries
    only in its WHERE (each a condition on its rows: merged, the condition of the view's)."""
    if not isinstance(inner, exp.Select) or inner.args.get("from_") is None:
        return False
    if any(inner.args.get(k) for k in ("group", "having", "distinct", "order", "limit", "with_")):
        return False
    where = inner.args.get("where")
    for found in inner.find_all(exp.Subquery, exp.Exists, exp.Window, *AGGREGATES):
        nested = _nested_in(found, inner)
        if nested is None or where is None or not inside(nested, where):
            return False
    return inner_joins_of_tables(inner) and isinstance(inner.args["from_"].this, exp.Table)


def inner_joins_of_tables(select: exp.Select) -> bool:
    """Whether every join of ``select`` is an inner (or comma) join of a table."""
    joins = select.args.get("joins") or []
    return all(isinstance(j.this, exp.Table) for j in joins) and not any(
        j.side or j.args.get("using") or j.method for j in joins
    )


def _nested_in(node: exp.Expression, select: exp.Select) -> exp.Expression | None:
    """The subquery (or EXISTS) of ``select`` that holds ``node``, the outermost one; None
    when ``node`` is in ``select``'s own scope."""
    found = None
    parent: exp.Expression | None = node
    while parent is not None and parent is not select:
        if isinstance(parent, exp.Subquery | exp.Exists | exp.Select):
            found = parent
        parent = parent.parent
    return found


def alias_of(table: exp.Expression) -> str:
    alias = table.args.get("alias")
    return identifier(alias.this if alias is not None else table.this, "table alias")


def _table_schema(item: exp.Expression, schema: Schema) -> TableSchema | None:
    """A FROM item's schema when it is a table ``schema`` knows (None otherwise)."""
    if not isinstance(item, exp.Table) or item.args.get("db"):
        return None
    try:
        return schema(identifier(item.this, "table"))
    except (errors.AggviewError, KeyError):
        return None


def table_sources(select: exp.Select, schema: Schema) -> dict[str, TableSchema] | None:
    """A query's FROM tables by alias (None: an item that is not a known table, an alias
    twice)."""
    first = select.args.get("from_")
    found: dict[str, TableSchema] = {}
    for item in [
        *([first.this] if first else []),
        *(j.this for j in select.args.get("joins") or []),
    ]:
        resolved = _table_schema(item, schema)
        if resolved is None or alias_of(item) in found:
            return None
        found[alias_of(item)] = resolved
    return found


def _outer_sources(select: exp.Select, schema: Schema) -> dict[str, set[str] | None] | None:
    """The outer query's other FROM items by alias, each with its column names (None for a
    subquery: its columns are not known here)."""
    found: dict[str, set[str] | None] = {}
    for join in select.args.get("joins") or []:
        item = join.this
        if isinstance(item, exp.Table):
            resolved = _table_schema(item, schema)
            if resolved is None:
                return None
            found[alias_of(item)] = {c.name for c in resolved.columns}
        elif isinstance(item, exp.Subquery) and item.args.get("alias") is not None:
            found[identifier(item.args["alias"].this, "table alias")] = None
        else:
            return None
    return found


def qualify_columns(inner: exp.Select, sources: dict[str, TableSchema]) -> bool:
    """Every column of the inner query qualified by its table's alias (False: one no table or
    several tables have)."""
    for column in list(inner.find_all(exp.Column)):
        if column.table or _nested_in(column, inner) is not None:
            continue  # a subquery's: its own table's, or qualified by qualify_correlations
        name = identifier(column.this, "column")
        owners = [a for a, s in sources.items() if any(c.name == name for c in s.columns)]
        if len(owners) != 1:
            return False
        column.set("table", exp.to_identifier(owners[0], quoted=True))
    return True


def _outputs(
    inner: exp.Select, sources: dict[str, TableSchema]
) -> dict[str, exp.Expression] | None:
    """The inner query's output columns by name, each its expression (stars expanded)."""
    outputs: dict[str, exp.Expression] = {}
    for item in inner.expressions:
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            wanted = item.table if isinstance(item, exp.Column) else ""
            for alias, table in sources.items():
                if wanted and alias != wanted:
                    continue
                for column in table.columns:
                    if column.name in outputs:
                        return None
                    outputs[column.name] = exp.column(column.name, table=alias, quoted=True)
            continue
        name = item.alias_or_name
        if not name or name in outputs:
            return None
        quoted = isinstance(item, exp.Alias) and item.args["alias"].quoted
        outputs[name if quoted else name.lower()] = (
            item.this if isinstance(item, exp.Alias) else item
        )
    return outputs


def replace_columns(
    outer: exp.Select,
    name: str,
    outputs: dict[str, exp.Expression],
    others: dict[str, set[str] | None],
) -> bool:
    """Each outer column of the subquery ``name`` replaced by its expression; a projection
    keeps its name. False: a column it cannot place for sure."""
    for item in outer.expressions:
        if (
            isinstance(item, exp.Star)
            or isinstance(item.unalias(), exp.Column)
            and isinstance(item.unalias().this, exp.Star)
        ):
            return False  # SELECT * over the subquery: left to the hidden view
    items = [
        exp.alias_(item, identifier(item.this, "column"), quoted=True)
        if isinstance(item, exp.Column) and not isinstance(item.this, exp.Star)
        else item
        for item in outer.expressions
    ]
    outer.set("expressions", items)
    for column in list(outer.find_all(exp.Column)):
        column_name = identifier(column.this, "column")
        if column.table:
            if identifier(column.args["table"], "table alias") != name:
                continue
        else:
            unknown = any(cols is None for cols in others.values())
            elsewhere = any(cols is not None and column_name in cols for cols in others.values())
            if column_name not in outputs:
                continue
            if elsewhere or unknown:
                return False
        if column_name not in outputs:
            return False
        column.replace(outputs[column_name].copy())
    return True


def fresh_alias(base: str, taken: set[str]) -> str:
    name, n = base[:60], 1
    while name in taken:
        n += 1
        name = f"{base[:56]}_{n}"
    taken.add(name)
    return name


def qualify_correlations(select: exp.Select, schema: Schema) -> exp.Select:
    """``select`` with each unqualified column of a subquery that none of the subquery's own
    tables has, and exactly one table of an enclosing query has, qualified by that table's
    alias (SQL's scoping: ``WHERE EXISTS (SELECT * FROM lineitem WHERE l_orderkey =
    o_orderkey)`` correlates with ``orders``). Unchanged (the same object) where nothing is."""
    qualified = select.copy()
    if _qualify_scope(qualified, [], schema):
        return qualified
    return select


def _qualify_scope(select: exp.Select, outer: list[dict[str, set[str]]], schema: Schema) -> bool:
    own = _scope_columns(select, schema)
    changed = False
    for nested in select.find_all(exp.Select):
        if nested is not select and _enclosing_select(nested) is select:
            changed |= _qualify_scope(nested, [own or {}, *outer], schema)
    if not outer or own is None:
        return changed
    for column in list(select.find_all(exp.Column)):
        if column.table or isinstance(column.this, exp.Star):
            continue
        if _enclosing_select(column) is not select:
            continue
        name = identifier(column.this, "column")
        if any(name in columns for columns in own.values()):
            continue
        for scope in outer:
            owners = [alias for alias, columns in scope.items() if name in columns]
            if owners:
                if len(owners) == 1:
                    column.set("table", exp.to_identifier(owners[0], quoted=True))
                    changed = True
                break
    return changed


def _own_aliases(select: exp.Select) -> set[str]:
    """The aliases ``select``'s own FROM names (tables and subqueries)."""
    first = select.args.get("from_")
    items = [*([first.this] if first else []), *(j.this for j in select.args.get("joins") or [])]
    return {alias_of(item) for item in items if isinstance(item, exp.Table)} | {
        item.alias for item in items if isinstance(item, exp.Subquery) and item.alias
    }


def naming_scope(column: exp.Column) -> tuple[exp.Select | None, int]:
    """The query whose own FROM names the qualified ``column``'s alias (None: none does), and
    how many queries out from the column's own it is (0: its own)."""
    scope, levels = _enclosing_select(column), 0
    while scope is not None and column.table not in _own_aliases(scope):
        scope, levels = _enclosing_select(scope), levels + 1
    return scope, levels


def refuse_skipped_levels(select: exp.Select) -> None:
    """A subquery's column of a query two or more levels around it (not the one right around
    it) is refused by name: each subquery is maintained as a view of its own, over what its
    own FROM and the query right around it name (before, the hidden view's compile said
    "unknown table alias", naming hidden views)."""
    for column in select.find_all(exp.Column):
        if not column.table:
            continue
        scope, levels = naming_scope(column)
        if scope is not None and levels >= 2:
            raise errors.InvalidArgument(
                f"a subquery reads {column.sql()} of a query {levels} levels around it, which "
                "no materialized view maintains: a subquery may read its own tables and those "
                "of the query right around it"
            )


def _enclosing_select(node: exp.Expression) -> exp.Select | None:
    parent = node.parent
    while parent is not None and not isinstance(parent, exp.Select):
        parent = parent.parent
    return parent


def _scope_columns(select: exp.Select, schema: Schema) -> dict[str, set[str]] | None:
    """The columns of ``select``'s FROM items by alias (None: one is not a known table)."""
    sources = table_sources(select, schema)
    if sources is None:
        return None
    return {alias: {c.name for c in table.columns} for alias, table in sources.items()}
