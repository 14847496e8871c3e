"""The view language's scalar breadth (issue #41): CASE, IN and NOT IN lists (with NULL),
BETWEEN, COALESCE, LIKE with a constant pattern, OR, IS [NOT] NULL, and the scalar functions
ABS, EXTRACT(YEAR|MONTH|DAY FROM d), SUBSTRING and GREATEST/LEAST -- compiled by the view
compiler and evaluated by the one evaluator (sync and async views, the M3 interpreter and the
Cumulus runtime all use it) -- against duckdb on every row of a grid, NULLs included: three-valued
logic, a WHERE keeps a row only when its condition is TRUE.

Whole views in every mode are checked against duckdb by the differential tests, whose
generator draws these constructs (``test_views_differential``, ``test_m3_differential``,
``test_cumulus_views``).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import random
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest

from aggcli.cli import main
from aggview import errors
from aggview.keycodec import encode_key
from aggview.merge import combine
from aggview.schema import Column, ColumnType, TableSchema, row_to_storage, to_storage
from coordinator.adhoc import load_rows
from cumulus.aggstate import ViewState
from cumulus.compiler import compile_sql
from cumulus.delta import Changes, join_order, view_delta
from cumulus.expressions import compile_expr, compile_filters
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.parser import parse_program
from cumulus.m3.printer import print_program

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

DATES = [None, datetime.date(2024, 2, 29), datetime.date(1999, 12, 31), datetime.date(2024, 1, 1)]
GRID = [  # every combination: NULL in each column, LIKE's corner cases, zero and signs; and
    # each date beside every other value's NULL or not
    {"id": i, "x": x, "g": g, "v": v, "f": f, "d": DATES[i % len(DATES)]}
    for i, (x, g, v, f) in enumerate(
        itertools.product(
            [None, -1, 1, 2, 3],
            [None, "a", "ab", "b", "ba", "a.b*", "", "c_a"],
            [None, Decimal("-1.50"), Decimal("0.00"), Decimal("2.25")],
            [None, 0.0, 3.0],
        )
    )
]
GRID_SCHEMA = TableSchema("t", "t1", (*SCHEMA.columns, Column("d", ColumnType("DATE"))), ("id",))

FUNCTION_VALUES = [
    "ABS(x)",
    "ABS(v)",  # DECIMAL(8,2) keeps its scale
    "ABS(f - 1.5e0)",
    "ABS(-v * 2)",
    "EXTRACT(YEAR FROM d)",
    "EXTRACT(month FROM d)",
    "EXTRACT(DAY FROM d)",
    "YEAR(d)",  # sqlglot's Year node: EXTRACT(YEAR FROM d)
    "DAY(d) + MONTH(d)",
    "SUBSTRING(g FROM 1 FOR 2)",
    "SUBSTRING(g, 2)",  # to the end; '' past it
    "SUBSTRING(g, 2, 0)",  # ''
    "SUBSTRING(g, 3, 5)",  # past the end of every string
    "SUBSTRING(g FOR 1)",  # from 1
    "GREATEST(x, v)",  # INT with DECIMAL(8,2): DECIMAL(38,2), 2 as 2.00
    "LEAST(x, v, NULL)",  # NULL skipped
    "GREATEST(x, f)",  # FLOAT
    "LEAST(x, -1)",
    "GREATEST(g, 'b')",
    "LEAST(d, DATE '2024-01-01')",
    "GREATEST(NULL, x)",  # NULL only where x is
    "GREATEST(SUBSTRING(g, 1, 1), COALESCE(g, 'zz'))",
]

FUNCTION_CONDITIONS = [
    "ABS(x) = 1",
    "EXTRACT(YEAR FROM d) = 2024",
    "MONTH(d) IN (1, 12)",
    "SUBSTRING(g, 1, 1) = 'a'",
    "SUBSTRING(g, 2) LIKE 'b%'",
    "GREATEST(x, 2) > 2",
    "LEAST(x, v) < 0",
    "LEAST(d, DATE '2000-01-01') < DATE '2000-01-01'",
]


@pytest.fixture(scope="module")
def grid() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id INT, x INT, g TEXT, v DECIMAL(8,2), f DOUBLE, d DATE)")
    load_rows(con, "t", [[r[c] for c in ("id", "x", "g", "v", "f", "d")] for r in GRID])
    return con


def _lookup(row: dict[str, Any]) -> Any:
    return lambda _alias, column: row[column]


@pytest.mark.parametrize("condition", CONDITIONS + FUNCTION_CONDITIONS)
def test_conditions_keep_the_rows_duckdb_keeps(
    grid: duckdb.DuckDBPyConnection, condition: str
) -> None:
    plan = compile_sql(
        f"CREATE MATERIALIZED VIEW v AS SELECT COUNT(*) FROM t WHERE {condition}",
        lambda name: GRID_SCHEMA,
    )
    keep = compile_filters(plan.filters)
    kept = {row["id"] for row in GRID if keep(_lookup(row))}
    want = {i for (i,) in grid.execute(f"SELECT id FROM t WHERE {condition}").fetchall()}
    assert kept == want, (condition, plan.filters, sorted(kept ^ want)[:5])
    assert 0 < len(want) < len(GRID) or "NOT IN (1, NULL)" in condition  # a real test


@pytest.mark.parametrize("value", VALUES + FUNCTION_VALUES)
def test_values_equal_duckdbs(grid: duckdb.DuckDBPyConnection, value: str) -> None:
    plan = compile_sql(
        f"CREATE MATERIALIZED VIEW v AS SELECT MAX({value}) FROM t", lambda name: GRID_SCHEMA
    )
    (aggregate,) = plan.aggregates
    evaluate = compile_expr(aggregate.arg)
    want = dict(grid.execute(f"SELECT id, {value} FROM t").fetchall())
    python_type = {"INT": int, "FLOAT": float, "TEXT": str, "DATE": datetime.date}.get(
        aggregate.arg_type or "", Decimal
    )
    assert any(w is not None for w in want.values())
    for row in GRID:
        got = evaluate(_lookup(row))
        assert got == want[row["id"]], (value, row, got, want[row["id"]])
        # the value has its type's Python type, whatever branch gave it
        assert got is None or type(got) is python_type, (aggregate.arg_type, got)
        if value in FUNCTION_VALUES and type(got) is Decimal:  # GREATEST(x, v) of 2 is 2.00
            assert str(got) == str(want[row["id"]]), (value, row, got)


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


def test_dbtoasters_listmax_and_listmin_are_greatest_and_least_of_two() -> None:
    """DBToaster's queries write ``LISTMAX(a, b)``: the same plan (and so the same M3 program
    and maintenance in every mode) as ``GREATEST(a, b)``; other arities stay refused."""

    def compiled(select: str) -> tuple[Any, str]:
        plan = compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}", lambda name: SCHEMA)
        data = plan.to_json()
        data.pop("sql")  # the text as written
        return data, print_program(compile_program([plan], lambda name: SCHEMA))

    for listed, standard in (("LISTMAX(x, 1)", "GREATEST(x, 1)"), ("LISTMIN(v, x)", "LEAST(v, x)")):
        ours = compiled(f"SELECT g, SUM({listed}) AS s FROM t WHERE {listed} > 0 GROUP BY g")
        assert ours == compiled(
            f"SELECT g, SUM({standard}) AS s FROM t WHERE {standard} > 0 GROUP BY g"
        )
    with pytest.raises(errors.InvalidArgument, match="unsupported function LISTMAX"):
        compile_sql(
            "CREATE MATERIALIZED VIEW v AS SELECT g, SUM(LISTMAX(x, 1, 2)) FROM t GROUP BY g",
            lambda name: SCHEMA,
        )


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
        ("SELECT * FROM t NATURAL LEFT JOIN orders", "NATURAL LEFT JOIN"),
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


# === theta joins and cross products ==============================================================

THETA_VIEWS = [
    # a band join on time, the example
    "SELECT a.g, COUNT(*) AS n FROM a JOIN b ON b.k BETWEEN a.k - 2 AND a.k + 2 GROUP BY a.g",
    "SELECT a.g, SUM(b.v) AS s, MIN(b.x) AS m FROM a CROSS JOIN b GROUP BY a.g",
    "SELECT b.g, COUNT(*) AS n, SUM(a.v) AS s FROM a, b WHERE a.x <> b.x GROUP BY b.g",
    "SELECT a.g, COUNT(*) AS n FROM a JOIN b ON a.k < b.k AND b.x IS NOT NULL GROUP BY a.g",
    # a self cross product, and one table linked by equality beside one only by a theta
    "SELECT l.g, COUNT(*) AS n FROM a l JOIN a r ON l.v <= r.v GROUP BY l.g",
    "SELECT a.g, COUNT(*) AS n, SUM(c.v) AS s FROM a JOIN b ON a.k = b.id "
    "JOIN a c ON c.x <> b.x GROUP BY a.g",
    "SELECT a.k, b.g FROM a JOIN b ON 1 = 1 WHERE a.k > b.k",  # a bag
]


def theta_tables() -> dict[str, TableSchema]:
    """Two tables with SCHEMA's columns and an INT ``k`` after the key."""
    columns = (SCHEMA.columns[0], Column("k", ColumnType("INT")), *SCHEMA.columns[1:])
    return {name: TableSchema(name, f"t{n}", columns, ("id",)) for n, name in enumerate("ab", 1)}


