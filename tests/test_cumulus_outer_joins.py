"""Cumulus (M3) maintains LEFT, RIGHT and FULL JOIN views: ``a LEFT JOIN b ON a.k = b.k`` is
the matched inner join plus the unmatched rows of a, ``A * (c ^= Rows_B[k]) * {c = 0 OR k IS
NULL}`` with b's columns NULL (``cumulus.m3.outer``), two branches whose groups add up.

Each view is checked against duckdb recomputing its SELECT after every insert, delete and
update of either table (the interpreter, by generated code and by closures), then on the
distributed runtime (the simulator: switches, reordering links, epochs) against the
interpreter at every committed epoch; one view is created on a cluster."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_cumulus_runtime import RUNS, exact_at_every_epoch
from test_cumulus_subqueries import (
    DDL,
    TABLES,
    _rows,
    check_against_duckdb,
    program_of,
    random_stream,
)

from aggcli.cli import main
from aggclient import Client
from aggview import errors
from cumulus.compiler import compile_sql_views
from cumulus.ddl import altered_plan, parse_view_statement
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.outer import DEPTH_REFUSAL
from cumulus.m3.parser import parse_program
from cumulus.m3.printer import print_program
from cumulus.m3.program import MapLift

# shape -> the view's SELECT over r(id, k, x) and s(id, k, y) of ``test_cumulus_subqueries``
# (its streams: small domains, so rows match, miss and move between keys; NULL keys)
VIEWS = {
    "LEFT, COUNT(*) and SUM of the outer side, by the inner side": "SELECT r.x, COUNT(*) AS n, "
    "SUM(s.y) AS t FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.x",
    "LEFT, grouped by the outer side (NULL group)": "SELECT s.y, COUNT(*) AS n, "
    "COUNT(s.id) AS c, AVG(r.x) AS m FROM r LEFT JOIN s ON r.k = s.k GROUP BY s.y",
    "LEFT, grouped by the join key of each side": "SELECT r.k, s.k AS bk, COUNT(*) AS n, "
    "SUM(r.x + s.y) AS t FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.k, s.k",
    "LEFT, MIN and MAX of the outer side": "SELECT r.x, MIN(s.y) AS lo, MAX(s.y) AS hi, "
    "COUNT(*) AS n FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.x",
    "LEFT, WHERE over the outer side drops the unmatched": "SELECT r.x, COUNT(*) AS n, "
    "SUM(s.y) AS t FROM r LEFT JOIN s ON r.k = s.k WHERE s.y > 1 GROUP BY r.x",
    "LEFT, WHERE IS NULL keeps only the unmatched": "SELECT r.x, COUNT(*) AS n FROM r "
    "LEFT JOIN s ON r.k = s.k WHERE s.id IS NULL GROUP BY r.x",
    "LEFT, WHERE over both sides": "SELECT COUNT(*) AS n, SUM(r.x) AS t FROM r "
    "LEFT JOIN s ON r.k = s.k WHERE s.y IS NULL OR r.x > s.y",
    "LEFT, COALESCE of the outer side": "SELECT r.x, SUM(COALESCE(s.y, 10)) AS t, "
    "COUNT(*) AS n FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.x",
    "LEFT, functions of the outer side": "SELECT r.x, SUM(ABS(s.y - 2)) AS t, "
    "SUM(GREATEST(s.y, r.x)) AS g, COUNT(*) AS n FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.x",
    "LEFT on two equalities": "SELECT r.k, COUNT(*) AS n, COUNT(s.y) AS c FROM r "
    "LEFT JOIN s ON r.k = s.k AND r.x = s.y GROUP BY r.k",
    "LEFT, no GROUP BY": "SELECT COUNT(*) AS n, COUNT(s.id) AS c, SUM(s.y) AS t "
    "FROM r LEFT JOIN s ON r.k = s.k",
    "LEFT, self": "SELECT r.x, COUNT(*) AS n, SUM(r2.x) AS t FROM r "
    "LEFT JOIN r r2 ON r.x = r2.k GROUP BY r.x",
    "RIGHT": "SELECT s.y, COUNT(*) AS n, SUM(r.x) AS t, COUNT(r.id) AS c FROM r "
    "RIGHT JOIN s ON r.k = s.k GROUP BY s.y",
    "FULL, grouped by both sides": "SELECT r.x, s.y, COUNT(*) AS n, COUNT(r.id) AS ca, "
    "COUNT(s.id) AS cb FROM r FULL JOIN s ON r.k = s.k GROUP BY r.x, s.y",
    "FULL, no GROUP BY, WHERE": "SELECT COUNT(*) AS n, SUM(r.x) AS sa, SUM(s.y) AS sb "
    "FROM r FULL JOIN s ON r.k = s.k WHERE r.x IS NULL OR r.x < 3",
    "LEFT, a bag": "SELECT r.id, s.y FROM r LEFT JOIN s ON r.k = s.k",
    "LEFT JOIN chain": "SELECT r.x, COUNT(*) AS n, SUM(s.y) AS t, COUNT(c.id) AS c FROM r "
    "LEFT JOIN s ON r.k = s.k LEFT JOIN s c ON r.x = c.k GROUP BY r.x",
    "JOIN then LEFT JOIN": "SELECT s.y, COUNT(*) AS n, SUM(c.x) AS t FROM r "
    "JOIN s ON r.k = s.k LEFT JOIN r c ON s.y = c.k GROUP BY s.y",
    "LEFT, DISTINCT": "SELECT DISTINCT r.x, s.y FROM r LEFT JOIN s ON r.k = s.k",
    "LEFT, HAVING": "SELECT r.x, COUNT(s.id) AS c FROM r LEFT JOIN s ON r.k = s.k GROUP BY r.x "
    "HAVING COUNT(*) > 1",
    "LEFT, COUNT(DISTINCT) of the outer side": "SELECT r.x, COUNT(DISTINCT s.y) AS c FROM r "
    "LEFT JOIN s ON r.k = s.k GROUP BY r.x",
    "LEFT, grouped by a COALESCE of the outer side": "SELECT COALESCE(s.y, -1) AS g, "
    "COUNT(*) AS n FROM r LEFT JOIN s ON r.k = s.k GROUP BY COALESCE(s.y, -1)",
    "LEFT and NOT EXISTS": "SELECT r.x, COUNT(*) AS n, SUM(s.y) AS t FROM r "
    "LEFT JOIN s ON r.k = s.k WHERE NOT EXISTS (SELECT 1 FROM s s2 WHERE s2.k = r.x) "
    "GROUP BY r.x",
    "UNION ALL of LEFT JOINs": "SELECT g, COUNT(*) AS n FROM (SELECT r.x AS g FROM r "
    "LEFT JOIN s ON r.k = s.k UNION ALL SELECT s.y AS g FROM s LEFT JOIN r ON r.k = s.k) u "
    "GROUP BY g",
    # a grouped subquery on its groups is one row or none: a lookup (its columns NULL or not)
    "LEFT JOIN with a grouped subquery": "SELECT COUNT(*) AS n FROM r LEFT JOIN "
    "(SELECT s.k, SUM(s.y) AS t FROM s GROUP BY s.k) g ON r.k = g.k",
    "LEFT JOIN with a grouped subquery, WHERE on it": "SELECT r.x, COUNT(*) AS n FROM r "
    "LEFT JOIN (SELECT s.k, COUNT(*) AS c FROM s GROUP BY s.k) g ON r.k = g.k "
    "WHERE g.c IS NULL OR g.c < 2 GROUP BY r.x",
    "LEFT JOIN with a grouped subquery SELECT reads": "SELECT COUNT(*) AS n, SUM(g.t) AS t "
    "FROM r LEFT JOIN (SELECT s.k, SUM(s.y) AS t FROM s GROUP BY s.k) g ON r.k = g.k",
    "LEFT JOIN with a grouped subquery, grouped by a COALESCE of it": "SELECT "
    "COALESCE(g.c, 0) AS c, COUNT(*) AS n, SUM(r.x) AS t FROM r LEFT JOIN "
    "(SELECT s.k, COUNT(s.y) AS c FROM s GROUP BY s.k) g ON r.k = g.k GROUP BY COALESCE(g.c, 0)",
    "NOT IN": "SELECT COUNT(*) AS n FROM r WHERE r.k NOT IN (SELECT s.k FROM s)",
    # an ON condition on the LEFT JOINed table alone filters it before the join (2026-12-03):
    # the matched branch has it, the unmatched one's key count is over the rows it keeps
    "LEFT, ON filters its own table": "SELECT r.k, COUNT(*) AS n, COUNT(s.id) AS c, "
    "SUM(s.y) AS t FROM r LEFT JOIN s ON r.k = s.k AND s.y > 1 AND s.id <> 3 GROUP BY r.k",
    "LEFT self, ON filter, WHERE on the NULL row": "SELECT a.x, COUNT(*) AS n FROM r a "
    "LEFT JOIN r b ON a.k = b.x AND b.k IS NOT NULL WHERE b.id IS NULL GROUP BY a.x",
    "two LEFT JOINs, each filtered": "SELECT r.k, COUNT(s.id) AS a, COUNT(t.id) AS b FROM r "
    "LEFT JOIN s ON r.k = s.k AND s.y > 1 LEFT JOIN s t ON r.x = t.k AND t.y < 2 GROUP BY r.k",
    "LEFT, ON filter, a bag": "SELECT r.id, s.y FROM r LEFT JOIN s ON r.k = s.k AND s.y < 3",
}
# what cumulus still refuses of outer joins (one line naming it and the modes that take it)
REFUSED = {
    "a LEFT JOIN with a grouped subquery on its value": "SELECT COUNT(*) AS n, SUM(g.t) AS t "
    "FROM r LEFT JOIN (SELECT s.k, SUM(s.y) AS t FROM s GROUP BY s.k) g ON r.k = g.k "
    "AND r.x = g.t",
    "a LEFT JOIN with a subquery's rows": "SELECT COUNT(*) AS n FROM r LEFT JOIN "
    "(SELECT s.k, s.y FROM s) g ON r.k = g.k WHERE g.y IS NULL",
}


def test_the_unmatched_rows_read_the_outer_tables_row_count_through_a_lift() -> None:
    """T2 reads b's rows per key by value, ``(c ^= Rows_B[k]) * {c = 0 OR k IS NULL}``; the
    view's rows are T1's and T2's added up; b is a relation, no hidden view is."""
    program = program_of(VIEWS["LEFT, COUNT(*) and SUM of the outer side, by the inner side"])
    assert sorted(s.name for s in program.sources) == ["r", "s"]
    lifts = [f for m in program.maps if m.definition for f in m.definition.body]
    assert [f.name for f in lifts if isinstance(f, MapLift)] == ["__s_by_k_rows"]
    text = print_program(program)
    assert "ROWS (v_rows(int)[][x] + v_rows_2(int)[][x])" in text
    assert "{__s_by_k_rows_v = 0 OR NOT k IS NOT NULL}" in text
    assert (len(program.maps), sum(len(t.statements) for t in program.triggers)) == (8, 26)


