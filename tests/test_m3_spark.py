"""Bulk initialization with Spark SQL: every map computed from its definition over tables that
already hold rows equals the map the stream built, and a program started from it goes on like
one that saw every row."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggspark.compute import compute_states
from aggspark.m3_init import definition_sql, initial_maps, initial_relations
from aggview.keycodec import encode_key
from aggview.schema import row_to_storage
from cumulus.aggstate import ViewState
from cumulus.delta import from_scratch
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.program import MapExtreme, MapLift, Program
from tests.profiles import examples
from tests.test_m3_differential import COLUMNS, TRICKY, programs_for, schemas_for
from tests.test_views_differential import (
    THETA_JOINS,
    random_row,
    view_select,
    view_specs,
)

NAMES = ["t0", "t1", "t2"]
SPARK_SCHEMA = "id BIGINT, k BIGINT, g STRING, v DECIMAL(8,2), x BIGINT, f DOUBLE"


def _close(got: dict[Any, Any], want: dict[Any, Any]) -> bool:
    """Equal, FLOAT values within rounding (Spark adds them in another order)."""
    if got.keys() != want.keys():
        return False
    return all(
        math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-9)
        if isinstance(want[k], float)
        else got[k] == want[k]
        for k in want
    )


def _same_maps(a: Interpreter, b: Interpreter) -> None:
    for name in a.maps:
        assert _close(a.maps[name].data, b.maps[name].data), name


def test_spark_initialized_maps_equal_streamed_maps_and_go_on_alike(spark: Any) -> None:
    rng = random.Random(3)
    snapshot = {n: [random_row(rng, j) for j in range(12)] for n in NAMES}
    tables = {}
    for name in NAMES:
        values = [tuple(r[c] for c in COLUMNS) for r in snapshot[name]]
        frame = spark.createDataFrame(values, SPARK_SCHEMA)
        frame.createOrReplaceTempView(f"m3_{name}")
        tables[name] = f"m3_{name}"
    cases: list[Program] = []
    for select in (TRICKY[1], TRICKY[3], TRICKY[9]):
        cases.append(programs_for(select, NAMES)[None])
    cases.append(programs_for(TRICKY[9], NAMES)[1])  # reads relations: they are loaded too
    for program in cases:
        rows = copy.deepcopy(snapshot)
        loaded = Interpreter(program)
        loaded.load(initial_maps(spark, program, tables), initial_relations(spark, program, tables))
        streamed = Interpreter(program)
        for name in NAMES:
            if name in streamed.sources:
                for row in rows[name]:
                    streamed.insert(name, row)
        _same_maps(loaded, streamed)
        stores = [*loaded.maps.values(), *loaded.relations.values()]
        assert any(store.data for store in stores)  # the snapshot was not empty
        steps = random.Random(5)
        for _ in range(20):
            name = steps.choice([n for n in NAMES if n in streamed.sources])
            old = steps.choice(rows[name])
            new = {**old, "k": steps.randrange(5), "x": steps.choice([None, 1, 2])}
            for interp in (loaded, streamed):
                interp.update(name, old, new)
            rows[name][rows[name].index(old)] = new
            assert sorted(map(repr, loaded.view("q"))) == sorted(map(repr, streamed.view("q")))
        _same_maps(loaded, streamed)


def test_definition_sql_joins_on_repeated_variables_and_lifts() -> None:
    program = programs_for(TRICKY[1], NAMES)[None]  # MAX(a1.v * 2 + a0.k): a lifted value
    counts = program.map("q_agg1_cnt")
    assert counts.definition is not None
    sql = definition_sql(counts.definition, counts.value_type, program, {n: n for n in NAMES})
    assert "(`a0`.`k` <=> `a1`.`id`)" in sql  # the join: equal columns, as the interpreter
    assert "((`a1`.`v` * CAST(2 AS BIGINT)) + `a0`.`k`) AS k1" in sql  # the lifted key
    assert sql.endswith("GROUP BY 1, 2")


def _spark_and_scratch(
    spark: Any, select: str, prefix: str, state: ViewState | None = None
) -> tuple[ViewState, dict[str, str], dict[bytes, Any], dict[str, list[dict[str, Any]]]]:
    """Ten random rows per table (seeded by ``select``) as Spark temp views ``<prefix>_<t>``,
    the view's states the refresh operator computes from scratch over them, and the rows."""
    rng = random.Random(select)
    snapshot = {n: [random_row(rng, j) for j in range(10)] for n in NAMES}
    tables = {}
    for name in NAMES:
        values = [tuple(r[c] for c in COLUMNS) for r in snapshot[name]]
        spark.createDataFrame(values, SPARK_SCHEMA).createOrReplaceTempView(f"{prefix}_{name}")
        tables[name] = f"{prefix}_{name}"
    schemas = schemas_for(NAMES)
    if state is None:
        state = ViewState(plan_of(select, "q", schemas.__getitem__), schemas.__getitem__)
    stored = {
        name: {
            encode_key(schemas[name].key_types, [r["id"]]): row_to_storage(schemas[name], r)
            for r in rows
        }
        for name, rows in snapshot.items()
    }
    return state, tables, asyncio.run(from_scratch(state, stored)), snapshot


