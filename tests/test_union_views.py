"""UNION ALL and a SELECT without FROM (issue #41): what the compiler makes of them, the
refresh operator (sync and async maintenance's ΔV, in memory) and the M3 interpreter at every
``--depth`` against duckdb's recomputation after every batch of random changes, and views in
sync, async and cumulus on a cluster against duckdb after rounds of concurrent random
transactions; each refusal's message."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_bag_views import MODES, _wait, distributed_equals_interpreter
from test_cumulus_runtime import compiled_cases
from test_m3_differential import replay
from test_subqueries import SUBQUERIES, TABLES, check_against_duckdb
from test_view_mode_switch import DELAYS, SETTINGS, SWITCHES, _switches_lose_and_double_nothing
from test_views_differential import every_mode_equals_recomputation

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from cumulus.compiler import CUMULUS_REFUSAL, compile_sql_views
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.program import PartSum
from cumulus.passes.union_plans import BRANCH, NOTHING
from cumulus.plan import ViewPlan

# Each shape over tables {0} and {1} (id, k, g, v, x, f): (SELECT, columns compared within
# rounding: AVG). No subquery but in "hidden branch": every mode takes the others.
UNIONS: dict[str, tuple[str, list[bool]]] = {
    "aggregate over a union": (
        "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM (SELECT a.g, a.v FROM {0} a UNION ALL "
        "SELECT b.g, b.v AS v FROM {1} b WHERE b.x > 0) u GROUP BY g",
        [False, False, False],
    ),
    "every aggregate kind": (
        "SELECT u.g, MIN(u.x) AS lo, MAX(u.v) AS hi, AVG(u.v) AS m, COUNT(DISTINCT u.x) AS d, "
        "COUNT(u.x) AS c FROM (SELECT a.g, a.v, a.x FROM {0} a WHERE a.k < 3 UNION ALL "
        "SELECT b.g, b.v, b.k AS x FROM {1} b WHERE b.v > 1) u GROUP BY u.g HAVING COUNT(*) > 1",
        [False, False, False, True, False, False],
    ),
    "a table in two branches, joins": (
        "SELECT k, COUNT(*) AS n, SUM(v) AS s FROM (SELECT a.k, a.v FROM {0} a UNION ALL "
        "SELECT a.k, b.v FROM {0} a JOIN {1} b ON a.k = b.x) u GROUP BY k",
        [False, False, False],
    ),
    "top-level union of aggregates": (
        "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {0} GROUP BY g UNION ALL "
        "SELECT g, SUM(v) AS total, COUNT(*) AS n FROM {1} WHERE k > 0 GROUP BY g",
        [False, False, False],
    ),
    "top-level union of bags": (
        "SELECT a.g, a.k FROM {0} a UNION ALL SELECT b.g, b.x FROM {1} b WHERE b.x IS NOT NULL "
        "UNION ALL SELECT g, k FROM {0} WHERE v > 0",
        [False, False],
    ),
    "a bag over a union": (
        "SELECT * FROM (SELECT a.g, a.k FROM {0} a UNION ALL SELECT b.g, b.x AS k FROM {1} b) u "
        "WHERE u.k IS NOT NULL",
        [False, False],
    ),
    "UNION (rows each once)": (
        "SELECT g, k FROM {0} UNION SELECT g, x FROM {1} WHERE v > 0 UNION SELECT g, k FROM {0}",
        [False, False],
    ),
    "DISTINCT over a union": (
        "SELECT DISTINCT u.g FROM (SELECT a.g FROM {0} a UNION ALL SELECT g FROM {1}) u",
        [False],
    ),
    "DECIMALs widened": (
        "SELECT g, MAX(v) AS hi, MIN(v) AS lo, SUM(v) AS s, COUNT(DISTINCT v) AS d FROM "
        "(SELECT a.g, a.v FROM {0} a UNION ALL SELECT b.g, b.v * 2 AS v FROM {1} b) u GROUP BY g "
        "UNION ALL SELECT g, MAX(v) AS hi, MIN(v), SUM(v), COUNT(DISTINCT v) FROM {1} GROUP BY g",
        [False] * 5,
    ),
    "no FROM: one scalar": ("SELECT (SELECT SUM(v) FROM {0}) AS total", [False]),
    "no FROM: scalars and constants": (
        "SELECT (SELECT SUM(v) FROM {0}) - (SELECT COUNT(*) FROM {1} WHERE x > 1) AS d, "
        "1 AS one, (SELECT MAX(k) FROM {1}) AS top, (SELECT AVG(v) FROM {0} WHERE k = 2) AS m",
        [False, False, False, True],
    ),
}
HIDDEN_BRANCH = (
    "SELECT g, COUNT(*) AS n FROM (SELECT a.g FROM {0} a WHERE a.k IN (SELECT b.k FROM {1} b "
    "WHERE b.x > 0) UNION ALL SELECT b.g FROM {1} b) u GROUP BY g"
)
# a union joined with a table: a hidden view that is a union (sync and async)
JOINED = (
    "SELECT a.g, COUNT(*) AS n, SUM(u.v) AS s FROM {0} a JOIN (SELECT b.k, b.v FROM {1} b "
    "UNION ALL SELECT c.x AS k, c.v FROM {0} c WHERE c.x > 0) u ON a.k = u.k GROUP BY a.g"
)
HIDDEN_SCALAR = "SELECT (SELECT COUNT(*) FROM {0} a WHERE a.k IN (SELECT b.x FROM {1} b)) AS n"


def _compiled(select: str) -> list[ViewPlan]:
    sql = f"CREATE MATERIALIZED VIEW q AS {select.format('a', 'b')}"
    return compile_sql_views(sql, TABLES.__getitem__)


# === the compiler ================================================================================


def test_a_union_is_one_plan_whose_branches_add_up() -> None:
    [plan] = _compiled(UNIONS["aggregate over a union"][0])
    assert [t.table for b in plan.branch_plans() for t in b.tables] == ["a", "b"]
    assert plan.base_tables() == ("a", "b") and len(plan.branches) == 1
    assert plan.output == ("g", "s", "n")
    assert plan.branches[0].filters and not plan.filters  # b.x > 0 is the second branch's
    assert ViewPlan.from_json(plan.to_json()) == plan

    [tagged] = _compiled(UNIONS["top-level union of aggregates"][0])
    assert [g.name for g in tagged.group_by] == ["g", BRANCH]  # each branch's groups apart
    assert tagged.output == ("g", "s", "n")  # named by the first branch, as SQL names them
    assert tagged.branches[0].group_by[1].expr == {"lit": 2, "type": "INT"}

    [bag] = _compiled(UNIONS["top-level union of bags"][0])
    assert bag.shape == "bag" and len(bag.branches) == 2  # multiplicities add: no tag


def test_a_select_without_from_is_one_row_over_its_subqueries() -> None:
    [plan] = _compiled(UNIONS["no FROM: scalars and constants"][0])
    assert plan.group_by == () and plan.output == ("d", "one", "top", "m")
    assert [a.name for a in plan.aggregates if not a.hidden] == []
    assert len(plan.branch_plans()) == 4  # a subquery each
    # an aggregate takes nothing from the branches of the other subqueries
    args = [[a.arg == NOTHING for a in b.aggregates] for b in plan.branch_plans()]
    assert [sum(not n for n in row) for row in args] == [1, 1, 1, 1]
    counts = [a.arg for b in plan.branch_plans() for a in b.aggregates if a.kind.value == "count"]
    # COUNT(*) counts its own branch's rows, not the view's
    assert [a for a in counts if a != NOTHING] == [{"lit": 1, "type": "INT"}]
    assert {d.name: d.type for d in plan.derived}["one"] == "INT"


def test_a_unions_m3_view_adds_its_branches_maps() -> None:
    select = UNIONS["aggregate over a union"][0].format("a", "b")
    program = compile_program([plan_of(select, "q", TABLES.__getitem__)], TABLES.__getitem__)
    [view] = program.views
    assert isinstance(view.rows, PartSum) and len(view.rows.parts) == 2
    assert {t.relation for t in program.triggers} == {"a", "b"}


def test_hidden_views_in_a_union_are_created_before_it() -> None:
    *hidden, plan = _compiled(HIDDEN_BRANCH)
    assert [h.name for h in hidden] == ["__sub_q_1"] and plan.hidden == ("__sub_q_1",)
    *hidden, plan = _compiled(HIDDEN_SCALAR)
    assert plan.hidden == tuple(h.name for h in hidden) and len(hidden) == 1


REFUSALS = [
    (
        "SELECT g FROM a UNION SELECT g FROM b UNION ALL SELECT g FROM a",
        "UNION without ALL beside UNION ALL",
    ),
    ("SELECT g, COUNT(*) FROM a GROUP BY g UNION SELECT g, 1 FROM b", "UNION without ALL of"),
    (
        "SELECT g, COUNT(*) AS n FROM a GROUP BY g UNION ALL SELECT g, SUM(v) AS n FROM b "
        "GROUP BY g",
        "UNION ALL branches differ in column n: COUNT_STAR(None) in the first, SUM(DECIMAL(8,2))",
    ),
    ("SELECT g, k FROM a UNION ALL SELECT g, v FROM b", "differ in column k: INT in the first"),
    ("SELECT g, v FROM a UNION ALL SELECT g, f FROM b", "differ in column v: DECIMAL(8,2) in the"),
    ("SELECT g FROM a UNION ALL SELECT g, k FROM b", "UNION ALL branches have 1 and 2 columns"),
    ("SELECT COUNT(*) FROM (SELECT g FROM a UNION ALL SELECT 1 AS g) u", "branch without FROM"),
    (
        "SELECT COUNT(*) FROM (SELECT g, k + 1 FROM a UNION ALL SELECT g, k FROM b) u",
        "name the UNION ALL branch's column",
    ),
    ("SELECT 1 AS one", "a SELECT without FROM and without a subquery"),
    ("SELECT (SELECT k FROM a) AS k", "a scalar subquery without one aggregate item"),
    ("SELECT (SELECT SUM(v) FROM a GROUP BY g) AS s", "a scalar subquery with GROUP BY"),
    ("SELECT SUM(v) FROM a UNION ALL SELECT SUM(v) FROM b", "an aggregate without GROUP BY"),
    ("SELECT g FROM a INTERSECT SELECT g FROM b", "INTERSECT is not supported"),
]


@pytest.mark.parametrize(("select", "message"), REFUSALS, ids=[r[1][:40] for r in REFUSALS])
def test_refusals_name_the_construct(select: str, message: str) -> None:
    with pytest.raises(errors.AggviewError) as caught:
        _compiled(select)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "select", [HIDDEN_BRANCH, HIDDEN_SCALAR, JOINED], ids=["branch", "scalar", "joined"]
)
def test_a_union_over_hidden_views_is_refused_in_cumulus_naming_the_modes(select: str) -> None:
    sql = "CREATE MATERIALIZED VIEW q WITH (refresh = 'cumulus') AS " + select.format("a", "b")
    with pytest.raises(errors.InvalidArgument, match="refresh = 'sync' or 'async'"):
        compile_sql_views(sql, TABLES.__getitem__)
    assert "'cumulus'" in CUMULUS_REFUSAL
    with pytest.raises(errors.InvalidArgument, match="refresh = 'sync' or 'async'"):
        plan_of(select.format("a", "b"), "q", TABLES.__getitem__)


# === the refresh operator and M3 against duckdb ==================================================

IN_MEMORY = {
    **{name: select for name, (select, _) in UNIONS.items()},
    "hidden branch": HIDDEN_BRANCH,
    "hidden scalar": HIDDEN_SCALAR,
    "joined with a table": JOINED,
    "a union over a subquery's shape": SUBQUERIES["derived table"].replace(
        "FROM a GROUP BY g, k",
        "FROM (SELECT g, k, v FROM {0} UNION ALL SELECT g, x, v FROM {1}) w GROUP BY g, k",
    ),
}


@pytest.mark.parametrize("shape", IN_MEMORY)
def test_unions_maintained_by_the_refresh_operator_equal_duckdb(shape: str) -> None:
    check_against_duckdb([("q", IN_MEMORY[shape].format("a", "b"))], seed=len(shape), batches=40)


@settings(
    max_examples=examples(10, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(shape=st.sampled_from(sorted(IN_MEMORY)), seed=st.integers(0, 10**6))
def test_union_deltas_equal_duckdb_after_every_batch(shape: str, seed: int) -> None:
    check_against_duckdb([("q", IN_MEMORY[shape].format("a", "b"))], seed, batches=15)


def _spec(approx: list[bool]) -> dict[str, Any]:
    """``assert_same``'s columns: AVG ones compared within rounding."""
    return {"group": [], "aggregates": ["AVG" if a else "exact" for a in approx]}


