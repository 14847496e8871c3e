"""Pass 8: the SELECT list -> named group columns, aggregates (with identity keys, so an aggregate
written twice is computed once) and the output order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType
from cumulus.aggregates import RULES, Kind
from cumulus.passes.check_support import AGGREGATES
from cumulus.passes.plan_groups import Group, select_items
from cumulus.passes.resolve_tables import Scope, typed_column
from cumulus.passes.typecheck import no_aggregates, typed
from cumulus.plan import Aggregate, ColumnRef, Expr, GroupColumn
from cumulus.typerules import NUMERIC

RESERVED_NAMES = frozenset({"_count"})  # the refresh operator's own column in every view row


@dataclass
class _AggregateSpec:
    kind: Kind
    arg: Expr | None
    arg_type: ColumnType | None
    base_name: str

    def key(self) -> str:
        return json.dumps([self.kind, self.arg], sort_keys=True)


def aggregate_spec(node: exp.Expression, scope: Scope) -> _AggregateSpec:
    """COUNT/SUM/AVG/MIN/MAX -> kind, typed argument and a default output name."""
    kind = Kind(node.key)
    arg_node = node.this
    if isinstance(arg_node, exp.Distinct):
        arg_node = arg_node.expressions[0]
        kind = Kind.COUNT_DISTINCT if kind is Kind.COUNT else kind
    if kind is Kind.COUNT and (
        isinstance(arg_node, exp.Star)
        or (isinstance(arg_node, exp.Literal | exp.Boolean) and not isinstance(arg_node, exp.Null))
    ):
        return _AggregateSpec(Kind.COUNT_STAR, None, None, "count")
    arg, arg_type = typed(arg_node, lambda c: typed_column(c, scope), no_aggregates)
    if RULES[kind].numeric and arg_type.kind not in NUMERIC:
        what = (
            f"column {ColumnRef(*arg['col'])}" if "col" in arg else f"expression {arg_node.sql()}"
        )
        raise errors.TypeMismatch(f"{kind.name} over {arg_type} {what}")
    base = f"{kind.value}_{arg['col'][1]}" if "col" in arg else kind.value
    return _AggregateSpec(kind, arg, arg_type, base)


class OutputNames:
    """Output names: explicit aliases first, then derived names deduplicated with _2, _3, ..."""

    def __init__(self, explicit: list[str]) -> None:
        self.taken: set[str] = set(RESERVED_NAMES)
        for name in explicit:
            if name.startswith("_"):
                raise errors.InvalidArgument(
                    f"output name {name}: names starting with _ are reserved for the view's "
                    "hidden columns"
                )
            if name in self.taken:
                raise errors.InvalidArgument(f"output name {name} is used twice")
            self.taken.add(name)

    def derive(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def hidden(self, prefix: str = "_having") -> str:
        n = 0
        while f"{prefix}{n}" in self.taken:
            n += 1
        self.taken.add(f"{prefix}{n}")
        return f"{prefix}{n}"


def plan_select(
    select: exp.Select, scope: Scope, groups: list[Group]
) -> tuple[
    list[GroupColumn],
    list[tuple[Aggregate, str]],
    list[str],
    OutputNames,
    list[tuple[str, exp.Expression]],
]:
    """SELECT items -> named group columns, aggregates (with identity keys), output order and
    the items left to ``plan_derived`` (expressions over aggregates), named."""
    items = select_items(select)
    names = OutputNames([alias for alias, _ in items if alias is not None])
    by_key = {g.key: g for g in groups}
    group_names: dict[str, str] = {}
    aggregates: list[tuple[Aggregate, str]] = []
    output: list[str] = []
    pending: list[tuple[str, exp.Expression]] = []
    for alias, node in items:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, AGGREGATES):
            spec = aggregate_spec(node, scope)
            name = alias or names.derive(spec.base_name)
            aggregates.append((aggregate_of(spec, name, hidden=False), spec.key()))
            output.append(name)
            continue
        group = _selected_group(node, scope, by_key)
        if group is None:  # an expression over aggregates and group columns
            pending.append((alias or names.derive("expr"), node))
            output.append(pending[-1][0])
            continue
        shown = str(group.ref) if group.ref is not None else node.sql()
        if group.key in group_names:
            raise errors.InvalidArgument(f"GROUP BY column {shown} appears twice in SELECT")
        base = group.ref.column if group.ref is not None else "expr"
        group_names[group.key] = alias or names.derive(base)
        output.append(group_names[group.key])
    columns = []
    for group in groups:
        base = group.ref.column if group.ref is not None else "expr"
        name = group_names.get(group.key) or names.derive(base)
        expr = None if group.ref is not None else group.expr
        columns.append(GroupColumn(name, group.ref, str(group.type), expr))
    return columns, aggregates, output, names, pending


def _selected_group(node: exp.Expression, scope: Scope, groups: dict[str, Group]) -> Group | None:
    """The GROUP BY item a SELECT item is (a column must be one); None for another
    expression."""
    if isinstance(node, exp.Column):
        ref, _ = scope.resolve(node)
        found = groups.get(json.dumps({"col": ref.to_json()}))
        if found is None:
            raise errors.InvalidArgument(f"column {ref} must appear in GROUP BY or be aggregated")
        return found
    if node.find(*AGGREGATES):
        return None
    try:
        expr, _ = typed(node, lambda c: typed_column(c, scope), no_aggregates)
    except errors.InvalidArgument:
        return None
    return groups.get(json.dumps(expr, sort_keys=True))


def aggregate_of(spec: _AggregateSpec, name: str, hidden: bool) -> Aggregate:
    return Aggregate(
        name,
        spec.kind,
        spec.arg,
        None if spec.arg_type is None else str(spec.arg_type),
        str(RULES[spec.kind].result_type(spec.arg_type)),
        hidden,
    )