THETA = [  # issue #41: a band join, a cross product, a theta join beside an equality
    "SELECT a0.g AS g0, COUNT(*) AS agg0 FROM t0 a0 JOIN t1 a1 "
    "ON a1.k BETWEEN a0.k - 1 AND a0.x + 1 GROUP BY a0.g",
    "SELECT a1.g AS g0, SUM(a0.v) AS agg0, MAX(a1.x) AS agg1 FROM t0 a0 CROSS JOIN t1 a1 "
    "GROUP BY a1.g",
    "SELECT a0.k AS g0, COUNT(*) AS agg0 FROM t0 a0 JOIN t1 a1 ON a0.k = a1.id "
    "JOIN t2 a2 ON a2.x <> a1.x GROUP BY a0.k",
    # an equi-join's multiset query: GROUP BY v was ambiguous (both tables have a column v)
    "SELECT a0.g AS g0, MIN(a1.x) AS agg0 FROM t0 a0 JOIN t1 a1 ON a0.k = a1.k GROUP BY a0.g",
]


UNIONS = [  # issue #41: each branch computed and added, in Spark as in maintenance and M3
    "SELECT g, SUM(v) AS s, COUNT(*) AS n, MIN(x) AS lo FROM (SELECT a.g, a.v, a.x FROM t0 a "
    "UNION ALL SELECT b.g, b.v, b.k AS x FROM t1 b WHERE b.x > 0) u GROUP BY g",
    "SELECT g, SUM(v) AS s FROM t0 GROUP BY g UNION ALL SELECT g, SUM(v) AS s FROM t1 GROUP BY g",
    "SELECT (SELECT SUM(v) FROM t0) AS s, (SELECT COUNT(*) FROM t1 WHERE x > 1) AS n",
]


@pytest.mark.parametrize("select", UNIONS)
def test_spark_computes_unions_as_the_refresh_operator_and_m3_do(spark: Any, select: str) -> None:
    test_spark_computes_theta_joins_as_the_refresh_operator_and_m3_do(spark, select)


@pytest.mark.parametrize("select", THETA)
def test_spark_computes_theta_joins_as_the_refresh_operator_and_m3_do(
    spark: Any, select: str
) -> None:
    """The same non-equi join (or cross product) in Spark SQL: the view states Spark computes
    for sync and async views equal the refresh operator's from scratch (its scan steps), and
    every M3 map Spark initializes equals the map the stream built."""
    state, tables, want, snapshot = _spark_and_scratch(spark, select, "theta")
    assert want and compute_states(spark, state, tables) == want
    program = programs_for(select, NAMES)[None]
    loaded, streamed = Interpreter(program), Interpreter(program)
    loaded.load(initial_maps(spark, program, tables), {})
    for name in NAMES:
        if name in streamed.sources:
            for row in snapshot[name]:
                streamed.insert(name, row)
    _same_maps(loaded, streamed)


