"""Pass -1: a UNION ALL, or a SELECT without FROM, as the SELECTs (branches) whose tuples a
view's groups add up; each branch is then compiled as any view and ``cumulus.passes.union_plans``
joins their plans into one (``ViewPlan.branches``). The delta of a union is the union of its
branches' deltas, so every mode maintains it as it maintains one SELECT.

- ``SELECT ... FROM (s1 UNION ALL s2 ...) u ...``: the outer query once per branch, over that
  branch's FROM and WHERE, with ``u``'s columns replaced by the branch's expressions; the groups
  are shared (an aggregate over a union is the sum of the aggregates over its branches). A
  union joined with other tables is left to ``lift_subqueries``: a hidden view, itself a union.
- ``s1 UNION ALL s2 ...`` at the top: a bag of the branches' rows, duplicates kept. Branches
  without aggregates merge (a bag's multiplicities add); aggregate or DISTINCT branches keep
  their groups apart, by a hidden group column naming the branch (``union_plans.BRANCH``).
- ``... FROM a FULL JOIN b ON ...``: a LEFT JOIN and the rows of b no row of a matches
  (``full_joins``), the groups shared.
- ``SELECT (SELECT SUM(v) FROM a) AS total, ...`` without FROM: one row, each scalar subquery a
  branch of its own (``union_plans.scalars``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from aggview import errors
from cumulus.passes import full_joins
from cumulus.passes.check_support import AGGREGATES, refuse
from cumulus.sqltext import identifier, parse_sql


@dataclass(frozen=True)
class Union:
    """The branches of a view that is a union; ``tagged``: each branch's groups kept apart."""

    branches: list[exp.Select]
    tagged: bool


def split(select_sql: str) -> Union | exp.Select | None:
    """A union's branches, a SELECT without FROM (compiled by ``union_plans.scalars``), or
    None for any other SELECT (compiled as it is)."""
    statement = parse_sql(select_sql)
    if isinstance(statement, exp.Union) and _all_distinct(statement):
        return Union(_inlined(*_distinct_over(statement)), tagged=False)
    if isinstance(statement, exp.Union):
        return _top_level(statement)
    if not isinstance(statement, exp.Select):
        return None
    source = statement.args.get("from_")
    if source is None and not statement.args.get("joins"):
        return statement
    node = source.this if source is not None else None
    full = full_joins.branches(statement)
    if full is not None:
        return Union(full, tagged=False)
    if statement.args.get("joins"):
        return None  # a union joined with other tables is a hidden view (``lift_subqueries``)
    if isinstance(node, exp.Subquery) and isinstance(_unwrap(node.this), exp.Union):
        return Union(_inlined(statement, node), tagged=False)
    return None


def _unwrap(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Subquery) and not node.args.get("alias"):
        node = node.this
    return node


def _branches(node: exp.Expression) -> list[exp.Select]:
    """A chain of UNION ALL, flattened; UNION without ALL, INTERSECT, EXCEPT and ORDER BY or
    LIMIT on a union are refused by name."""
    node = _unwrap(node)
    if isinstance(node, exp.Select):
        return [node]
    if isinstance(node, exp.Intersect | exp.Except):
        raise refuse(node.key.upper())
    if not isinstance(node, exp.Union):
        raise refuse(f"{node.key.upper()} as a branch of UNION ALL", node)
    if node.args.get("distinct"):
        raise refuse(
            "UNION without ALL beside UNION ALL (write SELECT DISTINCT ... FROM "
            "(... UNION ALL ...) u for the rows each once)"
        )
    for clause in ("order", "limit", "offset", "with_"):
        if node.args.get(clause):
            raise refuse(f"{clause.upper().rstrip('_')} on a UNION")
    return _branches(node.this) + _branches(node.expression)


def _all_distinct(union: exp.Union) -> bool:
    """Whether every set operation of a chain is UNION without ALL."""
    node = _unwrap(union)
    if not isinstance(node, exp.Union):
        return True
    return (
        bool(node.args.get("distinct"))
        and _all_distinct(node.this)
        and _all_distinct(node.expression)
    )


def _distinct_over(union: exp.Union) -> tuple[exp.Select, exp.Subquery]:
    """``s1 UNION s2 ...`` is ``SELECT DISTINCT * FROM (s1 UNION ALL s2 ...) u``: the union's
    rows, each once (its branches must be rows, not groups: ``_named_items``)."""
    if any(_aggregated(b) for b in _branches(_all_all(union.copy()))):
        raise refuse("UNION without ALL of queries with aggregates, GROUP BY or DISTINCT")
    bag = _all_all(union.copy())
    source = exp.Subquery(this=bag, alias=exp.TableAlias(this=exp.to_identifier("__union")))
    outer = exp.Select(expressions=[exp.Star()]).from_(source)
    outer.set("distinct", exp.Distinct())
    return outer, outer.args["from_"].this


