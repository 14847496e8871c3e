"""Views without aggregates (issue #41): bag views, SELECT DISTINCT (and GROUP BY without
aggregates), SELECT * and alias.*, in every mode.

A bag view is kept as a GROUP BY over every projected column with the group's row count (its
multiplicity); a read gives each row as often as it counts, a DISTINCT view each once. Checked
against duckdb's recomputation from scratch: sync, async and cumulus views under random
concurrent multi-table transactions (the views' differential harness); the M3 programs after
every update of random streams, children before parents as often as not, at every ``--depth``
(the M3 differential harness); and the Cumulus runtime with 1-3 switches and reordered links
(the runtime's harness). Then reads, slices, roll-ups, SQL and subscriptions of one small view
with duplicates and NULLs, and the refusals.
"""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any

import pytest
import test_views_differential as differential
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_cumulus_runtime import close_enough, compiled_cases, interpreted
from test_m3_differential import replay, schemas_for
from test_view_language import SCHEMA

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from cumulus.compiler import compile_sql
from cumulus.m3.program import Program
from cumulus.m3.readout import read_view
from cumulus.plan import ViewPlan
from cumulus.runtime.simulator import Network, Simulator, Update, holding

_runs = itertools.count()
WIDTH = 6  # columns of each table (test_views_differential.table_ddl)


def _items(aliases: int) -> list[str]:
    """Projection items: columns of every alias (NULLs in g and x) and expressions of the row."""
    items = [f"a{i}.{c}" for i in range(aliases) for c in ("g", "k", "x", "v")]
    items += [
        "COALESCE(a0.x, a1.k, -1)",
        "CASE WHEN a0.x > 2 THEN 'hi' WHEN a1.g LIKE 'b%' THEN 'b' ELSE a0.g END",
        "a0.k * 2 + a1.k",
        "a1.f",
        "LEAST(a0.v, a1.x)",  # GREATEST/LEAST skip NULLs; DECIMAL(38,2) with its scale
        "SUBSTRING(a1.g FROM 1 FOR 1)",
    ]
    return items


@st.composite
def bag_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A random view without aggregates over the views' random joins and WHEREs: a list of
    items, ``*`` or ``aN.*``; a bag, SELECT DISTINCT, or (items only) GROUP BY them."""
    spec = draw(differential.view_specs())
    aliases = len(spec["table_of"])
    form = draw(st.sampled_from(["items", "items", "items", "*", "alias.*"]))
    if form == "items":
        projection = draw(st.lists(st.sampled_from(_items(aliases)), min_size=1, max_size=3))
        projection = list(dict.fromkeys(projection))
        width = len(projection)
    elif form == "*":  # a column JOIN ... USING merged is shown once
        projection, width = ["*"], WIDTH * aliases - differential.merged_columns(spec)
    else:
        projection, width = [f"a{draw(st.integers(0, aliases - 1))}.*"], WIDTH
    kinds = ["bag", "bag", "distinct"] + (["group by"] if form == "items" else [])
    return {
        **spec,
        "projection": projection,
        "kind": draw(st.sampled_from(kinds)),
        "group": [None] * width,  # assert_same: every column compared exactly
        "aggregates": [],
        "having": None,
    }


def bag_select(spec: dict[str, Any], names: list[str]) -> str:
    """The view's SELECT: the differential generator's FROM, JOINs and WHERE, this projection."""
    stub = differential.view_select(
        {**spec, "group": [], "aggregates": ["COUNT(*)"], "having": None}, names
    )
    rest = stub.removeprefix("SELECT COUNT(*) AS agg0 ")
    named = [p if p.endswith("*") else f"{p} AS c{i}" for i, p in enumerate(spec["projection"])]
    distinct = "DISTINCT " if spec["kind"] == "distinct" else ""
    sql = f"SELECT {distinct}{', '.join(named)} {rest}"
    if spec["kind"] == "group by":
        sql += " GROUP BY " + ", ".join(spec["projection"])
    return sql


# === every mode against recomputation ==========================================================


@settings(
    max_examples=examples(4, 16),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=bag_specs(), nodes=st.integers(1, 2))
def test_bag_views_equal_recomputation_in_every_mode(
    cluster: LocalCluster, spec: dict[str, Any], nodes: int
) -> None:
    write = functools.partial(bag_select, spec)
    differential.every_mode_equals_recomputation(cluster, f"b{next(_runs)}", write, spec, nodes)


@settings(
    max_examples=examples(12, 60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(spec=bag_specs())
def test_bag_programs_equal_recomputation_after_every_update(spec: dict[str, Any]) -> None:
    names = [f"t{i}" for i in range(spec["tables"])]
    replay(bag_select(spec, names), names, spec["seed"], steps=20, spec=spec)


@settings(
    max_examples=examples(10, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=compiled_cases(bag_specs(), bag_select))
def test_bag_programs_run_distributed_equal_the_interpreter(
    case: tuple[Program, list[Update], int, int, int | None],
) -> None:
    """1-4 DW nodes, 1-3 switches, links reordering or not: the maps equal the reference
    interpreter's, and so do the rows read from them, duplicates included."""
    distributed_equals_interpreter(case)