FUNCTIONS = [  # scalar functions rendered to Spark SQL: GREATEST/LEAST skipping NULLs,
    # SUBSTRING's constant bounds, EXTRACT of a DATE expression
    TRICKY[-1],
    "SELECT SUBSTRING(COALESCE(a0.g, 'none') FROM 2 FOR 2) AS g0, SUM(GREATEST(a0.v, a1.x)) "
    "AS agg0, MAX(LEAST(a0.f, a1.k)) AS agg1, COUNT(ABS(a1.x)) AS agg2, MIN(EXTRACT(MONTH FROM "
    "CASE WHEN a1.x > 1 THEN DATE '2024-03-01' END)) AS agg3 FROM t0 a0 JOIN t1 a1 "
    "ON a1.k = a0.x GROUP BY 1",
    # a branch of DECIMAL(38, 1) beside one of DECIMAL(8, 2): Spark's common type of the two
    # rounded a0.v to one digit
    "SELECT a0.g AS g0, SUM(CASE WHEN a0.f IS NULL THEN 1.5 ELSE a0.v END) AS agg0, "
    "SUM(COALESCE(CASE WHEN a0.x > 0 THEN a0.v END, 0.5)) AS agg1 FROM t0 a0 GROUP BY a0.g",
]


@pytest.mark.parametrize("select", FUNCTIONS)
def test_spark_computes_functions_as_the_refresh_operator_and_m3_do(
    spark: Any, select: str
) -> None:
    test_spark_computes_theta_joins_as_the_refresh_operator_and_m3_do(spark, select)


def test_spark_computes_functions_of_a_left_joins_null_row(spark: Any) -> None:
    """A function of the NULL row a LEFT JOIN adds where nothing matches: NULL, as the
    refresh operator computes it (GREATEST and LEAST skip it)."""
    select = FUNCTIONS[1].replace(" JOIN t1 a1", " LEFT JOIN t1 a1")
    state, tables, want, _ = _spark_and_scratch(spark, select, "fleft")
    assert state.plan.outer == ("a1",)
    assert want and compute_states(spark, state, tables) == want


LEFT = [  # issue #41: LEFT JOINs, NULL rows counted by COUNT(*), skipped by COUNT(col)
    "SELECT a0.g AS g0, COUNT(*) AS agg0, COUNT(a1.x) AS agg1, SUM(a1.v) AS agg2, "
    "MIN(a1.x) AS agg3 FROM t0 a0 LEFT JOIN t1 a1 ON a1.k = a0.x GROUP BY a0.g",
    "SELECT a1.g AS g0, COUNT(*) AS agg0, SUM(a0.v) AS agg1 FROM t0 a0 JOIN t2 a2 "
    "ON a2.k = a0.k LEFT JOIN t1 a1 ON a1.id = a2.x WHERE a0.v > -3 GROUP BY a1.g",
]


@pytest.mark.parametrize("select", LEFT)
def test_spark_computes_left_joins_as_the_refresh_operator_does(spark: Any, select: str) -> None:
    """Spark SQL's LEFT JOIN gives the states the refresh operator computes from scratch
    (its outer step: a NULL row where nothing matches)."""
    state, tables, want, _ = _spark_and_scratch(spark, select, "left")
    assert state.plan.outer == ("a1",)
    inner = ViewState(dataclasses.replace(state.plan, outer=()), schemas_for(NAMES).__getitem__)
    _, _, joined, _ = _spark_and_scratch(spark, select, "left", inner)
    assert joined != want  # rows without a match count
    assert want and compute_states(spark, state, tables) == want


