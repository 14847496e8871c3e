"""Pass 6b: ``SELECT *`` and ``alias.*`` -> the columns they stand for, so every later pass sees
named items only.
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from aggview.schema import Column
from cumulus.passes.check_support import AGGREGATES
from cumulus.passes.resolve_tables import Scope
from cumulus.plan import MULTIPLICITY, TableRef
from cumulus.sqltext import identifier


def expand_stars(select: exp.Select, tables: tuple[TableRef, ...], scope: Scope) -> exp.Select:
    """``*`` and ``alias.*`` -> the columns, in FROM and table order. A column name that two of
    the expanded aliases have (a join's key, a self-join) is qualified: ``alias_column``."""
    stars = [i for i in select.expressions if isinstance(i, exp.Star) or _is_alias_star(i)]
    if not stars:
        return select
    if select.find(*AGGREGATES) is not None or select.args.get("group") is not None:
        shown = stars[0].sql()
        raise errors.InvalidArgument(
            f"SELECT {shown} is not supported in a view with GROUP BY or aggregates; name the "
            "columns (SELECT * is for views without aggregates)"
        )
    expanded: list[list[str]] = []  # per item: the aliases it expands to
    for item in select.expressions:
        if isinstance(item, exp.Star):
            expanded.append([t.alias for t in tables])
        elif _is_alias_star(item):
            alias = identifier(item.args["table"], "table alias")
            if alias not in scope.tables:
                raise errors.UnknownColumn(
                    f"unknown table alias {alias!r} in {item.sql()} "
                    f"(tables in scope: {', '.join(scope.tables)})"
                )
            expanded.append([alias])
        else:
            expanded.append([])
    seen: dict[str, set[str]] = {}
    for item, aliases in zip(select.expressions, expanded, strict=True):
        for alias in aliases:
            for column in _columns(scope, alias, isinstance(item, exp.Star)):
                seen.setdefault(column.name, set()).add(alias)
    items: list[exp.Expression] = []
    for item, aliases in zip(select.expressions, expanded, strict=True):
        if not aliases:
            items.append(item.copy())
            continue
        for alias in aliases:
            for column in _columns(scope, alias, isinstance(item, exp.Star)):
                node: exp.Expression = exp.Column(
                    this=exp.Identifier(this=column.name, quoted=True),
                    table=exp.Identifier(this=alias, quoted=True),
                )
                if len(seen[column.name]) > 1:
                    qualified = exp.Identifier(this=f"{alias}_{column.name}", quoted=True)
                    node = exp.Alias(this=node, alias=qualified)
                items.append(node)
    out = select.copy()
    out.set("expressions", items)
    return out


def _columns(scope: Scope, alias: str, whole: bool) -> list[Column]:
    """The columns ``alias`` contributes: under a bare ``*``, a column USING or NATURAL JOIN
    merged is shown once, by the first table that has it (as SQL shows it); a view read as a
    table does not show its rows' multiplicity (``__count``)."""
    return [
        column
        for column in scope.tables[alias].columns
        if (not whole or alias not in scope.merged.get(column.name, ())[1:])
        and column.name != MULTIPLICITY
    ]


def _is_alias_star(item: exp.Expression) -> bool:
    return isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