@pytest.mark.parametrize("shape", UNIONS)
def test_unions_in_m3_equal_duckdb_after_every_update_at_every_depth(shape: str) -> None:
    select, approx = UNIONS[shape]
    names = ["t0", "t1"]
    replay(select.format(*names), names, seed=len(shape), steps=60, spec=_spec(approx))


@settings(max_examples=examples(6, 24), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(UNIONS)), seed=st.integers(0, 10**6))
def test_union_programs_equal_duckdb_for_random_streams(shape: str, seed: int) -> None:
    select, approx = UNIONS[shape]
    names = ["t0", "t1"]
    replay(select.format(*names), names, seed, steps=25, spec=_spec(approx))


@st.composite
def union_specs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "tables": 2,
        "seed": draw(st.integers(0, 10**6)),
        "shape": draw(st.sampled_from(sorted(UNIONS))),
    }


@settings(
    max_examples=examples(12, 50), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    case=compiled_cases(union_specs(), lambda spec, names: UNIONS[spec["shape"]][0].format(*names))
)
def test_union_programs_run_distributed_equal_the_interpreter(case: Any) -> None:
    """1-4 DW nodes, 1-3 switches, links reordering or not: the maps, and the rows read from
    them (each branch's parts added), equal the reference interpreter's."""
    distributed_equals_interpreter(case)


