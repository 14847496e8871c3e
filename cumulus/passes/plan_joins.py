"""Pass 5: split the ON and WHERE conjunctions into join edges (equalities of two columns of
different tables: index lookups) and filters. A filter over two or more tables is a theta join
predicate, evaluated on the joined row; tables no equality reaches are joined by a scan (a cross
product, filtered by those predicates), see ``cumulus.delta.join_order``.
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from cumulus.passes.resolve_tables import Scope, typed_column
from cumulus.passes.typecheck import conjuncts, no_aggregates, predicate
from cumulus.plan import ColumnRef, Expr, JoinEdge


def _edge(pred: Expr, scope: Scope, node: exp.Expression) -> JoinEdge | None:
    """An equality of two bare columns of different aliases is a join edge; else None."""
    if pred.get("cmp") != "=" or not all("col" in a for a in pred["args"]):
        return None
    left, right = (ColumnRef(*a["col"]) for a in pred["args"])
    if left.alias == right.alias:
        return None
    lt = scope.tables[left.alias].column(left.column).type
    rt = scope.tables[right.alias].column(right.column).type
    if lt.kind != rt.kind or lt.scale != rt.scale:
        raise errors.TypeMismatch(
            f"join condition {node.sql()} compares {lt} with {rt}; join columns must have the "
            "same type (index keys are encoded per type)"
        )
    return JoinEdge(left, right)


def plan_where(
    select: exp.Select, scope: Scope, ons: list[tuple[exp.Expression, Scope]]
) -> tuple[tuple[JoinEdge, ...], tuple[Expr, ...]]:
    """ON and WHERE conjunctions -> join edges (deduplicated) and the remaining filters."""
    terms = [(term, on_scope) for on, on_scope in ons for term in conjuncts(on)]
    terms += [(t, scope) for t in conjuncts(select.args.get("where") and select.args["where"].this)]
    edges: dict[frozenset[ColumnRef], JoinEdge] = {}
    filters: list[Expr] = []
    for term, term_scope in terms:
        pred = predicate(term, lambda c, s=term_scope: typed_column(c, s), no_aggregates)
        edge = _edge(pred, scope, term)
        if edge is not None:
            edges.setdefault(frozenset((edge.left, edge.right)), edge)
            continue
        filters.append(pred)
    return tuple(edges.values()), tuple(filters)
