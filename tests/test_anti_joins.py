"""NOT EXISTS, NOT IN and LEFT JOIN without a cluster: what the compiler makes of each shape
(an outer alias, ``cumulus.plan.ViewPlan.outer``) and the refresh operator over random batches
of changes against duckdb's recomputation (``test_subqueries.check_against_duckdb``), batches
that move one key's matches 0 -> 2 -> 0 among them."""

from __future__ import annotations

import itertools
import random
from decimal import Decimal
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_subqueries import DUCK_COLUMNS, TABLES, Stack, check_against_duckdb, shown_row
from test_view_language import stored_changes

from cumulus.compiler import compile_sql_views
from cumulus.ddl import altered_plan, parse_view_statement
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.plan import ViewPlan

OUTER = {
    "NOT EXISTS": "SELECT a.g, COUNT(*) AS n, SUM(a.v) AS s FROM a WHERE NOT EXISTS "
    "(SELECT 1 FROM b WHERE b.k = a.k AND b.x > 1) GROUP BY a.g",
    "NOT EXISTS two keys": "SELECT a.k, a.x FROM a WHERE NOT EXISTS "
    "(SELECT * FROM b WHERE b.k = a.k AND b.x = a.x)",
    "NOT EXISTS NULL key": "SELECT a.g, COUNT(*) AS n FROM a WHERE NOT EXISTS "
    "(SELECT 1 FROM b WHERE b.x = a.x) GROUP BY a.g",
    "NOT EXISTS uncorrelated": "SELECT a.g, COUNT(*) AS n FROM a WHERE NOT EXISTS "
    "(SELECT * FROM b WHERE b.x = 3) GROUP BY a.g",
    "NOT EXISTS self": "SELECT a.k, COUNT(*) AS n FROM a WHERE NOT EXISTS "
    "(SELECT 1 FROM a c WHERE c.x = a.k) GROUP BY a.k",
    "NOT IN": "SELECT a.g, COUNT(*) AS n FROM a WHERE a.x NOT IN (SELECT b.x FROM b "
    "WHERE b.k > 2) GROUP BY a.g",
    "NOT IN correlated": "SELECT a.k, a.x FROM a WHERE a.x NOT IN "
    "(SELECT b.x FROM b WHERE b.k = a.k)",
    "NOT IN key": "SELECT a.g, a.x FROM a WHERE a.k NOT IN (SELECT b.k FROM b WHERE b.x = 2)",
    "LEFT JOIN counts": "SELECT a.g, COUNT(*) AS n, COUNT(b.x) AS nx, SUM(b.v) AS s, "
    "MIN(b.v) AS lo FROM a LEFT JOIN b ON b.k = a.k GROUP BY a.g",
    "LEFT JOIN group by nullable": "SELECT b.g, COUNT(*) AS n, SUM(a.v) AS s "
    "FROM a LEFT OUTER JOIN b ON a.x = b.k GROUP BY b.g",
    "LEFT JOIN bag": "SELECT a.id, b.id AS bid FROM a LEFT JOIN b ON a.k = b.k AND a.x = b.x",
    "LEFT JOIN IS NULL": "SELECT a.k, COUNT(*) AS n FROM a LEFT JOIN b ON a.k = b.x "
    "WHERE b.id IS NULL GROUP BY a.k",
    "LEFT JOIN WHERE": "SELECT a.g, COUNT(*) AS n, SUM(b.v) AS s FROM a LEFT JOIN b "
    "ON a.k = b.k WHERE a.x > 1 AND (b.v > 0 OR b.v IS NULL) GROUP BY a.g",
    # ON conditions on the joined table alone filter it before the join (passes/outer_filters)
    "LEFT JOIN ON filter": "SELECT a.g, COUNT(*) AS n, COUNT(b.x) AS nx, SUM(b.v) AS s "
    "FROM a LEFT JOIN b ON b.k = a.k AND b.x > 1 GROUP BY a.g",
    "LEFT JOIN ON filters, aliased": "SELECT c.g, COUNT(*) AS n, MAX(c.v) AS hi FROM a "
    "LEFT JOIN b AS c ON c.k = a.k AND c.g LIKE 'a%' AND c.x IS NOT NULL GROUP BY c.g",
    "LEFT JOIN ON filter, star": "SELECT a.id AS aid, b.* FROM a LEFT JOIN b "
    "ON a.k = b.k AND b.x > 1",
    "LEFT JOIN ON filters twice": "SELECT a.g, COUNT(*) AS n FROM a LEFT JOIN b ON a.k = b.k "
    "AND b.x > 1 LEFT JOIN b c ON c.k = a.x AND c.g = 'a' GROUP BY a.g",
    "LEFT JOIN twice": "SELECT a.g, COUNT(b.id) AS nb, COUNT(c.id) AS nc, COUNT(*) AS n "
    "FROM a LEFT JOIN b ON a.k = b.k LEFT JOIN b c ON c.x = a.x GROUP BY a.g",
    "LEFT JOIN after inner": "SELECT a.g, COUNT(*) AS n, COUNT(c.id) AS nc FROM a "
    "JOIN b ON a.k = b.k LEFT JOIN a c ON c.x = b.x GROUP BY a.g",
    "LEFT JOIN self": "SELECT a.k, COUNT(*) AS n, COUNT(c.id) AS nc FROM a LEFT JOIN a c "
    "ON c.x = a.k GROUP BY a.k",
    "LEFT JOIN off two tables": "SELECT a.g, COUNT(*) AS n, SUM(c.v) AS s FROM a JOIN b "
    "ON a.k = b.k LEFT JOIN b c ON c.k = a.x AND c.x = b.x GROUP BY a.g",
    "RIGHT JOIN": "SELECT b.g, COUNT(*) AS n, COUNT(a.x) AS nx, SUM(a.v) AS s FROM a "
    "RIGHT OUTER JOIN b ON a.k = b.k AND a.x = b.x GROUP BY b.g",
    "LEFT JOIN subquery": "SELECT a.g, COUNT(*) AS n, SUM(s.t) AS t FROM a LEFT JOIN "
    "(SELECT k, SUM(v) AS t FROM b GROUP BY k) s ON s.k = a.k GROUP BY a.g",
    # a simple subquery first in FROM is not merged into a view with an outer join
    # (``inline_from``): merged, the RIGHT JOIN's NULL rows failed the subquery's WHERE
    "RIGHT JOIN of a filtered subquery": "SELECT c.g, COUNT(*) AS n, COUNT(s.k) AS ns FROM "
    "(SELECT a.g, a.k FROM a WHERE a.x > 1) s RIGHT JOIN b c ON c.x = s.k GROUP BY c.g",
    "LEFT JOIN on a subquery's expression": "SELECT s.g, COUNT(*) AS n, COUNT(c.id) AS nc "
    "FROM (SELECT a.g, a.k + 1 AS k1 FROM a) s LEFT JOIN b c ON c.x = s.k1 GROUP BY s.g",
    # a union's branches (``ViewPlan.branches``) with outer aliases of their own
    "LEFT JOIN in a union": "SELECT u.g, COUNT(*) AS n, SUM(u.v) AS s FROM (SELECT a.g, b.v "
    "FROM a LEFT JOIN b ON b.k = a.k UNION ALL SELECT b.g, b.v FROM b) u GROUP BY u.g",
    "LEFT JOIN in a union's second branch": "SELECT g, COUNT(x) AS n FROM b GROUP BY g UNION ALL "
    "SELECT b.g, COUNT(a.id) AS n FROM b LEFT JOIN a ON a.x = b.k GROUP BY b.g",
    "NOT EXISTS in a union's second branch": "SELECT g, COUNT(*) AS n FROM b GROUP BY g "
    "UNION ALL SELECT a.g, COUNT(*) AS n FROM a WHERE NOT EXISTS "
    "(SELECT 1 FROM b WHERE b.k = a.k) GROUP BY a.g",
}


