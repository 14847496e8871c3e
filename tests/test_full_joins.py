"""FULL [OUTER] JOIN in sync and async views: a LEFT JOIN and the other table's unmatched rows,
two branches of one view (``cumulus.passes.full_joins``). The refresh operator over random and
crowded batches (deletes, updates that move join keys, rows before the rows they join, NULL
keys) against duckdb's recomputation after every batch; sync and async views on a cluster after
rounds of concurrent writers; what cumulus and the compiler refuse, by exact message."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_anti_joins import ZERO_TWO_ZERO, _check_batches, _compiled, _crowded_batch
from test_subqueries import TABLES, check_against_duckdb
from test_subquery_views import modes_equal_recomputation

from agglauncher.cluster import LocalCluster
from aggview import errors
from cumulus.ddl import altered_plan, parse_view_statement
from cumulus.m3.compiler import compile_program, plan_of

# a and b: id, k (0-1 in crowded batches), x (NULL, 1, 2...), g (text, NULL too), v, f
FULL = {
    "grouped by the left": "SELECT a.g, COUNT(*) AS n, COUNT(a.id) AS na, COUNT(b.x) AS nx, "
    "SUM(b.v) AS s, MIN(a.v) AS lo, MAX(b.v) AS hi FROM a FULL JOIN b ON a.k = b.k GROUP BY a.g",
    "grouped by the right, NULL keys": "SELECT b.g, COUNT(*) AS n, SUM(a.v) AS s, "
    "MAX(a.x) AS hx, AVG(b.v) AS m FROM a FULL OUTER JOIN b ON a.x = b.x GROUP BY b.g",
    "grouped by both keys": "SELECT COALESCE(a.k, b.k) AS k, COUNT(*) AS n, COUNT(a.id) AS na, "
    "COUNT(b.id) AS nb FROM a FULL JOIN b ON b.k = a.k AND b.x = a.x GROUP BY COALESCE(a.k, b.k)",
    "one row": "SELECT COUNT(*) AS n, COUNT(a.id) AS na, COUNT(b.id) AS nb, SUM(a.v) AS s "
    "FROM a FULL JOIN b ON a.k = b.k",
    "bag": "SELECT a.id, b.id AS bid, b.g FROM a FULL JOIN b ON a.k = b.k",
    "bag of stars": "SELECT * FROM a FULL JOIN b ON a.x = b.x",
    "distinct": "SELECT DISTINCT a.g, b.g AS bg FROM a FULL JOIN b ON a.k = b.k",
    "WHERE and HAVING": "SELECT a.g, COUNT(*) AS n, SUM(b.v) AS s FROM a FULL JOIN b "
    "ON a.k = b.k WHERE a.v > 0 OR b.v > 0 OR a.id IS NULL GROUP BY a.g HAVING COUNT(*) > 1",
    "self": "SELECT a.k, COUNT(*) AS n, COUNT(c.id) AS nc FROM a FULL JOIN a c ON c.x = a.k "
    "GROUP BY a.k",
    "of a subquery": "SELECT s.k, b.g, COUNT(*) AS n, SUM(s.t) AS t FROM (SELECT k, SUM(v) AS t "
    "FROM a GROUP BY k) s FULL JOIN b ON b.k = s.k GROUP BY s.k, b.g",
    "in a subquery": "SELECT a.g, COUNT(*) AS n, SUM(f.n) AS t FROM a JOIN (SELECT "
    "COALESCE(a.k, b.k) AS k, COUNT(*) AS n FROM a FULL JOIN b ON a.x = b.x "
    "GROUP BY COALESCE(a.k, b.k)) f ON f.k = a.k GROUP BY a.g",
    "in a union": "SELECT u.g, COUNT(*) AS n, SUM(u.v) AS s FROM (SELECT a.g, b.v FROM a FULL "
    "JOIN b ON b.k = a.k UNION ALL SELECT b.g, b.v FROM b) u GROUP BY u.g",
}


@pytest.mark.parametrize("shape", FULL)
def test_full_joins_maintained_by_the_refresh_operator_equal_duckdb(shape: str) -> None:
    check_against_duckdb([("q", FULL[shape])], seed=len(shape), batches=25)


@settings(max_examples=examples(8, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(FULL)), seed=st.integers(0, 10**6))
def test_full_joins_equal_duckdb_after_every_random_batch(shape: str, seed: int) -> None:
    check_against_duckdb([("q", FULL[shape])], seed, batches=10)


@pytest.mark.parametrize("shape", FULL)
def test_a_keys_matches_going_0_2_0_on_either_side(shape: str) -> None:
    _check_batches(FULL[shape], ZERO_TWO_ZERO)


@settings(
    max_examples=examples(10, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(shape=st.sampled_from(sorted(FULL)), seed=st.integers(0, 10**6))
def test_crowded_batches_over_full_joins_equal_duckdb(shape: str, seed: int) -> None:
    rng, ids = random.Random(seed), itertools.count()
    live: dict[str, dict[int, Any]] = {name: {} for name in TABLES}
    _check_batches(FULL[shape], [_crowded_batch(rng, live, ids) for _ in range(10)])


# === what the compiler makes of it, and what it refuses ==========================================


def test_a_full_join_is_a_left_join_and_the_unmatched_rows_of_the_other_side() -> None:
    (plan,) = _compiled(FULL["grouped by the left"])
    matched, unmatched = plan.branch_plans()
    assert (matched.outer, unmatched.outer) == (("b",), ("a",))
    assert matched.filters == ()
    assert unmatched.filters == ({"not": {"notnull": {"col": ["a", "k"]}}},)
    assert matched.group_by == unmatched.group_by and plan.sql.count("FULL JOIN") == 1
    # unquoted names fold to lower case, as everywhere in a view
    (plan,) = _compiled("SELECT COUNT(*) AS n FROM A x FULL OUTER JOIN b Y ON X.k = y.K")
    assert [b.outer for b in plan.branch_plans()] == [("y",), ("x",)]


@pytest.mark.parametrize("shape", ["grouped by the left", "bag", "in a union"])
def test_cumulus_takes_a_full_join(shape: str) -> None:
    """Created, switched to and compiled to M3 in refresh = 'cumulus' (each LEFT JOIN branch
    as matched and unmatched ones: ``tests/test_cumulus_outer_joins.py``)."""
    assert _compiled(FULL[shape], "cumulus")[-1].mode == "cumulus"
    (plan,) = _compiled(FULL[shape])
    alter = parse_view_statement("ALTER MATERIALIZED VIEW q SET (refresh = 'cumulus')")
    assert altered_plan(plan, alter).mode == "cumulus"  # type: ignore[arg-type]
    compile_program([plan_of(FULL[shape], "q", TABLES.__getitem__)], TABLES.__getitem__)


_NOT = " is not supported in a materialized view: "


@pytest.mark.parametrize(
    ("select", "message"),
    [
        (
            "SELECT COUNT(*) FROM a FULL JOIN b ON a.k = b.k JOIN a c ON c.x = b.x",
            "a FULL JOIN beside other joins (only a FULL JOIN of two tables: join the others in "
            "a subquery)" + _NOT + "FULL JOIN b ON a.k = b.k",
        ),
        (
            "SELECT COUNT(*) FROM a JOIN b ON a.k = b.k FULL JOIN a c ON c.x = b.x",
            "a FULL JOIN beside other joins (only a FULL JOIN of two tables: join the others in "
            "a subquery)" + _NOT + "FULL JOIN a AS c ON c.x = b.x",
        ),
        (
            "SELECT COUNT(*) FROM a FULL JOIN b ON a.k < b.k",
            "a FULL JOIN's ON other than equalities of a column of each table (qualified: "
            "a.k = b.k)" + _NOT + "a.k < b.k",
        ),
        (
            "SELECT COUNT(*) FROM a FULL JOIN b ON a.k = b.k AND a.x > 1",
            "a FULL JOIN's ON other than equalities of a column of each table (qualified: "
            "a.k = b.k)" + _NOT + "a.x > 1",
        ),
        (
            "SELECT COUNT(*) FROM a FULL JOIN b ON a.k = a.x",
            "a FULL JOIN's ON other than equalities of a column of each table (qualified: "
            "a.k = b.k)" + _NOT + "a.k = a.x",
        ),
        (
            "SELECT COUNT(*) FROM a FULL JOIN a ON a.k = a.x",
            "a FULL JOIN's tables need distinct aliases: FULL JOIN a ON a.k = a.x",
        ),
        (
            'SELECT COUNT(*) FROM a "X" FULL JOIN b ON x.k = b.k',
            "a FULL JOIN's ON other than equalities of a column of each table (qualified: "
            "a.k = b.k)" + _NOT + "x.k = b.k",
        ),
        (
            "SELECT COUNT(*) FROM a FULL JOIN b USING (k)",
            "FULL JOIN ... USING or NATURAL FULL JOIN (write FULL JOIN ... ON) is not "
            "supported in a materialized view",
        ),
        (
            "SELECT COUNT(*) FROM a NATURAL FULL JOIN b",
            "FULL JOIN ... USING or NATURAL FULL JOIN (write FULL JOIN ... ON) is not "
            "supported in a materialized view",
        ),
    ],
)
def test_the_full_joins_refused_are_named(select: str, message: str) -> None:
    with pytest.raises(errors.InvalidArgument) as refused:
        _compiled(select)
    assert str(refused.value) == message


# === sync and async on a cluster =================================================================

CLUSTER = {
    "grouped by the left": "SELECT a.g AS g0, COUNT(*) AS agg0, COUNT(b.x) AS agg1, "
    "SUM(b.v) AS agg2, MIN(a.x) AS agg3 FROM {0} a FULL JOIN {1} b ON b.k = a.k GROUP BY a.g",
    "grouped by the right's NULLs": "SELECT b.g AS g0, COUNT(*) AS agg0, SUM(a.v) AS agg1, "
    "MAX(b.x) AS agg2 FROM {0} a FULL OUTER JOIN {1} b ON a.x = b.k GROUP BY b.g",
    "a bag": "SELECT a.id, a.g, b.id AS bid, b.v FROM {0} a FULL JOIN {1} b ON a.k = b.x",
}


@pytest.mark.parametrize("shape", CLUSTER)
def test_full_joins_equal_recomputation_in_sync_and_async(
    cluster: LocalCluster, shape: str
) -> None:
    select = CLUSTER[shape]
    spec: dict[str, Any] = {"group": ["g0"], "aggregates": ["exact"] * select.count(" AS agg")}
    if " AS agg" not in select:  # a bag: every column compared exactly, duplicates counted
        spec = {"group": [None] * 4, "aggregates": []}
    sizes = modes_equal_recomputation(cluster, 2, [], select, spec, seed=len(shape))
    assert sizes[0], "the view is empty as created: the seed tests nothing"