def distributed_equals_interpreter(
    case: tuple[Program, list[Update], int, int, int | None],
) -> None:
    """The case run on the simulator: its maps and the rows read from them equal the
    interpreter's."""
    program, stream, nodes, switches, reorder = case
    simulator = Simulator(program, nodes=nodes, switches=switches, network=Network(reorder))
    simulator.run(stream)
    want = interpreted(program, stream)
    assert close_enough(simulator.maps(), want)
    (view,) = program.views
    got = read_view(holding(program, simulator.maps()), view)
    assert sorted(map(repr, got)) == sorted(map(repr, read_view(holding(program, want), view)))


# === reads, slices, roll-ups, SQL, subscriptions ===============================================


# each mode's WITH clause, refreshed by hand (async, cumulus)
MODES = {
    "sync": "",
    "async": "WITH (refresh = 'async', interval_ms = 60000) ",
    "cumulus": "WITH (refresh = 'cumulus', epoch_ms = 60000) ",
}


def _sorted(rows: Any) -> list[tuple[Any, ...]]:
    return sorted((tuple(r.values()) for r in rows), key=repr)


def test_a_bag_view_reads_each_row_as_often_as_it_counts_in_every_mode(
    client: Client, table_name: str
) -> None:
    """Two rows with NULL are duplicates (SQL's bag); a slice, SQL over the view and a
    subscription (each row once with its ``__count``) see the same multiset; a roll-up gives
    the distinct values; a row whose count reaches 0 is gone; DISTINCT reads each once."""
    t = table_name
    client.sql(f"CREATE TABLE {t} (id INT PRIMARY KEY, g TEXT, x INT)")
    rows = [(1, "a", 1), (2, "a", 1), (3, None, None), (4, None, None), (5, "b", 2)]
    with client.transaction() as tx:
        for row_id, g, x in rows:
            tx.insert(t, {"id": row_id, "g": g, "x": x})
    options = MODES
    for mode, with_ in options.items():
        client.sql(f"CREATE MATERIALIZED VIEW {t}_{mode} {with_}AS SELECT g, x FROM {t}")
        client.sql(f"CREATE MATERIALIZED VIEW {t}_{mode}_d {with_}AS SELECT DISTINCT g FROM {t}")

    def refresh() -> None:
        for mode in ("async", "cumulus"):
            for suffix in ("", "_d"):
                client.refresh(f"{t}_{mode}{suffix}")

    refresh()
    bag = [("a", 1), ("a", 1), ("b", 2), (None, None), (None, None)]
    for mode in options:
        view = f"{t}_{mode}"
        assert _sorted(client.view(view)) == _sorted([{"g": g, "x": x} for g, x in bag]), mode
        assert _sorted(client.view(f"{view}_d")) == _sorted([{"g": g} for g in ("a", "b", None)])
        assert list(client.view(view, {"g": "a"})) == [{"g": "a", "x": 1}] * 2, mode
        assert len(client.query(view, {"g": None})) == 2, mode
        assert _sorted(client.query(view, rollup=["g"])) == [("a",), ("b",), (None,)], mode
        assert len(client.sql(f"SELECT * FROM {view} WHERE x = 1")) == 2, mode
        assert (
            client.sql(f"SELECT g, x FROM {view} WHERE x IS NULL") == [{"g": None, "x": None}] * 2
        )
    watch = client.watch(f"{t}_sync")

    def copy() -> dict[tuple[Any, Any], int]:
        return {(r["g"], r["x"]): r["__count"] for r in watch.copy.rows.values()}

    try:
        _wait(lambda: copy() == {("a", 1): 2, ("b", 2): 1, (None, None): 2}, copy)
        with client.transaction() as tx:  # one (a, 1) goes, the other moves to b
            tx.delete(t, {"id": 1})
            tx.update(t, {"id": 2}, {"g": "b", "x": 2})
        _wait(lambda: copy() == {("b", 2): 2, (None, None): 2}, copy)
    finally:
        watch.stop()
    refresh()
    for mode in options:
        assert _sorted(client.view(f"{t}_{mode}")) == [
            ("b", 2),
            ("b", 2),
            (None, None),
            (None, None),
        ], mode
        assert _sorted(client.view(f"{t}_{mode}_d")) == [("b",), (None,)], mode
    watch = client.watch(f"{t}_cumulus")  # the runtime's rows, counted the same way
    try:
        _wait(lambda: copy() == {("b", 2): 2, (None, None): 2}, copy)
    finally:
        watch.stop()
    for mode in ("cumulus", "async", "sync"):  # a bag view switched through every mode
        client.sql(f"ALTER MATERIALIZED VIEW {t}_sync SET (refresh = '{mode}')")
        if mode != "sync":
            client.refresh(f"{t}_sync")
        assert _sorted(client.view(f"{t}_sync")) == _sorted(client.view(f"{t}_async")), mode
    for mode in options:
        for suffix in ("", "_d"):
            client.sql(f"DROP MATERIALIZED VIEW {t}_{mode}{suffix}")