@pytest.mark.parametrize("shape", OUTER)
def test_outer_shapes_maintained_by_the_refresh_operator_equal_duckdb(shape: str) -> None:
    check_against_duckdb([("q", OUTER[shape])], seed=len(shape), batches=40)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(OUTER)), seed=st.integers(0, 10**6))
def test_outer_shapes_equal_duckdb_after_every_batch(shape: str, seed: int) -> None:
    check_against_duckdb([("q", OUTER[shape])], seed, batches=15)


# === batches that move one key's matches several times ==========================================


def _row(
    row_id: int, k: int, x: int | None, v: str = "1.00", g: str | None = "a"
) -> dict[str, Any]:
    return {"id": row_id, "k": k, "x": x, "g": g, "v": Decimal(v), "f": None}


Batch = dict[tuple[str, int], tuple[Any, Any]]


def _check_batches(select: str, batches: list[Batch]) -> None:
    """The view after each batch (one transaction each) equals duckdb's recomputation."""
    stack = Stack([("q", select)])
    con = duckdb.connect()
    for name in TABLES:
        con.execute(f"CREATE TABLE {name} ({DUCK_COLUMNS})")
    con.execute(f"CREATE VIEW q AS {select}")
    for batch in batches:
        for (name, row_id), (_, new) in batch.items():
            con.execute(f"DELETE FROM {name} WHERE id = ?", [row_id])
            if new is not None:
                con.execute(f"INSERT INTO {name} VALUES (?, ?, ?, ?, ?, ?)", list(new.values()))
        stack.apply(stored_changes(TABLES, batch))
        want = sorted(shown_row(r) for r in con.execute("SELECT * FROM q").fetchall())
        assert stack.view("q") == want, batch


