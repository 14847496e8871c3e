"""The view language's scalar breadth (issue #41): CASE, IN and NOT IN lists (with NULL),
BETWEEN, COALESCE, LIKE with a constant pattern, OR, IS [NOT] NULL -- compiled by the view
compiler and evaluated by the one evaluator (sync and async views, the M3 interpreter and the
Cumulus runtime all use it) -- against duckdb on every row of a grid, NULLs included: three-valued
logic, a WHERE keeps a row only when its condition is TRUE.

Whole views in every mode are checked against duckdb by the differential tests, whose
generator draws these constructs (``test_views_differential``, ``test_m3_differential``,
``test_cumulus_views``).
"""

from __future__ import annotations

import itertools
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from aggcli.cli import main
from aggview.merge import combine
from aggview.schema import Column, ColumnType, TableSchema, to_storage
from cumulus.aggstate import ViewState
from cumulus.compiler import compile_sql
from cumulus.expressions import compile_expr, compile_filters
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter

SCHEMA = TableSchema(
    "t",
    "t1",
    (
        Column("id", ColumnType("INT"), nullable=False),
        Column("x", ColumnType("INT")),
        Column("g", ColumnType("TEXT")),
        Column("v", ColumnType("DECIMAL", 8, 2)),
        Column("f", ColumnType("FLOAT")),
    ),
    ("id",),
)

CONDITIONS = [
    "x IN (1, 2)",
    "x IN (1, NULL)",
    "x NOT IN (1, NULL)",
    "x NOT IN (1, 2)",
    "x BETWEEN 1 AND 3",
    "x NOT BETWEEN 1 AND 3",
    "x > 2 OR g = 'a'",
    "x > 2 OR x IS NULL",
    "NOT (x > 2 OR g = 'a')",
    "(x = 1 OR g LIKE 'a%') AND NOT (v < 0 AND x = 2)",
    "NOT (x = 1 AND g = 'b')",
    "g LIKE 'a%'",
    "g LIKE '_b%'",
    "g NOT LIKE '%a_'",
    "g LIKE 'a.b*'",  # regex characters are plain
    "g IS NULL",
    "g IS NOT NULL",
    "COALESCE(x, 0) < 2",
    "COALESCE(g, 'none') = 'none'",
    "CASE WHEN x > 1 THEN g ELSE 'z' END = 'z'",
    "CASE x WHEN 1 THEN v WHEN 2 THEN 0 END >= 0",
    "IF(x > 1, v, 1.5) > 1",
]

VALUES = [
    "CASE WHEN x > 1 THEN v ELSE 0 END",
    "CASE WHEN x > 1 THEN v END",
    "CASE WHEN g IN ('a', NULL) THEN 1 WHEN g LIKE 'b%' THEN 2.5 ELSE f END",
    "CASE x WHEN 1 THEN 'one' WHEN 2 THEN g END",
    "COALESCE(x, v, -1)",
    "COALESCE(f, x)",
    "COALESCE(g, 'none')",
    "COALESCE(NULL, x)",
    "CASE WHEN x > 0 OR f > 0 THEN x * 2 + 1 ELSE NULL END",
]

GRID = [  # every combination: NULL in each column, LIKE's corner cases, zero and signs
    {"id": i, "x": x, "g": g, "v": v, "f": f}
    for i, (x, g, v, f) in enumerate(
        itertools.product(
            [None, -1, 1, 2, 3],
            [None, "a", "ab", "b", "ba", "a.b*", "", "c_a"],
            [None, Decimal("-1.50"), Decimal("0.00"), Decimal("2.25")],
            [None, 0.0, 3.0],
        )
    )
]


@pytest.fixture(scope="module")
def grid() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id INT, x INT, g TEXT, v DECIMAL(8,2), f DOUBLE)")
    con.executemany(
        "INSERT INTO t VALUES (?, ?, ?, ?, ?)",
        [[r[c] for c in ("id", "x", "g", "v", "f")] for r in GRID],
    )
    return con


def _lookup(row: dict[str, Any]) -> Any:
    return lambda _alias, column: row[column]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_conditions_keep_the_rows_duckdb_keeps(
    grid: duckdb.DuckDBPyConnection, condition: str
) -> None:
    plan = compile_sql(
        f"CREATE MATERIALIZED VIEW v AS SELECT COUNT(*) FROM t WHERE {condition}",
        lambda name: SCHEMA,
    )
    keep = compile_filters(plan.filters)
    kept = {row["id"] for row in GRID if keep(_lookup(row))}
    want = {i for (i,) in grid.execute(f"SELECT id FROM t WHERE {condition}").fetchall()}
    assert kept == want, (condition, plan.filters, sorted(kept ^ want)[:5])
    assert 0 < len(want) < len(GRID) or "NOT IN (1, NULL)" in condition  # a real test