def test_theta_conditions_and_cross_products_are_filters_joined_by_scans() -> None:
    tables = theta_tables()

    def plan(select: str) -> Any:
        return compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}", tables.__getitem__)

    band = plan(THETA_VIEWS[0])
    assert band.edges == ()
    assert band.filters == (
        {
            "between": {"col": ["b", "k"]},
            "low": {"op": "-", "args": [{"col": ["a", "k"]}, {"lit": 2, "type": "INT"}]},
            "high": {"op": "+", "args": [{"col": ["a", "k"]}, {"lit": 2, "type": "INT"}]},
        },
    )
    for cross in ("FROM a CROSS JOIN b", "FROM a, b", "FROM a JOIN b ON 1 = 1"):
        assert plan(f"SELECT COUNT(*) {cross}").edges == ()
    with pytest.raises(Exception, match="CROSS JOIN takes no ON or USING"):
        plan("SELECT COUNT(*) FROM a CROSS JOIN b ON a.k = b.k")
    mixed = plan(THETA_VIEWS[5])
    assert [(str(e.left), str(e.right)) for e in mixed.edges] == [("a.k", "b.id")]
    # equalities first (index lookups), then the scan the theta condition filters
    assert join_order(mixed, 0) == [("b", [("id", "a", "k")]), ("c", [])]
    assert join_order(mixed, 2) == [("b", []), ("a", [("k", "b", "id")])]
    # with no condition linking them, a scan binds the tables in FROM order
    three = plan("SELECT COUNT(*) FROM a, b, a c WHERE c.x < b.x")
    assert join_order(three, 0) == [("b", []), ("c", [])]
    assert join_order(three, 2) == [("b", []), ("a", [])]


