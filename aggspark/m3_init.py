"""Bulk initialization of an M3 program's maps with Spark SQL: every map's definition
``AggSum([keys], R(..) * S(..) * guards * values)`` evaluated over a snapshot of the relations,
so a program can start over tables that already hold rows (DBToaster's ``SYSTEM READY``), as
views can (``aggspark.compute``, whose rendering of plan expressions this reuses).

A variable becomes the first column it occurs in; each further occurrence is an equality; a
lifted variable is its expression. Sums are taken in DECIMAL(38, s) (DOUBLE for FLOAT), so they
are exact or fail loudly, like the view path's.
"""

from __future__ import annotations

from typing import Any

from aggspark.compute import group_by_position, quote, render
from aggspark.source import spark_type
from aggview import errors
from aggview.schema import ColumnType
from cumulus.m3.exprs import is_predicate
from cumulus.m3.program import AggSum, Expr, Guard, Lift, Program, Rel, Value, part_refs
from cumulus.typerules import accumulator_type

Key = tuple[Any, ...]


def _columns(definition: AggSum, program: Program) -> tuple[list[str], dict[str, Expr], list[str]]:
    """FROM items, each variable as a plan expression over them, and the join equalities."""
    sources: list[str] = []
    binding: dict[str, Expr] = {}
    equal: list[str] = []
    atoms = [f for f in definition.body if isinstance(f, Rel)]
    for n, atom in enumerate(atoms):
        alias = f"a{n}"
        sources.append(alias)
        columns = program.source(atom.relation).column_names()
        for var, column in zip(atom.args, columns, strict=True):
            here: Expr = {"col": [alias, column]}
            if var in binding:
                equal.append(f"({render(binding[var])} = {render(here)})")
            else:
                binding[var] = here
    for lift in (f for f in definition.body if isinstance(f, Lift)):
        value = _substitute(lift.expr, binding)
        if lift.var in binding:  # a lift's NULL is a key like any other
            equal.append(f"({render(binding[lift.var])} <=> {render(value)})")
        else:
            binding[lift.var] = value
    return sources, binding, equal


def _substitute(expr: Any, binding: dict[str, Expr]) -> Any:
    """Variables replaced by their columns, through lists (CASE's [condition, value] pairs)."""
    if isinstance(expr, list):
        return [_substitute(v, binding) for v in expr]
    if not isinstance(expr, dict):
        return expr
    if "var" in expr:
        return binding[expr["var"]]
    return {key: _substitute(value, binding) for key, value in expr.items()}


def definition_sql(
    definition: AggSum, value_type: ColumnType, program: Program, tables: dict[str, str]
) -> str:
    """``SELECT k0, k1, ..., value FROM ... WHERE ... GROUP BY k0, k1, ...`` for a definition;
    ``tables`` names the Spark table (or temporary view) of each relation."""
    atoms = [f for f in definition.body if isinstance(f, Rel)]
    sources, binding, conditions = _columns(definition, program)
    items = [f"{tables[a.relation]} AS {quote(s)}" for a, s in zip(atoms, sources, strict=True)]
    for guard in (f for f in definition.body if isinstance(f, Guard)):
        pred = guard.pred
        if "notnull" in pred:
            conditions.append(f"({render(_substitute(pred['notnull'], binding))} IS NOT NULL)")
        else:
            conditions.append(render(_substitute(pred, binding)))
    values = [
        render(_substitute(f.expr, binding))
        for f in definition.body
        if isinstance(f, Value) and not is_predicate(f.expr)
    ]
    keys = [f"{render(binding[k])} AS k{i}" for i, k in enumerate(definition.keys)]
    product = " * ".join(values) if values else "1"
    measure = f"SUM(CAST({product} AS {spark_type(accumulator_type(value_type))})) AS value"
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    group = group_by_position(len(keys))  # a name k0 could be a joined table's column
    return f"SELECT {', '.join([*keys, measure])} FROM {', '.join(items)}{where}{group}"


def _value(value_type: ColumnType, total: Any) -> Any:
    if value_type.kind == "FLOAT":
        return float(total)
    if value_type.kind == "INT":
        return int(total)
    return total


def initial_maps(spark: Any, program: Program, tables: dict[str, str]) -> dict[str, dict[Key, Any]]:
    """Every map's contents over the snapshot in ``tables`` (zero entries left out)."""
    out: dict[str, dict[Key, Any]] = {}
    for decl in program.maps:
        if decl.definition is None:
            raise errors.FailedPrecondition(
                f"map {decl.name} has no definition, so it cannot be computed from the tables"
            )
        query = definition_sql(decl.definition, decl.value_type, program, tables)
        entries: dict[Key, Any] = {}
        width = len(decl.keys)
        for row in spark.sql(query).toLocalIterator():
            if row["value"] is not None and row["value"] != 0:
                entries[tuple(row[:width])] = _value(decl.value_type, row["value"])
        out[decl.name] = entries
    return out


def initial_relations(
    spark: Any, program: Program, tables: dict[str, str]
) -> dict[str, list[tuple[Any, ...]]]:
    """The rows of the relations the program reads directly (a bounded ``--depth``)."""
    read = {r.relation for _, s in program.statements() for r in s.body if isinstance(r, Rel)}
    for view in program.views:
        for part in [view.rows, *(p for c in view.columns for p in (*c.parts, c.count) if p)]:
            read |= {r.relation for r in part_refs(part) if isinstance(r, Rel)}
    out = {}
    for relation in sorted(read):
        columns = ", ".join(quote(c) for c in program.source(relation).column_names())
        rows = spark.sql(f"SELECT {columns} FROM {tables[relation]}").toLocalIterator()
        out[relation] = [tuple(row) for row in rows]
    return out