def test_the_m3_command_prints_a_left_joins_program(tmp_path: Path, capsys: Any) -> None:
    schema = tmp_path / "schema.sql"
    keyed = (ddl.replace("id INT,", "id INT PRIMARY KEY,") for ddl in DDL.values())
    schema.write_text(";\n".join(keyed) + ";\n")
    select = VIEWS["LEFT, COUNT(*) and SUM of the outer side, by the inner side"]
    main(["m3", "--schema", str(schema), select])
    printed = parse_program(capsys.readouterr().out)
    assert any(isinstance(f, MapLift) for m in printed.maps for f in m.definition.body)  # type: ignore[union-attr]
    assert len(printed.maps) == 8


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_bounded_depth_refuses_an_outer_join_by_name(depth: int) -> None:
    plan = plan_of(VIEWS["RIGHT"], "v", TABLES.__getitem__)
    with pytest.raises(errors.InvalidArgument) as refused:
        compile_program([plan], TABLES.__getitem__, depth)
    assert str(refused.value) == DEPTH_REFUSAL


def test_a_where_no_null_row_passes_leaves_the_inner_join_only() -> None:
    program = program_of(VIEWS["LEFT, WHERE over the outer side drops the unmatched"])
    assert not any(isinstance(f, MapLift) for m in program.maps for f in m.definition.body)  # type: ignore[union-attr]


