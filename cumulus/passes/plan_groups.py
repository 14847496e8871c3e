"""Pass 7: the view's shape (aggregate, bag or distinct) and its groups: GROUP BY items, or every
SELECT item of a view without aggregates, deduplicated so a group is stored once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType
from cumulus.passes.check_support import AGGREGATES
from cumulus.passes.resolve_tables import Scope, typed_column
from cumulus.passes.typecheck import no_aggregates, typed
from cumulus.plan import HIDDEN_PREFIX, ColumnRef, Expr
from cumulus.sqltext import identifier


def view_shape(select: exp.Select) -> str:
    """``aggregate`` (aggregates: one row per group), ``distinct`` (SELECT DISTINCT, or GROUP BY
    without aggregates: one row per group) or ``bag`` (neither: each row as often as the join
    gives it). See ``cumulus.plan``."""
    if select.find(*AGGREGATES) is not None:
        return "aggregate"
    having = select.args.get("having")
    if having is not None and not _reads_scalar(having):
        raise errors.InvalidArgument(
            "HAVING without an aggregate is not supported in a materialized view (write the "
            "condition in WHERE)"
        )
    if select.args.get("distinct") is not None or select.args.get("group") is not None:
        return "distinct"
    return "bag"


def _reads_scalar(having: exp.Having) -> bool:
    """Whether HAVING compares the rows with a cumulus view's uncorrelated scalar subquery
    (``lift_subqueries.where_scalars_as_having``: a WHERE conjunct over the rows' own columns,
    the same for every row of a group, read as HAVING when the view is read)."""
    return any(c.name.startswith(HIDDEN_PREFIX) for c in having.find_all(exp.Column))


def projected_groups(select: exp.Select, scope: Scope) -> list[Group]:
    """A view without aggregates or GROUP BY is grouped by every SELECT item (its rows are
    the groups, counted); an item given twice is refused, naming it."""
    found: dict[str, Group] = {}
    for _, node in select_items(select):
        item = _group_item(node, scope, [])
        if item.key in found:
            shown = str(item.ref) if item.ref is not None else node.sql()
            raise errors.InvalidArgument(
                f"{shown} appears twice in the SELECT of a view without aggregates; select it once"
            )
        found[item.key] = item
    return list(found.values())


def select_items(select: exp.Select) -> list[tuple[str | None, exp.Expression]]:
    items = []
    for item in select.expressions:
        if isinstance(item, exp.Alias):
            items.append((identifier(item.args["alias"], "output"), item.this))
        else:
            items.append((None, item))
    return items


@dataclass(frozen=True)
class Group:
    """A GROUP BY item: a column (``ref``) or an expression of the row; ``key`` tells repeats."""

    key: str
    ref: ColumnRef | None
    expr: Expr
    type: ColumnType


def _group(expr: Expr, type_: ColumnType) -> Group:
    if "col" in expr:
        ref = ColumnRef(*expr["col"])
        return Group(json.dumps(expr), ref, expr, type_)
    return Group(json.dumps(expr, sort_keys=True), None, expr, type_)


def plan_group_by(select: exp.Select, scope: Scope) -> list[Group]:
    """GROUP BY items, in order, without repeats: columns or expressions of the row, by
    themselves, output alias or position."""
    items = select_items(select)
    found: dict[str, Group] = {}
    group = select.args.get("group")
    for node in group.expressions if group is not None else []:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
            position = int(node.this)
            if not 1 <= position <= len(items):
                raise errors.InvalidArgument(f"GROUP BY position {position} is not in the SELECT")
            node = items[position - 1][1]
            if isinstance(node, AGGREGATES) or node.find(*AGGREGATES):
                raise errors.InvalidArgument(f"GROUP BY position {position} refers to an aggregate")
        item = _group_item(node, scope, items)
        found.setdefault(item.key, item)
    return list(found.values())


def _group_item(
    node: exp.Expression, scope: Scope, items: list[tuple[str | None, exp.Expression]]
) -> Group:
    """An input column first (as SQL does), else a SELECT alias; or an expression."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Column):
        return _group(*typed(node, lambda c: typed_column(c, scope), no_aggregates))
    try:
        return _group(*typed_column(node, scope))
    except errors.UnknownColumn:
        if node.args.get("table") is None:
            name = identifier(node.this, "column")
            for alias, item in items:
                if alias == name and not (isinstance(item, exp.Column) and item is node):
                    if item.find(*AGGREGATES):
                        raise errors.InvalidArgument(
                            f"GROUP BY {name} refers to an aggregate: {item.sql()}"
                        ) from None
                    return _group_item(item, scope, items)
        raise
