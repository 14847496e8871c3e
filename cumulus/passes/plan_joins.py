"""Passes 5-6: split the ON and WHERE conjunctions into join edges and filters, and refuse a
cross product (every table reachable through join edges), since maintenance joins by index.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from aggview import errors
from cumulus.passes.resolve_tables import Scope, typed_column
from cumulus.passes.typecheck import conjuncts, no_aggregates, predicate
from cumulus.plan import ColumnRef, Expr, JoinEdge, TableRef, expr_columns


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
    terms = [(term, on_scope, True) for on, on_scope in ons for term in conjuncts(on)]
    terms += [
        (t, scope, False) for t in conjuncts(select.args.get("where") and select.args["where"].this)
    ]
    edges: dict[frozenset[ColumnRef], JoinEdge] = {}
    filters: list[Expr] = []
    for term, term_scope, in_on in terms:
        pred = predicate(term, lambda c, s=term_scope: typed_column(c, s), no_aggregates)
        edge = _edge(pred, scope, term)
        if edge is not None:
            edges.setdefault(frozenset((edge.left, edge.right)), edge)
            continue
        aliases = {ref.alias for ref in _refs(pred)}
        if in_on and len(aliases) > 1:
            raise errors.InvalidArgument(
                f"join condition {term.sql()} is not an equality of columns: JOIN ... ON takes "
                "a.x = b.y (other conditions between tables belong in WHERE)"
            )
        filters.append(pred)
    return tuple(edges.values()), tuple(filters)


def _refs(tree: object) -> Iterator[ColumnRef]:
    for alias, column in expr_columns(tree):
        yield ColumnRef(alias, column)


def check_connected(tables: tuple[TableRef, ...], edges: tuple[JoinEdge, ...]) -> None:
    """Every alias must be reachable through join edges: a cross product is refused."""
    parent = {t.alias: t.alias for t in tables}

    def root(alias: str) -> str:
        while parent[alias] != alias:
            parent[alias] = parent[parent[alias]]
            alias = parent[alias]
        return alias

    for edge in edges:
        parent[root(edge.left.alias)] = root(edge.right.alias)
    groups: dict[str, list[str]] = {}
    for t in tables:
        groups.setdefault(root(t.alias), []).append(t.alias)
    if len(groups) > 1:
        parts = " | ".join(", ".join(g) for g in groups.values())
        raise errors.InvalidArgument(
            f"cross product is not supported: no equality joins the tables {parts} "
            "(add a join condition a.x = b.y)"
        )
