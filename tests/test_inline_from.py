"""Common table expressions and simple subqueries in FROM (issue #41: pg_ivm's list in every
mode): CTEs are inlined, and a first FROM item that only filters and inner-joins rows is merged
into the query (``cumulus.passes.inline_from``), so Cumulus takes it and sync and async need no
hidden view; other subqueries stay hidden views. Each shape against duckdb's recomputation of
the SQL as written: maintained by the refresh operator after random batches (deletes, updates,
rows before the rows they join), by M3 programs after every update, and on a cluster in every
mode that takes it under concurrent transactions."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_m3_differential import DEPTHS, replay
from test_subqueries import TABLES, check_against_duckdb
from test_views_differential import every_mode_equals_recomputation

from agglauncher.cluster import LocalCluster
from aggview import errors
from cumulus.compiler import compile_sql_views
from cumulus.passes.inline_from import inline_ctes, merge_first_subquery

# Shapes over tables {0} and {1} (id, k, g, v, x, f): (SELECT, whether Cumulus takes it, its
# columns compared within rounding: AVG)
SHAPES: dict[str, tuple[str, bool, list[bool]]] = {
    "a CTE joined and grouped": (
        "WITH t AS (SELECT a.g, b.v FROM {0} a JOIN {1} b ON a.k = b.k WHERE b.x > 0) "
        "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY g",
        True,
        [False, False, False],
    ),
    "a CTE reading a CTE": (
        "WITH t AS (SELECT a.g, a.k, a.v FROM {0} a WHERE a.v > 0), u AS (SELECT t.g, b.x, "
        "t.v FROM t JOIN {1} b ON t.k = b.k) SELECT g, COUNT(*) AS n, MAX(x) AS hi, "
        "AVG(v) AS m FROM u GROUP BY g",
        True,
        [False, False, False, True],
    ),
    "a subquery in FROM joined with a table": (
        "SELECT s.g, c.x, COUNT(*) AS n FROM (SELECT a.g, a.k FROM {0} a WHERE a.x IS NOT NULL) "
        "s JOIN {1} c ON s.k = c.k GROUP BY s.g, c.x",
        True,
        [False, False, False],
    ),
    "a star in a CTE": (
        "WITH t AS (SELECT * FROM {0} WHERE k > 1) SELECT g, SUM(v) AS s, MIN(x) AS lo "
        "FROM t GROUP BY g",
        True,
        [False, False, False],
    ),
    "a bag of expressions": (
        "WITH t AS (SELECT a.g, b.v * 2 AS w FROM {0} a JOIN {1} b ON a.k = b.k) "
        "SELECT g, w FROM t WHERE w > 0",
        True,
        [False, False],
    ),
    "renamed columns of expressions": (
        "SELECT q.grp, SUM(q.amount) AS total, COUNT(*) AS n FROM (SELECT a.g AS grp, "
        "a.v + b.v AS amount FROM {0} a JOIN {1} b ON a.k = b.x) q GROUP BY q.grp",
        True,
        [False, False, False],
    ),
    "a CTE used twice (the second a hidden view)": (
        "WITH t AS (SELECT a.k, a.g FROM {0} a WHERE a.x > 0) SELECT t1.g, COUNT(*) AS n "
        "FROM t t1 JOIN t t2 ON t1.k = t2.k GROUP BY t1.g",
        False,
        [False, False],
    ),
    "a CTE that aggregates (a hidden view)": (
        "WITH t AS (SELECT g, SUM(v) AS s FROM {0} GROUP BY g) "
        "SELECT COUNT(*) AS n, MAX(s) AS top FROM t",
        False,
        [False, False],
    ),
    "a subquery in FROM without the rows NOT EXISTS finds": (
        "SELECT s.g, COUNT(*) AS n, SUM(s.v) AS t FROM (SELECT a.g, a.v FROM {0} a "
        "WHERE NOT EXISTS (SELECT * FROM {1} b WHERE b.k = a.k AND b.x > 0)) s GROUP BY s.g",
        True,
        [False, False, False],
    ),
    "a subquery in FROM above an average (TPC-H Q22's shape)": (
        "SELECT s.g, COUNT(*) AS n, SUM(s.v) AS t FROM (SELECT a.g, a.v FROM {0} a "
        "WHERE a.v > (SELECT AVG(b.v) FROM {1} b WHERE b.x > 0) AND a.x IS NOT NULL) s "
        "GROUP BY s.g",
        True,
        [False, False, False],
    ),
    "a subquery in FROM with IN, its columns by SQL's scopes": (  # k in IN's query is b's
        "SELECT s.g, SUM(s.v) AS t, COUNT(*) AS n FROM (SELECT g, v FROM {0} "
        "WHERE k IN (SELECT k FROM {1} WHERE x > 0)) s GROUP BY s.g",
        True,
        [False, False, False],
    ),
    "a CTE that is a union": (
        "WITH t AS (SELECT g, v FROM {0} UNION ALL SELECT g, v FROM {1} WHERE x > 0) "
        "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY g",
        True,
        [False, False, False],
    ),
}
IN_CUMULUS = {name: shape for name, shape in SHAPES.items() if shape[1]}
# merged with their WHERE's subqueries: M3 at unbounded depth only (a nested map is every level)
NESTED = {name for name in SHAPES if re.search(r"(EXISTS|IN|>) \(SELECT", SHAPES[name][0])}


def _compiled(select: str, mode: str = "sync") -> list[Any]:
    options = " WITH (refresh = 'cumulus')" if mode == "cumulus" else ""
    sql = f"CREATE MATERIALIZED VIEW q{options} AS {select.format('a', 'b')}"
    return compile_sql_views(sql, TABLES.__getitem__)


# === the rewrite =================================================================================


def test_ctes_are_inlined_as_subqueries_aliased_as_referenced() -> None:
    statement = sqlglot.parse_one(
        "WITH t AS (SELECT k FROM a), u AS (SELECT t.k FROM t) SELECT x.k FROM u x JOIN t ON 1 = 1"
    )
    inlined = inline_ctes(statement).sql()
    assert "WITH" not in inlined
    assert inlined == (
        "SELECT x.k FROM (SELECT t.k FROM (SELECT k FROM a) AS t) AS x "
        "JOIN (SELECT k FROM a) AS t ON 1 = 1"
    )


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("WITH RECURSIVE t AS (SELECT k FROM a) SELECT k FROM t", "WITH RECURSIVE"),
        ("WITH t(z) AS (SELECT k FROM a) SELECT z FROM t", "a column list on a common table"),
    ],
)
def test_ctes_it_cannot_inline_are_refused_by_name(select: str, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        _compiled(select)


def test_a_simple_first_subquery_is_merged_and_its_columns_replaced() -> None:
    select = sqlglot.parse_one(
        "SELECT s.g, SUM(s.w) AS t FROM (SELECT a.g, a.v * 2 AS w FROM a JOIN b ON a.k = b.k "
        "WHERE b.x > 0) s WHERE s.w > 1 GROUP BY s.g"
    )
    merged = merge_first_subquery(select, TABLES.__getitem__)  # type: ignore[arg-type]
    assert merged.find(sqlglot.exp.Subquery) is None
    assert merged.sql() == (
        'SELECT a.g AS "g", SUM(a.v * 2) AS t FROM a JOIN b ON a.k = b.k '
        "WHERE b.x > 0 AND a.v * 2 > 1 GROUP BY a.g"
    )


def test_a_subquery_in_its_where_keeps_its_scope_when_merged() -> None:
    """The derived table's unqualified columns become its table's; those of its WHERE's
    subquery stay the subquery's own (``k`` in IN's query is ``b.k``, ``v`` in NOT EXISTS's
    is ``c.v``: both tables have every column)."""
    select = sqlglot.parse_one(
        "SELECT s.g, COUNT(*) AS n FROM (SELECT g FROM a WHERE k IN (SELECT k FROM b "
        "WHERE b.x > 0) AND NOT EXISTS (SELECT 1 FROM b c WHERE c.k = v)) s GROUP BY s.g"
    )
    merged = merge_first_subquery(qualify(select), TABLES.__getitem__)  # type: ignore[arg-type]
    assert merged.sql() == (
        'SELECT "a".g AS "g", COUNT(*) AS n FROM a WHERE "a".k IN (SELECT k FROM b '
        'WHERE b.x > 0) AND NOT EXISTS(SELECT 1 FROM b AS c WHERE c.k = v) GROUP BY "a".g'
    )


def qualify(select: Any) -> Any:
    from cumulus.passes.inline_from import qualify_correlations

    return qualify_correlations(select, TABLES.__getitem__)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "select",
    [
        "SELECT s.g, COUNT(*) AS n FROM (SELECT g, SUM(v) AS v FROM a GROUP BY g) s GROUP BY s.g",
        "SELECT s.g FROM (SELECT DISTINCT g FROM a) s",
        "SELECT s.g FROM (SELECT a.g FROM a LEFT JOIN b ON a.k = b.k) s",
        "SELECT s.g FROM (SELECT g FROM a WHERE g > 0) s WHERE s.g IN (SELECT g FROM b)",
        "SELECT s.w FROM (SELECT a.g, (SELECT MAX(v) FROM b) AS w FROM a) s",  # not in WHERE
        "SELECT s.g FROM (SELECT a.g FROM a JOIN b ON a.k = b.k AND EXISTS (SELECT 1 FROM b)) s",
        "SELECT a.g FROM (SELECT a.g FROM a WHERE a.k IN (SELECT k FROM b)) a JOIN a b ON 1 = 1",
        "SELECT g FROM (SELECT a.g FROM a) s JOIN b ON s.g = b.g",  # g: s's or b's?
        "SELECT s.g FROM (SELECT a.g FROM a) s WHERE s.g IN (SELECT g FROM b)",
        "SELECT * FROM (SELECT a.g, a.k FROM a) s",
        "SELECT s.g FROM (SELECT a.g FROM a ORDER BY a.g LIMIT 3) s",
    ],
)
def test_other_subqueries_are_left_as_they_are(select: str) -> None:
    parsed = sqlglot.parse_one(select)
    assert merge_first_subquery(parsed, TABLES.__getitem__).sql() == parsed.sql()  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", SHAPES)
def test_cumulus_takes_the_merged_shapes_and_names_the_modes_for_the_others(shape: str) -> None:
    select, in_cumulus, _ = SHAPES[shape]
    if in_cumulus:
        *hidden, plan = _compiled(select, "cumulus")
        assert not hidden and plan.mode == "cumulus"
    else:
        with pytest.raises(errors.InvalidArgument, match="'sync' or 'async', not 'cumulus'"):
            _compiled(select, "cumulus")
    assert _compiled(select)[-1].sql == select.format("a", "b")  # as written


# === maintained: the refresh operator and M3 =====================================================


@pytest.mark.parametrize("shape", SHAPES)
def test_the_refresh_operator_equals_duckdb(shape: str) -> None:
    check_against_duckdb([("q", SHAPES[shape][0].format("a", "b"))], seed=len(shape), batches=30)


@settings(max_examples=examples(8, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(SHAPES)), seed=st.integers(0, 10**6))
def test_the_refresh_operator_equals_duckdb_for_random_batches(shape: str, seed: int) -> None:
    check_against_duckdb([("q", SHAPES[shape][0].format("a", "b"))], seed, batches=12)


def _spec(approx: list[bool]) -> dict[str, Any]:
    return {"group": [], "aggregates": ["AVG" if a else "exact" for a in approx]}


@settings(max_examples=examples(8, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(IN_CUMULUS)), seed=st.integers(0, 10**6))
def test_m3_programs_equal_duckdb_after_every_update(shape: str, seed: int) -> None:
    select, _, approx = IN_CUMULUS[shape]
    names = ["t0", "t1"]
    depths = (None,) if shape in NESTED else DEPTHS
    replay(select.format(*names), names, seed, steps=30, spec=_spec(approx), depths=depths)


# === on a cluster: every mode ====================================================================

_runs = itertools.count()
ON_CLUSTER = [
    "a CTE joined and grouped",
    "a subquery in FROM joined with a table",
    "a bag of expressions",
    "a subquery in FROM without the rows NOT EXISTS finds",
]


@pytest.mark.parametrize("shape", ON_CLUSTER)
def test_every_mode_equals_recomputation_on_a_cluster(cluster: LocalCluster, shape: str) -> None:
    select, _, approx = SHAPES[shape]
    sizes = every_mode_equals_recomputation(
        cluster,
        f"cte{next(_runs)}",
        lambda t: select.format(*t),
        {"tables": 2, "seed": 11, **_spec(approx)},
    )
    assert sizes[0], "the view is empty as created: the seed tests nothing"


def test_an_unqualified_outer_column_of_a_subquery_is_the_enclosing_tables() -> None:
    """SQL's scoping: a subquery's column none of its own tables has is an enclosing query's
    (``x``: only o has it); one its own table has stays its own (``v``); one that two
    enclosing tables have is left for the error that names it (``k``)."""
    from coordinator.catalog import table_from_create
    from cumulus.passes.inline_from import qualify_correlations

    ddl = {
        "o": "CREATE TABLE o (id INT PRIMARY KEY, k INT, x INT, g TEXT)",
        "p": "CREATE TABLE p (id INT PRIMARY KEY, k INT)",
        "i": "CREATE TABLE i (id INT PRIMARY KEY, y INT, v INT)",
    }
    schemas = {n: table_from_create(sqlglot.parse_one(d), lambda t: t) for n, d in ddl.items()}
    select = sqlglot.parse_one(
        "SELECT o.g FROM o WHERE EXISTS (SELECT 1 FROM i WHERE i.y = x AND v > 0)"
    )
    done = qualify_correlations(select, schemas.__getitem__).sql()  # type: ignore[arg-type]
    assert 'i.y = "o".x AND v > 0' in done
    both = sqlglot.parse_one(
        "SELECT o.g FROM o JOIN p ON o.id = p.id WHERE EXISTS (SELECT 1 FROM i WHERE i.y = k)"
    )
    assert qualify_correlations(both, schemas.__getitem__) is both  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["sync", "cumulus"])
@pytest.mark.parametrize(
    ("select", "column"),
    [
        (
            "SELECT o.k FROM a o WHERE o.x > (SELECT SUM(s.v) FROM b s "
            "WHERE s.v > (SELECT SUM(t.x) FROM a t WHERE t.k = o.k))",
            "o.k",
        ),
        (
            "SELECT COUNT(*) AS n FROM a o WHERE EXISTS (SELECT 1 FROM b s WHERE s.k = o.k "
            "AND s.x IN (SELECT t.x FROM a t WHERE t.id = o.id))",
            "o.id",
        ),
    ],
)
def test_a_column_of_a_query_two_levels_out_is_refused_by_name(
    select: str, column: str, mode: str
) -> None:
    """Each subquery is a view of its own over its tables and the query right around it:
    one that skips a level is named (before: "unknown table alias", naming hidden views)."""
    with pytest.raises(errors.InvalidArgument) as refused:
        _compiled(select, mode)
    assert str(refused.value) == (
        f"a subquery reads {column} of a query 2 levels around it, which no materialized view "
        "maintains: a subquery may read its own tables and those of the query right around it"
    )
    assert "__sub" not in str(refused.value)


@pytest.mark.parametrize("mode", ["sync", "cumulus"])
@pytest.mark.parametrize(
    "select",
    [
        "SELECT COUNT(*) AS n FROM b s WHERE s.v IN (SELECT t.x FROM a t)",
        "SELECT COUNT(*) AS n FROM b s WHERE EXISTS (SELECT 1 FROM a t WHERE t.x = s.v)",
    ],
)
def test_a_subquerys_column_of_another_type_is_named_as_written(select: str, mode: str) -> None:
    """IN, or a correlated =, between a DECIMAL and an INT: the refusal names the user's
    column and the subquery, not the hidden view it became (before: ``"__sub_q_1"."v0"``)."""
    with pytest.raises(errors.TypeMismatch) as refused:
        _compiled(select, mode)
    assert str(refused.value) == (
        "s.v (DECIMAL(8,2)) is compared with a subquery's column of type INT (by IN, or a "
        "correlated =); they must have the same type, as a join's columns (index keys are "
        "encoded per type)"
    )