# key 1's matches in b: 0 -> 2 in one batch (the outer rows first in another), 2 -> 1 -> 2 by
# swapping rows, an update moving a match to key 2, 1 -> 0 with an outer row inserted, a NULL key
ZERO_TWO_ZERO: list[Batch] = [
    {("a", 1): (None, _row(1, 1, 2)), ("a", 2): (None, _row(2, 1, None, g=None))},
    {("b", 10): (None, _row(10, 1, 2)), ("b", 11): (None, _row(11, 1, 3))},
    {("b", 10): (_row(10, 1, 2), None), ("b", 12): (None, _row(12, 1, 2, "2.50"))},
    {("b", 11): (_row(11, 1, 3), _row(11, 2, 3)), ("a", 3): (None, _row(3, 2, 3))},
    {("a", 4): (None, _row(4, 1, 2)), ("b", 12): (_row(12, 1, 2, "2.50"), None)},
    {("b", 13): (None, _row(13, 1, None)), ("a", 5): (None, _row(5, 3, None))},
    {
        ("b", 14): (None, _row(14, 3, 2)),
        ("b", 15): (None, _row(15, 1, 2)),
        ("a", 1): (_row(1, 1, 2), None),
    },
    {
        ("b", 14): (_row(14, 3, 2), None),
        ("b", 15): (_row(15, 1, 2), None),
        ("b", 13): (_row(13, 1, None), None),
    },
]


@pytest.mark.parametrize("shape", OUTER)
def test_a_keys_matches_going_0_2_0_in_batches_flip_its_outer_rows_once(shape: str) -> None:
    _check_batches(OUTER[shape], ZERO_TWO_ZERO)


def _crowded_batch(rng: random.Random, live: dict[str, dict[int, Any]], ids: Any) -> Batch:
    """Up to eight changes over two keys: several to one key in one transaction."""
    batch: Batch = {}
    for _ in range(rng.randint(1, 8)):
        name = rng.choice(sorted(live))
        free = sorted(set(live[name]) - {i for n, i in batch if n == name})
        row_id = rng.choice(free) if free and rng.random() < 0.5 else next(ids)
        new = _row(row_id, rng.randrange(2), rng.choice([None, 1, 2]), str(rng.randrange(-3, 4)))
        if row_id in live[name]:
            batch[(name, row_id)] = (live[name][row_id], None if rng.random() < 0.5 else new)
        else:
            batch[(name, row_id)] = (None, new)
    for (name, row_id), (_, new) in batch.items():
        if new is None:
            live[name].pop(row_id)
        else:
            live[name][row_id] = new
    return batch


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(OUTER)), seed=st.integers(0, 10**6))
def test_crowded_batches_equal_duckdb(shape: str, seed: int) -> None:
    rng, ids = random.Random(seed), itertools.count()
    live: dict[str, dict[int, Any]] = {name: {} for name in TABLES}
    _check_batches(OUTER[shape], [_crowded_batch(rng, live, ids) for _ in range(12)])


# === what the compiler makes of them ============================================================


def _compiled(select: str, mode: str = "") -> list[ViewPlan]:
    options = f" WITH (refresh = '{mode}')" if mode else ""
    sql = f"CREATE MATERIALIZED VIEW q{options} AS {select}"
    return compile_sql_views(sql, TABLES.__getitem__)


def test_not_exists_is_a_left_join_with_the_distinct_correlation_values_kept_where_null() -> None:
    hidden, outer = _compiled(OUTER["NOT EXISTS"])
    assert (hidden.shape, hidden.output, len(hidden.filters)) == ("distinct", ("c0",), 1)
    assert outer.outer == ("__sub_q_1",)
    assert [f"{e.left} = {e.right}" for e in outer.edges] == ["a.k = __sub_q_1.c0"]
    assert outer.filters == ({"not": {"notnull": {"col": ["__sub_q_1", "c0"]}}},)
    assert ViewPlan.from_json(outer.to_json()) == outer


def test_not_in_reads_the_values_and_their_counts() -> None:
    values, counts, outer = _compiled(OUTER["NOT IN correlated"])
    assert values.output == ("c0", "v0") and values.shape == "distinct"
    assert counts.output == ("c0", "n", "nn")
    assert outer.outer == (values.name, counts.name)


def test_a_left_joins_where_equality_with_its_table_is_a_filter() -> None:
    (plan,) = _compiled("SELECT COUNT(*) FROM a LEFT JOIN b ON a.k = b.k WHERE b.x = a.x")
    assert plan.outer == ("b",) and len(plan.edges) == 1 and len(plan.filters) == 1