class _Memory:
    """Base tables in storage form, read by the refresh operator as the LTMs would serve it:
    rows by a column's values, or every row (a scan step)."""

    def __init__(self, tables: dict[str, TableSchema]) -> None:
        self.schemas = tables
        self.rows: dict[str, dict[bytes, dict[str, Any]]] = {name: {} for name in tables}
        self.scans = 0

    async def rows_where(
        self, table: str, column: str | None, values: list[Any]
    ) -> dict[Any, list[tuple[bytes, dict[str, Any]]]]:
        rows = list(self.rows[table].items())
        if column is None:
            self.scans += 1
            return {None: rows}
        return {v: [(k, r) for k, r in rows if r.get(column) == v] for v in values}


def _theta_row(rng: random.Random, row_id: int) -> dict[str, Any]:
    return {
        "id": row_id,
        "k": rng.randrange(6),
        "x": rng.choice([None, 1, 2, 3]),
        "g": rng.choice(["a", "b", None]),
        "v": Decimal(rng.randrange(-8, 9)) / 4,
        "f": None,
    }


def _theta_batch(
    rng: random.Random, live: dict[str, dict[int, Any]], ids: Iterator[int]
) -> dict[tuple[str, int], tuple[Any, Any]]:
    """One to three changes of distinct rows: inserts, deletes, updates, either table first."""
    batch: dict[tuple[str, int], tuple[Any, Any]] = {}
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(sorted(live))
        free = sorted(set(live[name]) - {i for n, i in batch if n == name})
        if free and rng.random() < 0.5:
            row_id = rng.choice(free)
            new = None if rng.random() < 0.4 else _theta_row(rng, row_id)
            batch[(name, row_id)] = (live[name][row_id], new)
        else:
            row_id = next(ids)
            batch[(name, row_id)] = (None, _theta_row(rng, row_id))
    return batch


