"""A view computed from scratch by Spark SQL at one snapshot: the view's own join, filters and
groups, and per group the hidden state maintenance keeps (``cumulus.aggstate``): ``_count``,
``n<i>``/``s<i>`` for COUNT, SUM and AVG, and the value multisets ``m<i>`` for MIN, MAX and
COUNT(DISTINCT). The plan's expression trees are rendered to Spark SQL; the session runs in
ANSI mode without decimal precision loss, so arithmetic is exact or fails loudly.
"""

from __future__ import annotations

import json
from typing import Any

from aggspark.source import spark_type
from aggview.merge import combine
from aggview.schema import Column, ColumnType, to_storage
from cumulus.aggstate import NO_GROUP_KEY, Row, ViewState, sum_state
from cumulus.plan import JoinEdge
from cumulus.typerules import INT, TEXT, accumulator_type

State = dict[bytes, Row]
_CMP = {"=": "=", "<>": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def render(expr: dict[str, Any]) -> str:
    """A plan expression or predicate as Spark SQL with the evaluator's meaning."""
    if "col" in expr:
        alias, column = expr["col"]
        return f"{quote(alias)}.{quote(column)}"
    if "lit" in expr:
        return _literal(expr["lit"], ColumnType.parse(expr["type"]))
    if "op" in expr:
        left, right = (render(a) for a in expr["args"])
        if expr["op"] == "/":  # the evaluator divides as floats; a zero divisor gives NULL
            return f"try_divide(CAST({left} AS DOUBLE), CAST({right} AS DOUBLE))"
        return f"({left} {expr['op']} {right})"
    if "neg" in expr:
        return f"(- {render(expr['neg'])})"
    if "cmp" in expr:
        left, right = (render(a) for a in expr["args"])
        return f"({left} {_CMP[expr['cmp']]} {right})"
    if "in" in expr:
        values = ", ".join(render(v) for v in expr["values"])
        return f"({render(expr['in'])} IN ({values}))"
    if "between" in expr:
        subject, low, high = (render(expr[k]) for k in ("between", "low", "high"))
        return f"({subject} BETWEEN {low} AND {high})"
    if "not" in expr:
        return f"(NOT {render(expr['not'])})"
    if "and" in expr:
        return "(" + " AND ".join(render(p) for p in expr["and"]) + ")" if expr["and"] else "TRUE"
    if "or" in expr:
        return "(" + " OR ".join(render(p) for p in expr["or"]) + ")"
    if "like" in expr:  # no escape character: the compiler refuses a backslash
        return f"({render(expr['like'])} LIKE {_literal(expr['pattern'], TEXT)})"
    if "notnull" in expr:
        return f"({render(expr['notnull'])} IS NOT NULL)"
    if "null" in expr:  # typed where a LEFT JOIN's unmatched column became it: a function's
        # argument then has the type Spark needs to resolve the call
        return (
            f"CAST(NULL AS {spark_type(ColumnType.parse(expr['type']))})"
            if "type" in expr
            else "NULL"
        )
    # CASE and COALESCE cast each branch to the result type, not only the result: Spark
    # first widens the branches to a common type, which for DECIMAL(38, 1) beside
    # DECIMAL(8, 2) keeps 38 digits by dropping the second scale digit (1.55 became 1.6).
    if "case" in expr:
        cast = spark_type(ColumnType.parse(expr["type"]))
        whens = " ".join(
            f"WHEN {render(w)} THEN CAST({render(t)} AS {cast})" for w, t in expr["case"]
        )
        otherwise = f" ELSE CAST({render(expr['else'])} AS {cast})" if "else" in expr else ""
        return f"CASE {whens}{otherwise} END"
    if "coalesce" in expr:
        cast = spark_type(ColumnType.parse(expr["type"]))
        return f"COALESCE({', '.join(f'CAST({render(a)} AS {cast})' for a in expr['coalesce'])})"
    if "fn" in expr:
        return _function(expr["fn"], expr["args"], expr.get("type"))
    if "finish" in expr:  # an M3 lift of a nested SUM or AVG (``cumulus.m3.exprs._finish``)
        return _finish(expr["finish"], ColumnType.parse(expr["type"]), *expr["args"])
    raise ValueError(f"cannot render {expr!r} to Spark SQL")  # "out" only occurs in HAVING


def _function(name: str, args: list[dict[str, Any]], type_text: str | None) -> str:
    """A scalar function as Spark SQL: GREATEST and LEAST skip NULLs as the evaluator does (their
    arguments cast to the result type, as the evaluator converts them); SUBSTRING's bounds are
    constants the compiler checked (start >= 1, length >= 0), where Spark counts as PostgreSQL."""
    if name in ("greatest", "least"):
        cast = spark_type(ColumnType.parse(str(type_text)))
        return f"{name.upper()}({', '.join(f'CAST({render(a)} AS {cast})' for a in args)})"
    subject = render(args[0])
    if name == "abs":
        return f"ABS({subject})"
    if name == "substring":
        return f"SUBSTRING({subject}, {', '.join(str(int(a['lit'])) for a in args[1:])})"
    if name in ("year", "month", "day"):
        return f"CAST(EXTRACT({name.upper()} FROM {subject}) AS {spark_type(INT)})"
    raise ValueError(f"cannot render function {name!r} to Spark SQL")


def _finish(kind: str, result: ColumnType, total: dict[str, Any], count: dict[str, Any]) -> str:
    """SUM or AVG from a sum and a count as ``finish_sum`` computes it: NULL over no value,
    AVG rounded half-even. The quotient is taken at scale s + 11 (a count below 10^10), so
    its half-up rounding cannot make a tie that ``bround`` then rounds the wrong way."""
    s, n = render(total), render(count)
    if result.kind == "FLOAT":
        value = f"CAST({s} AS DOUBLE)" + (f" / CAST({n} AS DOUBLE)" if kind == "avg" else "")
    else:
        scale = result.scale or 0
        if kind == "avg":
            wide = 10 if result.kind == "INT" else scale  # INT truncates the exact quotient
            s = f"(CAST({s} AS DECIMAL(27, {wide})) / CAST({n} AS DECIMAL(10, 0)))"
        rounded = s if result.kind == "INT" else f"bround({s}, {scale})"
        target = result if result.kind == "INT" else accumulator_type(result)  # BIGINT truncates
        value = f"CAST({rounded} AS {spark_type(target)})"
    return f"(CASE WHEN COALESCE({n}, 0) = 0 THEN NULL ELSE {value} END)"


def _literal(value: Any, column_type: ColumnType) -> str:
    kind = column_type.kind
    if kind == "TEXT":
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    if kind == "DATE":
        return f"DATE '{value}'"
    if kind == "BOOL":
        return "TRUE" if value else "FALSE"
    if kind == "DECIMAL":
        return f"CAST('{value}' AS {spark_type(column_type)})"
    return f"CAST({value!r} AS {spark_type(column_type)})"


def _from_where(state: ViewState, tables: dict[str, str], *extra: str) -> str:
    """The plan's join as Spark SQL: inner tables crossed and matched in WHERE, then each
    outer alias (a LEFT JOIN, an anti-join's hidden table) LEFT JOINed on its equalities."""
    plan = state.plan

    def equal(e: JoinEdge) -> str:
        left, right = e.left, e.right
        return (
            f"{quote(left.alias)}.{quote(left.column)} = {quote(right.alias)}.{quote(right.column)}"
        )

    inner = [t for t in plan.tables if t.alias not in plan.outer]
    # a LEFT JOIN's ON may read any inner table: crossed explicitly, a comma would bind looser
    comma = " CROSS JOIN " if plan.outer else ", "
    sources = comma.join(f"{tables[t.table]} AS {quote(t.alias)}" for t in inner)
    for alias in plan.outer:
        on = [equal(e) for e in plan.edges if alias in (e.left.alias, e.right.alias)]
        sources += f" LEFT JOIN {tables[plan.table_of(alias)]} AS {quote(alias)}"
        sources += f" ON {' AND '.join(on)}"
    conditions = [
        equal(e) for e in plan.edges if not {e.left.alias, e.right.alias} & set(plan.outer)
    ]
    conditions += [render(f) for f in plan.filters]
    conditions += extra
    return f"FROM {sources}" + (f" WHERE {' AND '.join(conditions)}" if conditions else "")


def state_queries(state: ViewState, tables: dict[str, str]) -> tuple[str, list[tuple[int, str]]]:
    """The main query (groups, counts, sums) and one query per multiset aggregate."""
    plan = state.plan
    groups = [f"{render(g.source())} AS g{i}" for i, g in enumerate(plan.group_by)]
    # by position: a name (g0, v) could also be a column of a joined table, which Spark
    # resolves first (two tables with a column v made GROUP BY v ambiguous)
    group_by = group_by_position(len(plan.group_by))
    body = _from_where(state, tables)
    items = [*groups, "COUNT(*) AS `_count`"]
    multisets = []
    for i, (aggregate, rule) in enumerate(zip(plan.aggregates, state.rules, strict=True)):
        if aggregate.arg is None:
            continue
        arg = render(aggregate.arg)
        arg_type = state.arg_types[i]
        assert arg_type is not None
        if not rule.keeps_values:
            items.append(f"COUNT({arg}) AS n{i}")
        if rule.keeps_sum:
            items.append(f"SUM(CAST({arg} AS {spark_type(accumulator_type(arg_type))})) AS s{i}")
        if rule.keeps_values:
            keys = [*groups, f"{arg} AS v"]
            present = _from_where(state, tables, f"({arg}) IS NOT NULL")
            keys_by = group_by_position(len(keys))
            multisets.append((i, f"SELECT {', '.join(keys)}, COUNT(*) AS c {present}{keys_by}"))
    return f"SELECT {', '.join(items)} {body}{group_by}", multisets


def group_by_position(width: int) -> str:
    """``GROUP BY 1, 2, ...`` over the first ``width`` items (none: no GROUP BY)."""
    return " GROUP BY " + ", ".join(str(n) for n in range(1, width + 1)) if width else ""


def compute_states(spark: Any, state: ViewState, tables: dict[str, str]) -> State:
    """Every group's state, keyed as the view stores it. ``tables`` maps each base table to
    the name of a Spark temporary view holding its rows at the snapshot. A UNION ALL's
    branches are computed each and added, as maintenance adds their deltas."""
    out = _branch_states(spark, state, tables)
    for branch in state.branches:
        for key, fields in _branch_states(spark, branch, tables).items():
            out[key] = combine(out.get(key, {}), fields)
    return out


def _branch_states(spark: Any, state: ViewState, tables: dict[str, str]) -> State:
    main, multisets = state_queries(state, tables)
    plan = state.plan
    width = len(plan.group_by)
    out: State = {}
    for row in spark.sql(main).collect():
        if not row["_count"]:
            continue  # an aggregate without GROUP BY over no rows: no stored group
        key = state.encode_group(list(row[:width])) if width else NO_GROUP_KEY
        fields: Row = {"_count": int(row["_count"])}
        for i, (aggregate, rule) in enumerate(zip(plan.aggregates, state.rules, strict=True)):
            if aggregate.arg is None or rule.keeps_values or not row[f"n{i}"]:
                continue
            fields[f"n{i}"] = int(row[f"n{i}"])
            if rule.keeps_sum:
                arg_type = state.arg_types[i]
                assert arg_type is not None
                fields[f"s{i}"] = sum_state(arg_type, row[f"s{i}"])
        out[key] = fields
    for i, query in multisets:
        arg_type = state.arg_types[i]
        assert arg_type is not None
        column = Column("v", arg_type)
        for row in spark.sql(query).collect():
            key = state.encode_group(list(row[:width])) if width else NO_GROUP_KEY
            stored = to_storage(column, row["v"], table=plan.name)
            out[key].setdefault(f"m{i}", {})[json.dumps(stored)] = int(row["c"])
    return out


def needed_columns(state: ViewState) -> dict[str, list[str]]:
    """Per base table, the columns the view reads (column pruning for the snapshot reads)."""
    out = {}
    for table in state.plan.base_tables():
        columns: list[str] = []
        key = ""
        for branch in [state, *state.branches]:
            aliases = branch.plan.aliases_of(table)
            columns += [c for alias in aliases for c in branch.plan.columns_of(alias)]
            key = key or (branch.schemas[aliases[0]].primary_key[0] if aliases else "")
        # COUNT(*) over a table no column of which is used still reads its key
        out[table] = list(dict.fromkeys(columns)) or [key]
    return out