@pytest.mark.parametrize("value", VALUES)
def test_values_equal_duckdbs(grid: duckdb.DuckDBPyConnection, value: str) -> None:
    plan = compile_sql(
        f"CREATE MATERIALIZED VIEW v AS SELECT MAX({value}) FROM t", lambda name: SCHEMA
    )
    (aggregate,) = plan.aggregates
    evaluate = compile_expr(aggregate.arg)
    want = dict(grid.execute(f"SELECT id, {value} FROM t").fetchall())
    python_type = {"INT": int, "FLOAT": float, "TEXT": str}.get(aggregate.arg_type or "", Decimal)
    for row in GRID:
        got = evaluate(_lookup(row))
        assert got == want[row["id"]], (value, row, got, want[row["id"]])
        # the value has its type's Python type, whatever branch gave it
        assert got is None or type(got) is python_type, (aggregate.arg_type, got)


def test_group_by_an_expression_by_itself_its_alias_or_its_position() -> None:
    for group in ("CASE WHEN x > 1 THEN 'hi' ELSE g END", "bucket", "1"):
        plan = compile_sql(
            "CREATE MATERIALIZED VIEW v AS SELECT CASE WHEN x > 1 THEN 'hi' ELSE g END AS "
            f"bucket, COUNT(*) FROM t GROUP BY {group}",
            lambda name: SCHEMA,
        )
        (column,) = plan.group_by
        assert (column.name, column.ref, column.type) == ("bucket", None, "TEXT")
        assert column.expr is not None and "case" in column.expr
        assert plan.output == ("bucket", "count")
        assert plan.columns_of("t") == ("x", "g")


# === expressions over aggregates (step 2) =======================================================


def test_an_expression_over_aggregates_keeps_its_aggregates_hidden() -> None:
    plan = compile_sql(
        "CREATE MATERIALIZED VIEW v AS SELECT g, SUM(v) AS s, SUM(v) / SUM(x) AS r, "
        "CASE WHEN COUNT(*) > 0 THEN SUM(v) / COUNT(*) END AS c, AVG(x) * 2 AS a2 "
        "FROM t GROUP BY g HAVING r > 1",
        lambda name: SCHEMA,
    )
    assert plan.output == ("g", "s", "r", "c", "a2")
    assert [(a.name, a.kind, a.hidden) for a in plan.aggregates] == [
        ("s", "sum", False),  # reused by r and c, never computed twice
        ("_agg0", "sum", True),
        ("_agg1", "count_star", True),
        ("_agg2", "avg", True),
    ]
    assert [(d.name, d.type) for d in plan.derived] == [
        ("r", "FLOAT"),  # "/" is FLOAT, NULL by zero
        ("c", "FLOAT"),
        ("a2", "DECIMAL(38,6)"),  # AVG(INT) is DECIMAL(38,6); * INT keeps it
    ]
    assert plan.having == {"cmp": ">", "args": [{"out": "r"}, {"lit": 1, "type": "INT"}]}


def test_the_m3_program_of_a_ratio_has_the_two_sums_maps_and_no_more(
    tmp_path: Path, capsys: Any
) -> None:
    schema = tmp_path / "schema.sql"
    schema.write_text(
        "CREATE TABLE t (id INT PRIMARY KEY, a INT NOT NULL, b DECIMAL(8,2) NOT NULL);\n"
    )
    main(["m3", "--schema", str(schema), "SELECT SUM(a) / SUM(b) AS r FROM t"])
    text = capsys.readouterr().out
    maps = re.findall(r"^DECLARE MAP (\w+)", text, re.MULTILINE)
    assert maps == ["q_rows", "q_agg0", "q_agg1"]  # the group's rows, SUM(a), SUM(b)
    assert "r := {_agg0 / _agg1} : float" in text
    assert "HIDDEN _agg0 := SUM(q_agg0(int)[][], q_rows(int)[][]) : int" in text
    assert "q_agg1(decimal(38,2))[][] += -1 * b;" in text