@pytest.mark.parametrize("shape", sorted(VIEWS))
def test_each_shape_equals_duckdb_after_every_update(shape: str) -> None:
    check_against_duckdb(VIEWS[shape], random_stream(random.Random(len(shape)), 80))


@settings(
    max_examples=examples(20, 100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(shape=st.sampled_from(sorted(VIEWS)), seed=st.integers(0, 10**6), steps=st.integers(1, 50))
def test_random_streams_equal_duckdb(shape: str, seed: int, steps: int) -> None:
    check_against_duckdb(VIEWS[shape], random_stream(random.Random(seed), steps))


@settings(
    max_examples=examples(15, 60), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    shape=st.sampled_from(sorted(VIEWS)),
    seed=st.integers(0, 10**6),
    steps=st.integers(1, 60),
    run=st.fixed_dictionaries(RUNS),
)
def test_the_runtime_is_exact_at_every_epoch(
    shape: str, seed: int, steps: int, run: dict[str, Any]
) -> None:
    """Every committed epoch equals the interpreter over its prefix, the unmatched rows' lift
    included."""
    stream = random_stream(random.Random(seed), steps)
    exact_at_every_epoch(program_of(VIEWS[shape]), stream, **run)


@pytest.mark.parametrize("shape", ["LEFT, no GROUP BY", "RIGHT", "FULL, grouped by both sides"])
def test_cumulus_takes_outer_joins_at_create(shape: str) -> None:
    sql = f"CREATE MATERIALIZED VIEW v WITH (refresh = 'cumulus') AS {VIEWS[shape]}"
    (plan,) = compile_sql_views(sql, TABLES.__getitem__)
    assert plan.mode == "cumulus" and compile_program([plan], TABLES.__getitem__).views


def test_a_cumulus_left_join_view_switches_to_sync_and_back() -> None:
    """Its plan is the one sync maintains (one outer alias and its NULL row): M3's branches
    are made when its program is compiled, so ALTER keeps the plan either way."""
    sql = f"CREATE MATERIALIZED VIEW v WITH (refresh = 'cumulus') AS {VIEWS['RIGHT']}"
    (plan,) = compile_sql_views(sql, TABLES.__getitem__)
    to_sync = parse_view_statement("ALTER MATERIALIZED VIEW v SET (refresh = 'sync')")
    synced = altered_plan(plan, to_sync)  # type: ignore[arg-type]
    assert (synced.mode, synced.outer, synced.nested) == ("sync", plan.outer, ())
    to_cumulus = parse_view_statement("ALTER MATERIALIZED VIEW v SET (refresh = 'cumulus')")
    assert altered_plan(synced, to_cumulus).outer == plan.outer  # type: ignore[arg-type]


@pytest.mark.parametrize("construct", sorted(REFUSED))
def test_what_cumulus_does_not_take_is_refused_naming_it_and_the_modes(construct: str) -> None:
    sql = f"CREATE MATERIALIZED VIEW v WITH (refresh = 'cumulus') AS {REFUSED[construct]}"
    with pytest.raises(errors.InvalidArgument) as refused:
        compile_program(compile_sql_views(sql, TABLES.__getitem__), TABLES.__getitem__)
    message = str(refused.value)
    assert "refresh = 'sync' or 'async', not 'cumulus'" in message and "\n" not in message
    sync = sql.replace("'cumulus'", "'sync'")
    assert compile_sql_views(sync, TABLES.__getitem__)[-1].mode == "sync"


def test_a_cumulus_left_join_view_on_a_cluster(client: Client, table_name: str) -> None:
    """Created on a cluster in refresh = 'cumulus' over tables holding rows, read exact after
    inserts, deletes and an update that moves a row of b to another key."""
    a, b = f"{table_name}_a", f"{table_name}_b"
    con = duckdb.connect()

    def both(*statements: str) -> None:
        """Each statement on the cluster and on duckdb (the reference)."""
        for sql in statements:
            client.sql(sql)
            con.execute(sql)

    both(
        *(f"CREATE TABLE {t} (id INT PRIMARY KEY, k INT, {c} INT)" for t, c in ((a, "g"), (b, "w")))
    )
    rng = random.Random(11)
    inserts = [
        f"INSERT INTO {rng.choice([a, b])} VALUES {(i, rng.choice([0, 1, 2]), rng.choice([1, 3]))}"
        for i in range(24)
    ]
    both(*inserts[:10])
    select = (
        f"SELECT {a}.g, COUNT(*) AS n, SUM({b}.w) AS t, COUNT({b}.id) AS c FROM {a} "
        f"LEFT JOIN {b} ON {a}.k = {b}.k GROUP BY {a}.g"
    )
    # and one whose ON filters b (its conditions on b alone: b's rows filtered, then joined)
    filtered = select.replace(f"{a}.k = {b}.k", f"{a}.k = {b}.k AND {b}.w > 1")
    views = {f"{table_name}_v": select, f"{table_name}_f": filtered}
    for view, sql in views.items():
        client.sql(
            f"CREATE MATERIALIZED VIEW {view} WITH (refresh = 'cumulus', epoch_ms = 60000) AS {sql}"
        )
    both(*inserts[10:])
    for table in (a, b):
        both(
            f"DELETE FROM {table} WHERE id IN (1, 2, 11)",
            f"UPDATE {table} SET k = 5 WHERE id IN (3, 12)",
            f"UPDATE {table} SET {'w' if table == b else 'g'} = 3 WHERE id IN (4, 13)",
        )
    for view, sql in views.items():
        client.refresh(view)
        assert _rows(list(client.view(view))) == _rows(con.execute(sql).fetchall()), view
        client.sql(f"DROP MATERIALIZED VIEW {view}")
