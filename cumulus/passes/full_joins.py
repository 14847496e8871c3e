"""Pass -1 (in ``unions.split``): ``FROM a FULL [OUTER] JOIN b ON a.k = b.k ...`` as the two
branches of one view whose groups add up (``unions.Union``, as a UNION ALL in FROM):

- ``FROM a LEFT JOIN b ON a.k = b.k ... WHERE <where>``: every row of a, matched or with b's
  NULL row;
- ``FROM b LEFT JOIN a ON a.k = b.k ... WHERE <where> AND a.k IS NULL``: the rows of b no row of
  a matches, a's columns NULL. A row of a that matches has ``a.k = b.k``, not NULL, so
  ``a.k IS NULL`` keeps a's NULL row and nothing else.

Each branch is a LEFT JOIN, maintained as one (an outer alias and its flips, ``cumulus.delta``),
so the full join's delta is exact wherever a LEFT JOIN's is, and COUNT(*), COUNT(col), GROUP BY
over either side's NULLs and the WHERE mean what SQL says of the full join. ``*`` is spelled
``a.*, b.*`` (the second branch joins them the other way round). Only a FULL JOIN of two tables
(or subqueries) ON equalities of a qualified column of each; anything else is refused by name.
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from cumulus.passes.check_support import refuse
from cumulus.passes.typecheck import conjuncts
from cumulus.sqltext import identifier


def _is_full(join: exp.Join) -> bool:
    return join.side.upper() == "FULL"


def _alias(node: exp.Expression) -> str:
    """The name a table or subquery in FROM is known by ("" for a subquery without one)."""
    alias = node.args.get("alias")
    if alias is not None and alias.this is not None:
        return identifier(alias.this, "table alias")
    return identifier(node.this, "table") if isinstance(node, exp.Table) else ""


def _owner(node: exp.Expression) -> str:
    """The alias qualifying a column ("" for anything else)."""
    table = node.args.get("table") if isinstance(node, exp.Column) else None
    return identifier(table, "table alias") if table is not None else ""


def branches(select: exp.Select) -> list[exp.Select] | None:
    """The two LEFT JOIN branches of a view over a FULL JOIN, or None without one."""
    joins = select.args.get("joins") or []
    if not any(_is_full(j) for j in joins):
        return None
    join = next(j for j in joins if _is_full(j))
    if len(joins) > 1:
        raise refuse(
            "a FULL JOIN beside other joins (only a FULL JOIN of two tables: join the others "
            "in a subquery)",
            join,
        )
    if join.method or join.args.get("using"):
        raise refuse("FULL JOIN ... USING or NATURAL FULL JOIN (write FULL JOIN ... ON)")
    on = join.args.get("on")
    if on is None:
        raise errors.InvalidArgument(f"a FULL JOIN needs ON: {join.sql()}")
    left, right = select.args["from_"].this, join.this
    names = (_alias(left), _alias(right))
    if not all(names) or names[0] == names[1]:
        raise errors.InvalidArgument(f"a FULL JOIN's tables need distinct aliases: {join.sql()}")
    key = None
    for term in conjuncts(on):
        sides = (term.this, term.expression) if isinstance(term, exp.EQ) else ()
        tables = [_owner(c) for c in sides]
        if sorted(tables) != sorted(names):
            raise refuse(
                "a FULL JOIN's ON other than equalities of a column of each table "
                "(qualified: a.k = b.k)",
                term,
            )
        key = key or sides[tables.index(names[0])]
    assert key is not None
    template = select.copy()
    template.set(
        "expressions",
        [
            star
            for item in template.expressions
            for star in (
                [exp.Column(this=exp.Star(), table=exp.to_identifier(n)) for n in names]
                if isinstance(item, exp.Star)
                else [item]
            )
        ],
    )
    matched = template.copy()
    matched.args["joins"][0].set("side", "LEFT")
    unmatched = template.copy()
    first = unmatched.args["joins"][0]
    unmatched.args["from_"].set("this", right.copy())
    first.set("this", left.copy())
    first.set("side", "LEFT")
    where = unmatched.args.get("where")
    alone = exp.Is(this=key.copy(), expression=exp.Null())
    unmatched.set("where", exp.Where(this=exp.and_(where.this.copy(), alone) if where else alone))
    return [matched, unmatched]