# issue: Spark's initial maps of programs whose definitions read maps (a LEFT JOIN's unmatched
# rows read Rows_B[k], a subquery's lifts its nested aggregate), each checked against the
# interpreter fed the same rows one insert at a time
OUTER = [
    *LEFT,
    "SELECT a1.g AS g0, COUNT(*) AS agg0, SUM(a0.v) AS agg1, COUNT(a0.id) AS agg2, "
    "AVG(a0.f) AS agg3 FROM t0 a0 RIGHT JOIN t1 a1 ON a0.k = a1.id GROUP BY a1.g",
    "SELECT a0.g AS g0, a1.x AS g1, COUNT(*) AS agg0, MIN(a1.v) AS agg1, AVG(a0.v) AS agg2, "
    "COUNT(DISTINCT a1.g) AS agg3 FROM t0 a0 FULL JOIN t1 a1 ON a0.k = a1.k GROUP BY a0.g, a1.x",
    "SELECT DISTINCT a0.g, a1.x FROM t0 a0 LEFT JOIN t1 a1 ON a0.x = a1.k",
    "SELECT a0.id, a1.v, a2.g FROM t0 a0 LEFT JOIN t1 a1 ON a0.k = a1.id "
    "LEFT JOIN t2 a2 ON a0.x = a2.k WHERE a2.x IS NULL OR a0.v > 0",
    "SELECT a0.g AS g0, SUM(a1.v) AS s FROM t0 a0 LEFT JOIN t1 a1 ON a0.k = a1.k GROUP BY a0.g "
    "UNION ALL SELECT b.g AS g0, SUM(b.v) AS s FROM t2 b GROUP BY b.g",
]
NESTED = [  # a correlated DECIMAL AVG (finished, rounded half-even), MIN, NOT EXISTS, IN over
    # HAVING, an uncorrelated FLOAT AVG and MAX
    "SELECT a0.g AS g0, COUNT(*) AS agg0, SUM(a0.v) AS agg1 FROM t0 a0 "
    "WHERE a0.v * 3 < (SELECT AVG(b.v) FROM t1 b WHERE b.k = a0.k) GROUP BY a0.g",
    "SELECT COUNT(*) AS agg0 FROM t0 a0 WHERE a0.x > (SELECT MIN(b.x) FROM t1 b WHERE b.k = a0.k)",
    "SELECT a0.k AS g0, COUNT(*) AS agg0 FROM t0 a0 "
    "WHERE NOT EXISTS (SELECT 1 FROM t1 b WHERE b.k = a0.x) GROUP BY a0.k",
    "SELECT COUNT(*) AS agg0, SUM(a0.f) AS agg1 FROM t0 a0 "
    "WHERE a0.k IN (SELECT b.x FROM t1 b GROUP BY b.x HAVING SUM(b.v) > 0)",
    "SELECT a0.g AS g0, SUM(a0.v) AS agg0 FROM t0 a0 WHERE a0.f > (SELECT AVG(b.f) FROM t1 b) "
    "AND a0.x <= (SELECT MAX(c.x) FROM t2 c) GROUP BY a0.g",
    # MIN/MAX over a grouped subquery, read at its rows' keys (v: NOT NULL): the view itself,
    # and compared with groups when read
    "SELECT MAX(m.s) AS agg0 FROM (SELECT b.v, SUM(b.x) AS s FROM t1 b GROUP BY b.v) m",
    "SELECT a0.k AS g0, COUNT(*) AS agg0 FROM t0 a0 WHERE a0.k <= (SELECT MIN(m.n) FROM "
    "(SELECT b.v, COUNT(*) AS n FROM t1 b GROUP BY b.v) m) GROUP BY a0.k",
    # IN over a subquery with a correlated SUM (TPC-H Q20): a join grouped by a0's key
    "SELECT a0.k, a0.x FROM t0 a0 WHERE a0.x IN (SELECT b.k FROM t1 b "
    "WHERE b.v > (SELECT SUM(c.v) FROM t2 c WHERE c.k = b.x))",
]