def test_a_ratio_is_null_by_zero_in_every_mode() -> None:
    """``/`` is FLOAT division and NULL by zero (PostgreSQL raises, which would make the view
    unreadable; duckdb gives inf): the sync/async read-out and the M3 read-out agree."""
    schemas = {"t": SCHEMA}
    plan = plan_of("SELECT g, SUM(v) / SUM(x) AS r FROM t GROUP BY g", "q", schemas.__getitem__)
    interp = Interpreter(compile_program([plan], schemas.__getitem__))
    state = ViewState(plan, schemas.__getitem__)
    rows = [
        {"id": 1, "x": 0, "g": "zero", "v": Decimal("1.50"), "f": None},
        {"id": 2, "x": 4, "g": "four", "v": Decimal("3.00"), "f": None},
        {"id": 3, "x": None, "g": "none", "v": Decimal("3.00"), "f": None},
    ]
    states: dict[bytes, dict[str, Any]] = {}
    for row in rows:
        interp.insert("t", row)
        binding = {"t": {c: to_storage(SCHEMA.column(c), row[c], table="t") for c in row}}
        lookup = state.lookup(binding)
        key = state.group_key(lookup)
        states[key] = combine(states.get(key, {}), state.tuple_delta(lookup, 1))
    finished = [state.finalize(k, s) for k, s in states.items()]
    want = [{"g": "zero", "r": None}, {"g": "four", "r": 0.75}, {"g": "none", "r": None}]
    assert sorted(map(repr, finished)) == sorted(map(repr, want))
    assert sorted(map(repr, interp.view("q"))) == sorted(map(repr, want))


# === JOIN ... USING and NATURAL JOIN =============================================================

ORDERS = TableSchema(
    "orders",
    "t2",
    (
        Column("id", ColumnType("INT"), nullable=False),
        Column("x", ColumnType("INT")),
        Column("qty", ColumnType("INT")),
    ),
    ("id",),
)
JOINED = {"t": SCHEMA, "orders": ORDERS}


def joined(select: str) -> Any:
    return compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}", JOINED.__getitem__)


def test_using_and_natural_join_are_the_equalities_they_stand_for() -> None:
    on = joined(
        "SELECT t.x, COUNT(*) AS n FROM t JOIN orders o ON t.id = o.id AND t.x = o.x GROUP BY t.x"
    )
    natural = joined("SELECT x, COUNT(*) AS n FROM t NATURAL JOIN orders GROUP BY x")
    using = joined("SELECT x, COUNT(*) AS n FROM t JOIN orders USING (id, x) GROUP BY x")
    assert natural.edges == using.edges  # id and x: the columns t and orders both have
    assert {(e.left.column, e.right.column) for e in natural.edges} == {("id", "id"), ("x", "x")}
    assert natural.group_by[0].ref == on.group_by[0].ref  # bare x: the first table's
    # SELECT * shows a merged column once, where the first table has it (as SQL does); the
    # others that both tables have are qualified
    assert joined("SELECT * FROM t JOIN orders USING (x)").output == (
        "t_id", "x", "g", "v", "f", "orders_id", "qty",
    )  # fmt: skip
    assert joined("SELECT orders.* FROM t JOIN orders USING (x)").output == ("id", "x", "qty")
    # a third table's x, joined by ON, is its own column (a CI run's shrinking found it lost)
    assert joined("SELECT * FROM t JOIN orders USING (x) JOIN t AS u ON u.id = t.id").output == (
        "t_id", "t_x", "t_g", "t_v", "t_f", "orders_id", "qty",
        "u_id", "u_x", "u_g", "u_v", "u_f",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("SELECT * FROM t JOIN orders USING (qty)", "USING (qty): no table before orders"),
        ("SELECT * FROM t JOIN orders USING (g)", "table orders has no column 'g'"),
        ("SELECT * FROM t NATURAL LEFT JOIN orders", "LEFT OUTER JOIN"),
        # the third table's x is not merged: a bare x would name two columns
        (
            "SELECT x FROM t JOIN orders USING (x) JOIN t AS u ON u.id = t.id",
            "column x is ambiguous",
        ),
        (
            "SELECT COUNT(*) FROM t JOIN orders o ON o.id = t.id JOIN t AS u USING (x)",
            "USING (x) is ambiguous: t.x, o.x",
        ),
    ],
)
def test_a_using_join_that_names_no_single_column_is_refused_naming_it(
    select: str, message: str
) -> None:
    with pytest.raises(Exception, match=re.escape(message)):
        joined(select)