def _all_all(union: exp.Union) -> exp.Union:
    """``union`` with every UNION made UNION ALL (in place)."""
    for node in [union, *union.find_all(exp.Union)]:
        node.set("distinct", False)
    return union


def _aggregated(select: exp.Select) -> bool:
    """Whether a branch has groups (aggregates, GROUP BY or DISTINCT), not only rows."""
    if select.args.get("group") or select.args.get("distinct"):
        return True
    return any(node.find_ancestor(exp.Select) is select for node in select.find_all(*AGGREGATES))


def _top_level(union: exp.Union) -> Union:
    branches = _branches(union)
    grouped = [_aggregated(b) for b in branches]
    if any(grouped) and not all(grouped):
        raise refuse("UNION ALL of a query with aggregates and one without")
    for branch in branches if all(grouped) else []:
        if not branch.args.get("group") and not branch.args.get("distinct"):
            raise refuse(
                "an aggregate without GROUP BY as a branch of a top-level UNION ALL (its one "
                "row over no rows; write the union in FROM and aggregate over it)",
                branch,
            )
    return Union(branches, tagged=all(grouped))


def _inlined(outer: exp.Select, node: exp.Subquery) -> list[exp.Select]:
    """The outer query once per branch of the union it reads in FROM."""
    alias = node.args.get("alias")
    if alias is None or alias.this is None:
        raise errors.InvalidArgument(f"a subquery in FROM needs an alias: ({node.this.sql()}) AS u")
    if alias.args.get("columns"):
        raise refuse("column aliases on a UNION ALL in FROM", node)
    name = identifier(alias.this, "table alias")
    branches = _branches(node.this)
    columns = [_named_items(b) for b in branches]
    names = [n for n, _ in columns[0]]
    for branch, items in zip(branches, columns, strict=True):
        if len(items) != len(names):
            raise errors.InvalidArgument(
                f"UNION ALL branches have {len(names)} and {len(items)} columns: {branch.sql()}"
            )
    template = _with_names(outer, name, names)
    return [
        _over_branch(template, name, names, b, items)
        for b, items in zip(branches, columns, strict=True)
    ]


def _named_items(branch: exp.Select) -> list[tuple[str, exp.Expression]]:
    """A branch's SELECT items with their names; a branch in FROM is rows only."""
    if _aggregated(branch) or branch.args.get("having"):
        raise refuse(
            "a UNION ALL branch in FROM with aggregates, GROUP BY or DISTINCT (aggregate over "
            "the union instead)",
            branch,
        )
    for clause in ("order", "limit", "offset", "with_"):
        if branch.args.get(clause):
            raise refuse(f"{clause.upper().rstrip('_')} in a UNION ALL branch", branch)
    if not branch.args.get("from_"):
        raise refuse("a UNION ALL branch without FROM", branch)
    out = []
    for item in branch.expressions:
        if item.find(exp.Star):
            raise refuse("SELECT * in a UNION ALL branch (name its columns)", branch)
        if isinstance(item, exp.Alias):
            out.append((identifier(item.args["alias"], "column alias"), item.this))
        elif isinstance(item, exp.Column):
            out.append((item.name, item))
        else:
            raise errors.InvalidArgument(f"name the UNION ALL branch's column {item.sql()} (AS)")
    return out


def _with_names(outer: exp.Select, alias: str, names: list[str]) -> exp.Select:
    """The outer query with ``*`` spelled out and every bare column item named, so that each
    branch's copy has the names the union's columns have."""
    outer = outer.copy()
    items: list[exp.Expression] = []
    for item in outer.expressions:
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            items += [exp.column(n, table=alias, quoted=True) for n in names]
        else:
            items.append(item)
    named = [
        exp.alias_(item, item.name, quoted=True) if isinstance(item, exp.Column) else item
        for item in items
    ]
    outer.set("expressions", named)
    return outer


def _over_branch(
    template: exp.Select,
    alias: str,
    names: list[str],
    branch: exp.Select,
    items: list[tuple[str, exp.Expression]],
) -> exp.Select:
    """``template`` over one branch: its FROM, joins and WHERE, ``alias``'s columns replaced."""
    select = template.copy()
    values = dict(zip(names, (value for _, value in items), strict=True))
    for column in list(select.find_all(exp.Column)):
        if column.find_ancestor(exp.Select) is not select:
            continue  # a subquery's own column
        owner = column.table
        if (owner == alias or not owner) and column.name in values:
            value = values[column.name].copy()
            column.replace(value if isinstance(value, exp.Column) else exp.Paren(this=value))
        elif owner == alias:
            raise errors.UnknownColumn(f"unknown column {column.sql()} (not in the union)")
    select.set("from_", branch.args["from_"].copy())
    select.set("joins", [j.copy() for j in branch.args.get("joins") or []])
    conditions = [w.this for w in (branch.args.get("where"), select.args.get("where")) if w]
    select.set(
        "where", exp.Where(this=exp.and_(*(c.copy() for c in conditions))) if conditions else None
    )
    return select