# === on a cluster: every mode ====================================================================

_runs = itertools.count()
# shapes on a cluster (each costs three views and three rounds): one of each kind
# shapes on a cluster (each costs three views and three rounds), with seeds whose tables as
# created give the view rows
ON_CLUSTER = {
    "aggregate over a union": 11,
    "every aggregate kind": 11,
    "a table in two branches, joins": 11,
    "top-level union of aggregates": 11,
    "top-level union of bags": 11,
    "UNION (rows each once)": 11,
    "DECIMALs widened": 11,
    "no FROM: scalars and constants": 19,
}


@pytest.mark.parametrize(("shape", "seed"), ON_CLUSTER.items(), ids=list(ON_CLUSTER))
def test_unions_equal_recomputation_in_every_mode(
    cluster: LocalCluster, shape: str, seed: int
) -> None:
    select, approx = UNIONS[shape]
    write = select.format
    sizes = every_mode_equals_recomputation(
        cluster,
        f"un{next(_runs)}",
        lambda t: write(*t),
        {"tables": 2, "seed": seed, **_spec(approx)},
    )
    assert sizes[0], "the view is empty as created: the seed tests nothing"


@pytest.mark.parametrize(
    ("select", "columns"), [(HIDDEN_BRANCH, 2), (JOINED, 3)], ids=["branch", "joined"]
)
def test_a_union_over_hidden_views_in_sync_and_async(
    cluster: LocalCluster, select: str, columns: int
) -> None:
    """A branch with a subquery, or a union joined with a table (a hidden view itself): sync
    and async maintain it; cumulus refuses it by name."""
    from test_subquery_views import modes_equal_recomputation

    spec = {"group": ["g"], "aggregates": ["exact"] * (columns - 1)}
    sizes = modes_equal_recomputation(cluster, 2, [], select, spec, seed=12)
    assert sizes[0]
    with Client(cluster.address) as client:
        table = f"un_h{columns}"
        client.sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, k INT, g TEXT, v INT, x INT)")
        with pytest.raises(errors.InvalidArgument, match="refresh = 'sync' or 'async'"):
            client.sql(
                "CREATE MATERIALIZED VIEW un_hc WITH (refresh = 'cumulus', nodes = 1, "
                "epoch_ms = 60000) AS " + select.format(table, table)
            )


