"""Pass 5: split the ON and WHERE conjunctions into join edges (equalities of two columns of
different tables: index lookups) and filters. A filter over two or more tables is a theta join
predicate, evaluated on the joined row; tables no equality reaches are joined by a scan (a cross
product, filtered by those predicates), see ``cumulus.delta.join_order``.

A LEFT JOIN's table is an *outer* alias: its ON must be equalities of its columns with tables
joined before it that are not outer themselves (what decides its NULL row); an equality with an
outer alias elsewhere (WHERE, an inner join's ON) is a filter, which a NULL row fails.
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from cumulus.passes.check_support import refuse
from cumulus.passes.resolve_tables import Scope, typed_column
from cumulus.passes.typecheck import conjuncts, no_aggregates, predicate
from cumulus.plan import HIDDEN_PREFIX, ColumnRef, Expr, JoinEdge
from cumulus.sqltext import identifier


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
        if _lifted(scope, left) != _lifted(scope, right):  # say it as the user wrote it
            (mine, mine_type), theirs = (
                ((right, rt), lt) if _lifted(scope, left) else ((left, lt), rt)
            )
            raise errors.TypeMismatch(
                f"{mine.alias}.{mine.column} ({mine_type}) is compared with a subquery's column "
                f"of type {theirs} (by IN, or a correlated =); they must have the same type, as "
                "a join's columns (index keys are encoded per type)"
            )
        raise errors.TypeMismatch(
            f"join condition {node.sql()} compares {lt} with {rt}; join columns must have the "
            "same type (index keys are encoded per type)"
        )
    return JoinEdge(left, right)


def _lifted(scope: Scope, ref: ColumnRef) -> bool:
    """Whether the column is a subquery's, lifted as a hidden view."""
    return scope.tables[ref.alias].name.startswith(HIDDEN_PREFIX)


def mirror_right_join(select: exp.Select) -> exp.Select:
    """``FROM a RIGHT JOIN b ON ...`` is ``FROM b LEFT JOIN a ON ...`` (a copy; ``select``
    itself without a RIGHT JOIN). Only as the first join of one table, and without ``*``,
    whose columns would come in the other order; else refused by name."""
    joins = select.args.get("joins") or []
    rights = [i for i, j in enumerate(joins) if j.side.upper() == "RIGHT"]
    if not rights:
        return select
    if rights != [0]:
        raise refuse("a RIGHT JOIN after another join (write it as a LEFT JOIN)", joins[rights[-1]])
    if [star for star in select.find_all(exp.Star) if not isinstance(star.parent, exp.Count)]:
        raise refuse("SELECT * over a RIGHT JOIN (write it as a LEFT JOIN)")
    mirrored = select.copy()
    first = mirrored.args["joins"][0]
    left, right = mirrored.args["from_"].this, first.this
    mirrored.args["from_"].set("this", right.copy())
    first.set("this", left.copy())
    first.set("side", "LEFT")
    return mirrored


def outer_joins(select: exp.Select) -> dict[int, str]:
    """Each LEFT JOIN's ON (by identity) -> the alias of the table it joins."""
    found: dict[int, str] = {}
    for join in select.args.get("joins") or []:
        if join.side.upper() == "LEFT":
            alias = join.this.args.get("alias")
            name = alias.this if alias is not None else join.this.this
            found[id(join.args["on"])] = identifier(name, "table alias")
    return found


def plan_where(
    select: exp.Select,
    scope: Scope,
    ons: list[tuple[exp.Expression, Scope]],
    outer: dict[int, str] | None = None,
) -> tuple[tuple[JoinEdge, ...], tuple[Expr, ...]]:
    """ON and WHERE conjunctions -> join edges (deduplicated) and the remaining filters;
    ``outer`` as ``outer_joins`` gives it."""
    outer = outer or {}
    terms = [(term, on_scope, outer.get(id(on))) for on, on_scope in ons for term in conjuncts(on)]
    where = select.args.get("where")
    terms += [(t, scope, None) for t in conjuncts(where and where.this)]
    edges: dict[frozenset[ColumnRef], JoinEdge] = {}
    filters: list[Expr] = []
    for term, term_scope, left_of in terms:
        pred = predicate(term, lambda c, s=term_scope: typed_column(c, s), no_aggregates)
        edge = _edge(pred, scope, term)
        ends = set() if edge is None else {edge.left.alias, edge.right.alias}
        if left_of is not None and (left_of not in ends or len(ends & set(outer.values())) > 1):
            raise refuse(
                "a LEFT JOIN's ON other than equalities of its table's columns with tables "
                "joined before it (not by another LEFT JOIN)",
                term,
            )
        if edge is not None and (left_of is not None or not ends & set(outer.values())):
            edges.setdefault(frozenset((edge.left, edge.right)), edge)
            continue
        filters.append(pred)
    return tuple(edges.values()), tuple(filters)