def _wait(done: Any, shown: Any) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, shown()
        time.sleep(0.02)


# === plans and refusals ========================================================================

SCHEMAS = {**schemas_for(["a"]), "b": SCHEMA}  # a: id, k, g, v, x, f; b: id, x, g, v, f


def _plan(select: str) -> ViewPlan:
    return compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}", SCHEMAS.__getitem__)


def test_the_shapes_and_star_columns_of_plans() -> None:
    bag = _plan("SELECT a.g, b.f, a.k + 1 AS k1 FROM a JOIN b ON a.k = b.id WHERE a.g <> 'x'")
    assert (bag.shape, bag.output, bag.aggregates) == ("bag", ("g", "f", "k1"), ())
    assert [g.name for g in bag.group_by] == ["g", "f", "k1"]
    assert ViewPlan.from_json(bag.to_json()) == bag
    assert _plan("SELECT DISTINCT g FROM a").shape == "distinct"
    assert _plan("SELECT g FROM a GROUP BY g").shape == "distinct"
    assert _plan("SELECT DISTINCT g, COUNT(*) FROM a GROUP BY g").shape == "aggregate"
    assert "shape" not in _plan("SELECT g, COUNT(*) FROM a GROUP BY g").to_json()
    # a name two expanded tables have is qualified by its alias; the others stay as they are
    star = _plan("SELECT * FROM a JOIN b ON a.k = b.id")
    assert star.output[:3] == ("a_id", "k", "a_g") and star.output[-2:] == ("b_v", "b_f")
    assert [str(g.ref) for g in star.group_by][:3] == ["a.id", "a.k", "a.g"]
    assert _plan("SELECT b.*, a.k FROM a JOIN b ON a.k = b.id").output == (
        *("id", "x", "g", "v", "f"),
        "k",
    )
    self_join = _plan("SELECT * FROM a x JOIN a y ON x.k = y.id")
    assert self_join.output[:2] == ("x_id", "x_k") and self_join.output[-1] == "y_f"
    counted = _plan("SELECT g, COUNT(DISTINCT k) AS n FROM a GROUP BY g")
    assert counted.aggregates[0].kind == "count_distinct"


@pytest.mark.parametrize(
    ("select", "fragment"),
    [
        ("SELECT g, g FROM a", "a.g appears twice in the SELECT of a view without aggregates"),
        ("SELECT *, COUNT(*) FROM a", "SELECT * is not supported in a view with GROUP BY"),
        ("SELECT a.* FROM a GROUP BY g", "SELECT a.* is not supported in a view with GROUP BY"),
        ("SELECT DISTINCT COUNT(*) FROM a GROUP BY g", "SELECT shows every GROUP BY column"),
        ("SELECT DISTINCT COUNT(*) FROM a", "there is no GROUP BY"),
        ("SELECT DISTINCT ON (g) g, k FROM a", "SELECT DISTINCT ON is not supported"),
        ("SELECT g FROM a GROUP BY g HAVING g > 'a'", "HAVING without an aggregate"),
        ("SELECT c.* FROM a", "unknown table alias 'c' in c.*"),
        ("SELECT COUNT(DISTINCT g, k) FROM a", "COUNT(DISTINCT with several arguments)"),
        ("SELECT SUM(DISTINCT k) FROM a", "SUM(DISTINCT ...)"),
        ("SELECT g FROM a, b", "column g is ambiguous"),
        ("SELECT k > 1 FROM a", "a condition cannot be used as a value"),
    ],
)
def test_what_views_without_aggregates_refuse(select: str, fragment: str) -> None:
    with pytest.raises(errors.AggviewError) as caught:
        _plan(select)
    assert fragment in str(caught.value)