@settings(max_examples=examples(3, 8), **SETTINGS)  # type: ignore[arg-type]
@given(spec=union_specs(), modes=SWITCHES, delays=DELAYS)
def test_a_unions_mode_switches_under_load_lose_and_double_nothing(
    cluster: LocalCluster, spec: dict[str, Any], modes: list[str], delays: list[float]
) -> None:
    """ALTER ... SET (refresh = ...) of a union between every mode while writers go on."""
    select, approx = UNIONS[spec["shape"]]
    _switches_lose_and_double_nothing(
        cluster, {**spec, **_spec(approx)}, modes, delays, lambda _, t: select.format(*t)
    )


@pytest.mark.parametrize("shape", ["top-level union of aggregates", "aggregate over a union"])
def test_a_view_over_a_union_view_equals_duckdb(shape: str) -> None:
    """A union read as a table by a sync view over it (the branches' rows, a tagged union's
    duplicates included)."""
    union = UNIONS[shape][0].format("a", "b")
    outer = "SELECT g, SUM(s) AS t, COUNT(*) AS c, MAX(n) AS m FROM u GROUP BY g"
    check_against_duckdb([("u", union), ("o", outer)], seed=len(shape), batches=40)


def test_reads_slices_and_a_subscription_of_a_union_keep_its_duplicates(
    client: Client, table_name: str
) -> None:
    """Two branches with the same group give two rows in every mode: read, sliced, over SQL and
    in a subscription's copy; a roll-up adds them."""
    t = table_name
    for table, rows in (("a", [(1, "x", 1), (2, "y", 2)]), ("b", [(1, "x", 1)])):
        client.sql(f"CREATE TABLE {t}_{table} (id INT PRIMARY KEY, g TEXT, v INT)")
        with client.transaction() as tx:
            for row_id, g, v in rows:
                tx.insert(f"{t}_{table}", {"id": row_id, "g": g, "v": v})
    select = (
        f"SELECT g, SUM(v) AS s FROM {t}_a GROUP BY g UNION ALL "
        f"SELECT g, SUM(v) AS s FROM {t}_b GROUP BY g"
    )
    for mode, with_ in MODES.items():
        client.sql(f"CREATE MATERIALIZED VIEW {t}_{mode} {with_}AS {select}")
        if mode != "sync":
            client.refresh(f"{t}_{mode}")
        view = f"{t}_{mode}"
        assert sorted(tuple(r.values()) for r in client.view(view)) == [
            ("x", 1),
            ("x", 1),
            ("y", 2),
        ], mode
        assert list(client.view(view, {"g": "x"})) == [{"g": "x", "s": 1}] * 2, mode
        assert len(client.sql(f"SELECT g, s FROM {view} WHERE g = 'x'")) == 2, mode
        assert sorted(tuple(r.values()) for r in client.query(view, rollup=["g"])) == [
            ("x", 2),
            ("y", 2),
        ], mode
    watch = client.watch(f"{t}_sync")

    def copy() -> list[tuple[Any, ...]]:
        return sorted((r["g"], r["s"]) for r in watch.copy.rows.values())

    try:
        _wait(lambda: copy() == [("x", 1), ("x", 1), ("y", 2)], copy)
        client.sql(f"UPDATE {t}_b SET v = 5 WHERE id = 1")
        _wait(lambda: copy() == [("x", 1), ("x", 5), ("y", 2)], copy)
    finally:
        watch.stop()
    for mode in MODES:
        client.sql(f"DROP MATERIALIZED VIEW {t}_{mode}")