def _tables(spark: Any, rows: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Each table's rows as the Spark temporary view ``m3init_<table>``."""
    tables = {}
    for name, table_rows in rows.items():
        values = [tuple(r[c] for c in COLUMNS) for r in table_rows]
        spark.createDataFrame(values, SPARK_SCHEMA).createOrReplaceTempView(f"m3init_{name}")
        tables[name] = f"m3init_{name}"
    return tables


def _random_rows(seed: int, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Up to 8 rows a table, ids from 0: NULLs in x, g and f, and children (k, x) whose
    parent id is not there."""
    rng = random.Random(seed)
    return {n: [random_row(rng, j) for j in range(rng.randrange(1, 9))] for n in names}


def check_initial_maps(spark: Any, select: str, seed: int, names: list[str] = NAMES) -> Program:
    """Spark's initial maps of ``select``'s cumulus program over random rows equal the
    interpreter's after inserting the rows one at a time."""
    schemas = schemas_for(names)
    program = compile_program([plan_of(select, "q", schemas.__getitem__)], schemas.__getitem__)
    rows = _random_rows(seed, names)
    streamed = Interpreter(program)
    for name in names:
        if name in streamed.sources:
            for row in rows[name]:
                streamed.insert(name, row)
    got = initial_maps(spark, program, _tables(spark, rows))
    assert got.keys() == streamed.maps.keys()
    for name, store in streamed.maps.items():
        assert _close(got[name], store.data), (name, got[name], store.data)
    return program


def _reads_maps(program: Program) -> bool:
    return any(
        isinstance(f, MapLift)
        for m in program.maps
        if m.definition is not None
        for f in m.definition.body
    )


@pytest.mark.parametrize("select", OUTER)
def test_spark_initializes_outer_join_programs_as_the_interpreter(spark: Any, select: str) -> None:
    """The unmatched rows' maps read Rows_B[k] through a lift (NULL keys, keys of no row)."""
    assert _reads_maps(check_initial_maps(spark, select, OUTER.index(select)))


@pytest.mark.parametrize("select", NESTED)
def test_spark_initializes_nested_aggregates_as_the_interpreter(spark: Any, select: str) -> None:
    """Map lifts, MIN/MAX read from count maps, domain maps: each map after those it reads."""
    program = check_initial_maps(spark, select, 7)
    assert _reads_maps(program)
    if "MIN(b." in select:  # over a table (over a nested value: its count map, lifted)
        bodies = [m.definition.body for m in program.maps if m.definition is not None]
        assert any(isinstance(f, MapExtreme) for body in bodies for f in body)


SUBQUERIES = [  # a nested aggregate in WHERE, over a table of the view's
    "a0.k IN (SELECT b.x FROM {t} b)",
    "NOT EXISTS (SELECT 1 FROM {t} b WHERE b.k = a0.x)",
    "a0.v >= (SELECT AVG(b.v) FROM {t} b WHERE b.k = a0.k)",
    "a0.x < (SELECT MAX(b.x) FROM {t} b)",
]


@st.composite
def spark_specs(draw: st.DrawFn) -> tuple[str, int, int]:
    """A random view of the M3 differential tests (``view_specs``), its first join mostly
    LEFT, RIGHT or FULL (an equality), else mostly a subquery in WHERE, sometimes a bag or
    DISTINCT of its group columns; the number of tables and a seed for the rows."""
    spec = draw(view_specs())
    names = [f"t{i}" for i in range(spec["tables"])]
    outer = draw(st.sampled_from([None, "LEFT", "RIGHT", "FULL"]))
    if outer == "FULL" and len(spec["joins"]) > 1:  # a FULL JOIN of two tables only
        outer = "LEFT"
    if outer:
        left, right, kind = spec["joins"][0]
        if kind in THETA_JOINS:
            spec["joins"][0] = (left, right, draw(st.sampled_from(["k=id", "k=k", "id=k"])))
        spec["using"] = False
    nested = None if outer else draw(st.sampled_from([None, *SUBQUERIES]))
    if nested is not None:  # (cumulus takes no subquery beside an outer join's NULL side)
        nested = nested.format(t=names[draw(st.integers(0, len(names) - 1))])
        spec["where"] = f"({spec['where']}) AND {nested}" if spec["where"] else nested
    select = view_select(spec, names)
    if outer:
        table = f" JOIN {names[spec['table_of'][1]]} a1 ON"
        select = select.replace(table, f" {outer}{table}", 1)
    shape = draw(st.sampled_from(["grouped", "grouped", "bag", "distinct"]))
    if shape != "grouped" and spec["group"]:
        start = f" FROM {names[spec['table_of'][0]]} a0"
        body = select[select.index(start) :].split(" GROUP BY ")[0]
        distinct = "DISTINCT " if shape == "distinct" else ""
        items = ", ".join(f"{c} AS g{i}" for i, c in enumerate(spec["group"]))
        select = f"SELECT {distinct}{items}{body}"
    return select, spec["tables"], spec["seed"]


@settings(
    max_examples=examples(3, 30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(drawn=spark_specs())
def test_spark_initializes_random_views_as_the_interpreter(
    spark: Any, drawn: tuple[str, int, int]
) -> None:
    select, tables, seed = drawn
    check_initial_maps(spark, select, seed, [f"t{i}" for i in range(tables)])