def stored_changes(
    tables: dict[str, TableSchema], batch: dict[tuple[str, int], tuple[Any, Any]]
) -> Changes:
    """A batch of (table, id) -> (old, new) rows as the refresh operator takes it (a tuple
    of values as the id: a composite key)."""
    changes: Changes = {}
    for (name, row_id), (old, new) in batch.items():
        schema = tables[name]
        key = encode_key(schema.key_types, list(row_id) if type(row_id) is tuple else [row_id])
        stored = [row_to_storage(schema, r) if r else None for r in (old, new)]
        changes.setdefault(name, {})[key] = (stored[0], stored[1])
    return changes


def mirror(
    con: duckdb.DuckDBPyConnection,
    live: dict[str, dict[Any, Any]],
    name: str,
    row_id: Any,
    new: dict[str, Any] | None,
) -> None:
    """One row's change (``new`` None: deleted) in duckdb's copy of table ``name`` (keyed by
    its ``id`` column) and in ``live``, the rows a test's next batch is drawn from."""
    con.execute(f"DELETE FROM {name} WHERE id = ?", [row_id])
    if new is None:
        live[name].pop(row_id)
    else:
        live[name][row_id] = new
        marks = ", ".join("?" * len(new))
        con.execute(f"INSERT INTO {name} VALUES ({marks})", list(new.values()))


@pytest.mark.parametrize("select", THETA_VIEWS)
def test_theta_joins_maintained_by_the_refresh_operator_and_m3_equal_duckdb(select: str) -> None:
    """After every batch of changes the refresh operator's states (``view_delta``: its scan
    steps read the snapshot before the batch) and the M3 interpreter's view equal duckdb's."""
    tables = theta_tables()
    plan = plan_of(select, "q", tables.__getitem__)
    state, memory = ViewState(plan, tables.__getitem__), _Memory(tables)
    interp = Interpreter(compile_program([plan], tables.__getitem__))
    con = duckdb.connect()
    for name in tables:
        con.execute(f"CREATE TABLE {name} (id INT, k INT, x INT, g TEXT, v DECIMAL(8,2), f DOUBLE)")
    rng, ids = random.Random(select), itertools.count()
    live: dict[str, dict[int, Any]] = {name: {} for name in tables}
    states: dict[bytes, dict[str, Any]] = {}
    for _ in range(40):
        batch = _theta_batch(rng, live, ids)
        changes = stored_changes(tables, batch)
        for key, delta in asyncio.run(view_delta(state, changes, memory.rows_where)).items():
            states[key] = combine(states.get(key, {}), delta)
        for (name, row_id), (old, new) in batch.items():
            mirror(con, live, name, row_id, new)
            if name in interp.sources:  # a self-join over ``a`` reads no ``b``
                if old is not None:
                    interp.delete(name, old)
                if new is not None:
                    interp.insert(name, new)
        memory.rows = {
            name: {
                encode_key(tables[name].key_types, [i]): row_to_storage(tables[name], r)
                for i, r in rows.items()
            }
            for name, rows in live.items()
        }
        want = sorted(map(repr, con.execute(select).fetchall()))
        kept = [(state.finalize(k, s), s["_count"]) for k, s in states.items()]
        bag = plan.shape == "bag"
        got = [tuple(r.values()) for r, n in kept if r is not None for _ in range(n if bag else 1)]
        assert sorted(map(repr, got)) == want
        assert sorted(repr(tuple(r.values())) for r in interp.view("q")) == want
    assert memory.scans > 0


