"""Before subqueries are lifted: a LEFT JOIN's ON conditions on its own table alone filter that
table before the join, so ``a LEFT JOIN b ON a.k = b.k AND b.status = 'open'`` is
``a LEFT JOIN (SELECT * FROM b WHERE b.status = 'open') b ON a.k = b.k``: a row of ``a`` whose
only matches fail the condition keeps its NULL row, which no WHERE filter could say (it would
drop that row). The derived table becomes a hidden view (``lift_subqueries``), so the LEFT
JOIN's own maintenance is unchanged. A condition that reads only the joined table's columns,
qualified or (as TPC-H Q13 writes ``o_comment``) unqualified but the joined table's alone,
moves; any other ON stays for ``plan_where`` to take or refuse.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from aggview.schema import TableSchema
from cumulus.passes.typecheck import conjuncts
from cumulus.sqltext import identifier


def push_outer_filters(select: exp.Select, table: Callable[[str], TableSchema]) -> exp.Select:
    """``select`` with each LEFT JOIN's own-table conditions moved into a filtered derived
    table (a copy; ``select`` itself where there is none)."""
    pushed, changed = select.copy(), False
    for join in pushed.args.get("joins") or []:
        moved = _movable(pushed, join, table)
        if not moved:
            continue
        changed = True
        kept = [c for c in conjuncts(join.args["on"]) if not any(c is m for m in moved)]
        alias = _alias(join.this)
        where = exp.and_(*(m.copy() for m in moved))
        derived = exp.select("*").from_(exp.Table(this=join.this.this.copy())).where(where)
        if alias != identifier(join.this.this, "table"):  # the filter reads the alias
            derived.args["from_"].this.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
        join.set("this", derived.subquery(alias))
        join.set("on", exp.and_(*kept) if kept else None)
    return pushed if changed else select


def _alias(node: exp.Table) -> str:
    alias = node.args.get("alias")
    if alias is not None and alias.this is not None:
        return identifier(alias.this, "table alias")
    return identifier(node.this, "table")


def _movable(
    select: exp.Select, join: exp.Join, table: Callable[[str], TableSchema]
) -> list[exp.Expression]:
    """The ON conjuncts of a LEFT JOIN of a table that read that table's columns alone (at
    least one, and not every conjunct: an equality must stay to join on)."""
    on = join.args.get("on")
    if join.side.upper() != "LEFT" or on is None or not isinstance(join.this, exp.Table):
        return []
    alias = _alias(join.this)
    try:
        own = {c.name for c in table(identifier(join.this.this, "table")).columns}
    except Exception:  # noqa: BLE001 - an unknown table: resolve_tables names it
        return []
    others = _other_columns(select, join, table)
    terms = list(conjuncts(on))
    moved = [t for t in terms if _reads_only(t, alias, own, others)]
    return moved if len(moved) < len(terms) else []


def _other_columns(
    select: exp.Select, join: exp.Join, table: Callable[[str], TableSchema]
) -> set[str]:
    """Every column name of the other tables in FROM (an unqualified name one of them has too
    is ambiguous: not moved)."""
    items = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
    names: set[str] = set()
    for item in items:
        if item is join.this or not isinstance(item, exp.Table):
            continue
        try:
            names |= {c.name for c in table(identifier(item.this, "table")).columns}
        except Exception:  # noqa: BLE001 - as above
            continue
    return names


def _reads_only(term: exp.Expression, alias: str, own: set[str], others: set[str]) -> bool:
    """Whether ``term`` reads columns, all of them the joined table's, and nothing else that
    varies (no subquery)."""
    if term.find(exp.Subquery, exp.Select):
        return False
    columns = list(term.find_all(exp.Column))
    if not columns:
        return False
    for column in columns:
        qualifier = column.args.get("table")
        if qualifier is not None:
            if identifier(qualifier, "table alias") != alias:
                return False
        elif column.name not in own or column.name in others:
            return False
    return True