def test_cumulus_refuses_a_left_join_with_a_subquery_on_its_value_by_name() -> None:
    """(A LEFT JOIN with a grouped subquery on its group columns is a lookup, its columns read
    anywhere since 2026-12-03; on one of its values it is more than one row's lookup.)"""
    select = (
        "SELECT a.g, SUM(s.t) AS t FROM a LEFT JOIN (SELECT b.k, SUM(b.x) AS t FROM b "
        "GROUP BY b.k) s ON a.k = s.k AND a.x = s.t GROUP BY a.g"
    )
    with pytest.raises(Exception, match="maintained in refresh = 'sync' or 'async'"):
        _compiled(select, "cumulus")
    _compiled(select.replace(" AND a.x = s.t", ""), "cumulus")


@pytest.mark.parametrize("shape", ["NOT EXISTS", "LEFT JOIN counts", "NOT IN", "NOT IN key"])
def test_cumulus_takes_not_exists_not_in_and_left_joins(shape: str) -> None:
    """(``tests/test_cumulus_outer_joins.py`` checks what it keeps)"""
    assert _compiled(OUTER[shape], "cumulus")[-1].outer


@pytest.mark.parametrize("shape", ["LEFT JOIN counts", "LEFT JOIN in a union's second branch"])
def test_a_left_join_view_can_switch_to_cumulus(shape: str) -> None:
    (plan,) = _compiled(OUTER[shape])
    alter = parse_view_statement("ALTER MATERIALIZED VIEW q SET (refresh = 'cumulus')")
    assert altered_plan(plan, alter).mode == "cumulus"  # type: ignore[arg-type]
    # matched and unmatched branches of maps, whichever branch the outer alias is in
    compile_program([plan_of(OUTER[shape], "q", TABLES.__getitem__)], TABLES.__getitem__)
    alter = parse_view_statement("ALTER MATERIALIZED VIEW q SET (refresh = 'async')")
    altered = altered_plan(plan, alter)  # type: ignore[arg-type]
    assert [b.outer for b in altered.branch_plans()] == [b.outer for b in plan.branch_plans()]


@pytest.mark.parametrize(
    ("select", "named"),
    [
        ("SELECT * FROM a RIGHT JOIN b ON a.k = b.k", "SELECT \\* over a RIGHT JOIN"),
        (
            "SELECT COUNT(*) FROM a JOIN b ON a.k = b.k RIGHT JOIN a c ON c.k = a.k",
            "a RIGHT JOIN after another join",
        ),
        ("SELECT COUNT(*) FROM a LEFT JOIN b ON a.k < b.k", "a LEFT JOIN's ON other than"),
        # a condition on the preserved table keeps its rows with NULLs: not a filter of b
        ("SELECT COUNT(*) FROM a LEFT JOIN b ON a.k = b.k AND a.x > 1", "ON other than.*: a.x > 1"),
        # unqualified, and both tables have x: ambiguous, not moved
        ("SELECT COUNT(*) FROM a LEFT JOIN b ON a.k = b.k AND x > 1", "column x is ambiguous"),
        (
            "SELECT COUNT(*) FROM a LEFT JOIN b ON a.k = b.k LEFT JOIN a c ON c.x = b.x",
            "a LEFT JOIN's ON other than",
        ),
        (
            "SELECT COUNT(*) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k + 1)",
            "NOT EXISTS correlated with an expression",
        ),
        (
            "SELECT COUNT(*) FROM a WHERE a.x NOT IN (SELECT MAX(b.x) FROM b GROUP BY b.k)",
            "NOT IN over a grouped subquery",
        ),
        (
            "SELECT COUNT(*) FROM a WHERE a.k = 1 OR NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
            "NOT EXISTS under OR",
        ),
    ],
)
def test_what_stays_refused_is_named(select: str, named: str) -> None:
    with pytest.raises(Exception, match=named):
        _compiled(select)


def test_a_left_joins_own_conditions_filter_its_table_before_the_join() -> None:
    from cumulus.passes.outer_filters import push_outer_filters
    from cumulus.sqltext import parse_sql

    select = parse_sql(
        "SELECT a.g, COUNT(c.x) FROM a LEFT JOIN b AS c ON c.k = a.k AND c.x > 1 AND c.g = 'a' "
        "JOIN b ON b.id = a.id GROUP BY a.g"
    )
    pushed = push_outer_filters(select, TABLES.__getitem__)
    assert pushed.sql() == (
        "SELECT a.g, COUNT(c.x) FROM a LEFT JOIN (SELECT * FROM b AS c WHERE c.x > 1 AND "
        "c.g = 'a') AS c ON c.k = a.k JOIN b ON b.id = a.id GROUP BY a.g"
    )
    assert "c.x > 1" in select.sql()  # the view's own SELECT is left as written
    (*hidden, plan) = _compiled(select.sql())
    assert len(hidden) == 1 and plan.outer == ("c",)
