"""Bulk initialization of an M3 program's maps with Spark SQL: every map's definition
``AggSum([keys], R(..) * S(..) * guards * values)`` evaluated over a snapshot of the relations,
so a program can start over tables that already hold rows (DBToaster's ``SYSTEM READY``), as
views can (``aggspark.compute``, whose rendering of plan expressions this reuses).

A variable becomes the first column it occurs in; each further occurrence is an equality
(``<=>``, as the interpreter matches keys); a lifted variable is its expression; a map lift
(``(v ^= M[k])``, ``MIN(cnt[g, v])``) a LEFT JOIN of that map, computed before. Sums are
taken in DECIMAL(38, s) (DOUBLE for FLOAT), so they are exact or fail loudly, like the view
path's.
"""

from __future__ import annotations

import graphlib
import uuid
from typing import Any

from aggspark.compute import group_by_position, quote, render
from aggspark.source import spark_type
from aggview import errors
from aggview.schema import ColumnType
from cumulus.m3.exprs import is_predicate
from cumulus.m3.order import needed
from cumulus.m3.program import (
    AggSum,
    Expr,
    Guard,
    Lift,
    MapExtreme,
    MapLift,
    MapRef,
    Program,
    Rel,
    Value,
    lift_keys,
    part_refs,
)
from cumulus.typerules import accumulator_type

Key = tuple[Any, ...]


def _columns(
    definition: AggSum, program: Program, tables: dict[str, str], maps: dict[str, str]
) -> tuple[str, dict[str, Expr], list[str]]:
    """FROM items (relations and maps crossed, then each map lift LEFT JOINed on its keys),
    each variable as a plan expression over them, and the conditions of repeated variables.

    Equal variables compare with ``<=>``, as the interpreter's lookups do (NULL is a key like
    any other: the compiler guards join keys where SQL says NULL matches nothing)."""
    sources: list[str] = []
    binding: dict[str, Expr] = {}
    equal: list[str] = []

    def bind(var: str, here: Expr) -> None:
        if var in binding:
            equal.append(f"({render(binding[var])} <=> {render(here)})")
        else:
            binding[var] = here

    for factor in definition.body:
        if isinstance(factor, Rel):
            alias = f"a{len(sources)}"
            sources.append(f"{tables[factor.relation]} AS {quote(alias)}")
            columns = program.source(factor.relation).column_names()
            for var, column in zip(factor.args, columns, strict=True):
                bind(var, {"col": [alias, column]})
        elif isinstance(factor, MapRef) and not isinstance(factor, MapLift):
            alias = f"a{len(sources)}"
            sources.append(f"{_map_view(factor.name, maps)} AS {quote(alias)}")
            for i, var in enumerate(factor.keys):
                bind(var, {"col": [alias, f"k{i}"]})
    from_items = " CROSS JOIN ".join(sources) or "(SELECT 1 AS unit) AS `unit`"
    todo = [f for f in definition.body if isinstance(f, Lift | MapLift)]
    while todo:  # each as soon as what it reads is bound (a lift may read another's value)
        factor = next((f for f in todo if needed(f) <= binding.keys()), None)
        if factor is None:
            missing = sorted(set().union(*(needed(f) for f in todo)) - binding.keys())
            raise errors.InvalidArgument(f"variable {missing[0]} is bound by nothing")
        todo.remove(factor)
        if isinstance(factor, Lift):  # a lift's NULL is a key like any other
            bind(factor.var, _substitute(factor.expr, binding))
            continue
        alias = f"l{len(definition.body) - len(todo)}"
        keys = lift_keys(factor)
        on = [f"{quote(alias)}.k{i} <=> {render(binding[k])}" for i, k in enumerate(keys)]
        if isinstance(factor, MapExtreme):
            if factor.adjust is not None:
                raise errors.InvalidArgument(f"a definition's MIN/MAX of {factor.name} adjusts")
            table = _extreme_view(factor, maps)
            value: Expr = {"col": [alias, "value"]}  # NULL where no count is positive
        else:
            table = _map_view(factor.name, maps)
            total = str(accumulator_type(program.map(factor.name).value_type))
            zero = {"lit": 0, "type": "INT"}  # no entry: an empty nested aggregate, 0
            value = {"coalesce": [{"col": [alias, "value"]}, zero], "type": total}
        from_items += f" LEFT JOIN {table} AS {quote(alias)} ON {' AND '.join(on) or 'TRUE'}"
        bind(factor.var, value)
    return from_items, binding, equal


