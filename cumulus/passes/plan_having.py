"""Pass 9: expressions over the view's own columns -- derived SELECT items (``SUM(a) / SUM(b)``)
and HAVING -- with hidden aggregates for what only they read.
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType
from cumulus.passes.plan_select import OutputNames, aggregate_of, aggregate_spec
from cumulus.passes.resolve_tables import Scope
from cumulus.passes.typecheck import conjuncts, predicate, typed
from cumulus.plan import Aggregate, Derived, Expr, GroupColumn
from cumulus.sqltext import Typed, identifier


class _ViewColumns:
    """The hooks that type an expression over a view's columns (``{"out": name}``), for
    HAVING and derived SELECT items: a GROUP BY column or an output name, and aggregates --
    one already computed is reused, another is added hidden."""

    def __init__(
        self,
        scope: Scope,
        columns: list[GroupColumn],
        aggregates: list[tuple[Aggregate, str]],
        names: OutputNames,
        clause: str,
        prefix: str,
    ) -> None:
        self.scope, self.columns, self.names, self.clause = scope, columns, names, clause
        self.prefix = prefix  # of the hidden aggregates' names
        self.aggregates = list(aggregates)
        self.by_key = {key: agg for agg, key in reversed(aggregates)}
        self.outputs = {c.name: ColumnType.parse(c.type) for c in columns}
        self.outputs.update({a.name: ColumnType.parse(a.result_type) for a, _ in aggregates})

    def column(self, node: exp.Column) -> Typed:
        try:
            ref, _ = self.scope.resolve(node)
        except errors.UnknownColumn:
            name = identifier(node.this, "column")
            if node.args.get("table") is None and name in self.outputs:
                return {"out": name}, self.outputs[name]
            raise
        for group in self.columns:
            if group.ref == ref:
                return {"out": group.name}, ColumnType.parse(group.type)
        raise errors.InvalidArgument(
            f"column {ref} in {self.clause} must appear in GROUP BY or be aggregated"
        )

    def aggregate(self, node: exp.Expression) -> Typed:
        spec = aggregate_spec(node, self.scope)
        found = self.by_key.get(spec.key())
        if found is None:
            found = aggregate_of(spec, self.names.hidden(self.prefix), hidden=True)
            self.by_key[spec.key()] = found
            self.aggregates.append((found, spec.key()))
        return {"out": found.name}, ColumnType.parse(found.result_type)


def plan_derived(
    pending: list[tuple[str, exp.Expression]],
    scope: Scope,
    columns: list[GroupColumn],
    aggregates: list[tuple[Aggregate, str]],
    names: OutputNames,
) -> tuple[list[Derived], list[tuple[Aggregate, str]]]:
    """SELECT items over aggregates and group columns (``SUM(a) / SUM(b)``): expressions over
    view columns, with the aggregates extended by the hidden ones they read."""
    hooks = _ViewColumns(scope, columns, aggregates, names, "a SELECT expression", "_agg")
    derived = []
    for name, node in pending:
        expr, type_ = typed(node, hooks.column, hooks.aggregate)
        derived.append(Derived(name, expr, str(type_)))
    return derived, hooks.aggregates


def plan_having(
    select: exp.Select,
    scope: Scope,
    columns: list[GroupColumn],
    aggregates: list[tuple[Aggregate, str]],
    names: OutputNames,
    derived: list[Derived],
    scalars: dict[str, ColumnType] | None = None,
) -> tuple[Expr | None, list[tuple[Aggregate, str]]]:
    """HAVING over view columns (``{"out": name}``) and the aggregates extended by the hidden
    ones only HAVING uses; an aggregate also in SELECT is reused, never computed twice.
    ``scalars``: values HAVING may read by name beside them (a cumulus view's uncorrelated
    scalar subqueries, read with the view)."""
    having = select.args.get("having")
    if having is None:
        return None, list(aggregates)
    hooks = _ViewColumns(scope, columns, aggregates, names, "HAVING", "_having")
    hooks.outputs.update({d.name: ColumnType.parse(d.type) for d in derived})
    hooks.outputs.update(scalars or {})
    preds = [predicate(term, hooks.column, hooks.aggregate) for term in conjuncts(having.this)]
    return (preds[0] if len(preds) == 1 else {"and": preds}), hooks.aggregates