# === scalar functions ===========================================================================


def test_duckdbs_greatest_and_least_skip_nulls_as_postgresql_does() -> None:
    """The reference needs no rewrite: duckdb, like PostgreSQL (and Spark), gives NULL only
    when every argument is NULL."""
    con = duckdb.connect()
    assert con.execute("SELECT greatest(1, NULL), least(NULL, 2), greatest(NULL::INT, NULL)")
    assert con.fetchall() == [(1, 2, None)]


def test_functions_group_filter_and_finish_over_aggregates_in_the_m3_read_out(
    grid: duckdb.DuckDBPyConnection,
) -> None:
    """A function as a group key, in WHERE, inside an aggregate and over aggregates (derived
    and HAVING): the refresh operator's states and the M3 interpreter read out alike."""
    schemas = {"t": GRID_SCHEMA}
    select = (
        "SELECT EXTRACT(YEAR FROM d) AS y, SUM(ABS(v)) AS s, GREATEST(MIN(x), 0) AS m, "
        "COUNT(SUBSTRING(g, 2)) AS n FROM t WHERE LEAST(x, 3) >= 0 OR x IS NULL "
        "GROUP BY EXTRACT(YEAR FROM d) HAVING ABS(SUM(v)) > 0"
    )
    plan = plan_of(select, "q", schemas.__getitem__)
    interp = Interpreter(compile_program([plan], schemas.__getitem__))
    state = ViewState(plan, schemas.__getitem__)
    states: dict[bytes, dict[str, Any]] = {}
    keep = compile_filters(plan.filters)
    for row in GRID:
        interp.insert("t", row)
        binding = {"t": {c: to_storage(GRID_SCHEMA.column(c), row[c], table="t") for c in row}}
        lookup = state.lookup(binding)
        if keep(_lookup(row)):
            key = state.group_key(lookup)
            states[key] = combine(states.get(key, {}), state.tuple_delta(lookup, 1))
    finished = [state.finalize(k, s) for k, s in states.items()]
    want = sorted(map(repr, grid.execute(select).fetchall()))
    assert len(want) == 3  # 1999, 2024 and NULL
    assert sorted(repr(tuple(r.values())) for r in finished if r is not None) == want
    assert sorted(repr(tuple(r.values())) for r in interp.view("q")) == want


def test_aggview_m3_prints_functions_that_parse_back(tmp_path: Path, capsys: Any) -> None:
    schema = tmp_path / "schema.sql"
    schema.write_text(
        "CREATE TABLE t (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2) NOT NULL, d DATE);\n"
    )
    main(
        [
            "m3",
            "--schema",
            str(schema),
            "SELECT SUBSTRING(g FROM 1 FOR 2) AS p, SUM(GREATEST(v, 0)) AS s FROM t "
            "WHERE EXTRACT(MONTH FROM d) = 2 AND ABS(v) < 5 GROUP BY 1",
        ]
    )
    text = capsys.readouterr().out
    assert "(p ^= {SUBSTRING(g, 1, 2)})" in text
    assert "{CAST(GREATEST(v, 0) AS decimal(38,2))}" in text
    assert "{EXTRACT(MONTH FROM d) = 2}" in text and "{ABS(v) < 5}" in text
    assert print_program(parse_program(text)) == text