def _map_view(name: str, maps: dict[str, str]) -> str:
    """The Spark view of a map computed before (columns k0, k1, ..., value)."""
    if name not in maps:
        raise errors.FailedPrecondition(f"map {name} is read before it is computed")
    return maps[name]


def _extreme_view(factor: MapExtreme, maps: dict[str, str]) -> str:
    """``MIN(cnt[g, v])`` per prefix g: the least (greatest) v whose count is positive."""
    width = len(factor.keys) - 1
    prefix = [f"k{i}" for i in range(width)]
    last = f"k{width}"
    items = ", ".join([*prefix, f"{factor.extreme.upper()}({last}) AS value"])
    group = f" GROUP BY {', '.join(prefix)}" if prefix else ""
    table = _map_view(factor.name, maps)
    return f"(SELECT {items} FROM {table} WHERE value > 0 AND {last} IS NOT NULL{group})"


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
    definition: AggSum,
    value_type: ColumnType,
    program: Program,
    tables: dict[str, str],
    maps: dict[str, str] | None = None,
) -> str:
    """``SELECT k0, k1, ..., value FROM ... WHERE ... GROUP BY k0, k1, ...`` for a definition;
    ``tables`` names the Spark table (or temporary view) of each relation, ``maps`` that of
    each map the definition reads (a nested aggregate's, computed first)."""
    sources, binding, conditions = _columns(definition, program, tables, maps or {})
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
    return f"SELECT {', '.join([*keys, measure])} FROM {sources}{where}{group}"


def _value(value_type: ColumnType, total: Any) -> Any:
    if value_type.kind == "FLOAT":
        return float(total)
    if value_type.kind == "INT":
        return int(total)
    return total


def initial_maps(spark: Any, program: Program, tables: dict[str, str]) -> dict[str, dict[Key, Any]]:
    """Every map's contents over the snapshot in ``tables`` (zero entries left out). A map
    whose definition reads other maps (a nested aggregate's lift, the unmatched rows of an
    outer join) is computed after them, from temporary views of them dropped at the end."""
    out: dict[str, dict[Key, Any]] = {}
    decls = {decl.name: decl for decl in program.maps}
    reads: dict[str, set[str]] = {}
    for decl in program.maps:
        if decl.definition is None:
            raise errors.FailedPrecondition(
                f"map {decl.name} has no definition, so it cannot be computed from the tables"
            )
        reads[decl.name] = {f.name for f in decl.definition.body if isinstance(f, MapRef)}
    read = set().union(*reads.values())
    views: dict[str, str] = {}
    cached: list[Any] = []
    tag = uuid.uuid4().hex[:12]
    try:
        for name in graphlib.TopologicalSorter(reads).static_order():
            decl = decls[name]
            assert decl.definition is not None
            query = definition_sql(decl.definition, decl.value_type, program, tables, views)
            frame = spark.sql(query)
            if name in read:  # read by later maps: computed once
                frame = frame.cache()
                cached.append(frame)
                views[name] = f"m3init_{tag}_{len(views)}"
                frame.createOrReplaceTempView(views[name])
            entries: dict[Key, Any] = {}
            width = len(decl.keys)
            for row in frame.collect():
                if row["value"] is not None and row["value"] != 0:
                    entries[tuple(row[:width])] = _value(decl.value_type, row["value"])
            out[name] = entries
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)
        for frame in cached:
            frame.unpersist()
    return {decl.name: out[decl.name] for decl in program.maps}


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
        rows = spark.sql(f"SELECT {columns} FROM {tables[relation]}").collect()
        out[relation] = [tuple(row) for row in rows]
    return out
