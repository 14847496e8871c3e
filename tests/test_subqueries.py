"""Views over views and subqueries, without a cluster: what the compiler makes of each shape
(``cumulus.passes.lift_subqueries``: hidden views), and the refresh operator over a cascade of
views (``cumulus.cascade``) against duckdb's recomputation after every batch of random
changes (inserts, deletes, updates, either table first)."""

from __future__ import annotations

import asyncio
import itertools
import random
from decimal import Decimal
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_view_language import _theta_batch, mirror, stored_changes, theta_tables

from aggview.merge import combine
from aggview.schema import ColumnType, TableSchema, from_storage
from cumulus.aggstate import Row, ViewState
from cumulus.cascade import cascade
from cumulus.compiler import compile_sql, compile_sql_views
from cumulus.delta import Changes, from_scratch
from cumulus.plan import ViewPlan
from cumulus.view_rows import row_schema, rows_id, view_rows, with_views

TABLES = theta_tables()  # a and b: id, k, x, g, v, f
DUCK_COLUMNS = "id INT, k INT, x INT, g TEXT, v DECIMAL(8,2), f DOUBLE"


class Stack:
    """Views over views kept in memory: base tables as rows, each view as its groups' stored
    states, maintained by ``cascade`` as the coordinator maintains sync views."""

    def __init__(
        self, views: list[tuple[str, str]], tables: dict[str, TableSchema] = TABLES
    ) -> None:
        self.tables = tables  # the base tables (a and b unless given)
        self.rows: dict[str, dict[bytes, Row]] = {name: {} for name in tables}
        self.plans: dict[str, ViewPlan] = {}
        self.states: dict[str, ViewState] = {}
        self.groups: dict[str, dict[bytes, Row]] = {}
        self.numbers: dict[str, int] = {}
        for name, select in views:  # each with its subqueries' hidden views before it
            sql = f"CREATE MATERIALIZED VIEW {name} AS {select}"
            for plan in compile_sql_views(sql, self.relation):
                self.numbers[plan.name] = len(self.plans)
                self.plans[plan.name] = plan
                self.states[plan.name] = ViewState(plan, self.relation)
                self.groups[plan.name] = self._initial(plan)

    def _initial(self, plan: ViewPlan) -> dict[bytes, Row]:
        """A new view's groups computed from what it reads, as the coordinator initializes
        one: the base tables' rows and the inner views' rows (an aggregate without GROUP BY
        has its row even over no rows)."""
        tables: dict[str, dict[bytes, Row]] = {}
        for table in {t.table for p in plan.branch_plans() for t in p.tables}:
            if table in self.states:
                tables[table] = view_rows(self.states[table], self.groups[table])
            else:
                tables[table] = dict(self.rows[table])
        return asyncio.run(from_scratch(self.states[plan.name], tables))

    def relation(self, name: str) -> TableSchema:
        if name in self.plans:
            return row_schema(self.plans[name], rows_id(self.numbers[name], name))
        return self.tables[name]

    async def base_rows(
        self, table: str, column: str | None, values: list[Any]
    ) -> dict[Any, list[tuple[bytes, Row]]]:
        rows = list(self.rows[table].items())
        if column is None:
            return {None: rows}
        return {v: [(k, r) for k, r in rows if r.get(column) == v] for v in values}

    async def read(self, name: str, prefixes: list[bytes] | None) -> dict[bytes, Row]:
        groups = self.groups[name]
        if prefixes is None:
            return dict(groups)
        return {k: s for k, s in groups.items() if any(k.startswith(p) for p in prefixes)}

    def apply(self, changes: Changes) -> None:
        """One transaction: every view's delta, inner views first, then the rows."""
        inner = {t for p in self.plans.values() for t in p.base_tables() if t in self.plans}
        rows_where = with_views(self.base_rows, self.states, self.read)
        deltas, _ = asyncio.run(
            cascade(self.states.values(), changes, rows_where, self.read, inner)
        )
        for name, delta in deltas.items():
            for key, d in delta.items():
                self.groups[name][key] = combine(self.groups[name].get(key, {}), d)
        for table, rows in changes.items():
            for key, (_, after) in rows.items():
                if after is None:
                    self.rows[table].pop(key, None)
                else:
                    self.rows[table][key] = after

    def view(self, name: str) -> list[str]:
        """The view's rows as a read gives them (a bag's row as often as it counts)."""
        return sorted(shown_row(row) for row in self.values(name))

    def values(self, name: str) -> list[tuple[Any, ...]]:
        """The view's rows as values a client sees (DECIMAL, DATE, ...), a bag's row as often
        as it counts."""
        state = self.states[name]
        rows = view_rows(state, self.groups[name])
        out = []
        for row in rows.values():
            values = tuple(row[c] for c in state.plan.output)
            types = [ColumnType.parse(state.plan.column_type(c)) for c in state.plan.output]
            pairs = zip(types, values, strict=True)
            shown = tuple(None if v is None else from_storage(t, v) for t, v in pairs)
            out += [shown] * row["__count"]
        return out


def shown_row(values: Any) -> str:
    """A row as the tests compare it: numbers to 4 places (duckdb's AVG is a DOUBLE, ours a
    DECIMAL rounded to 6)."""
    return repr(
        tuple(
            round(float(v), 4) if isinstance(v, Decimal | float) and not isinstance(v, bool) else v
            for v in values
        )
    )


def check_against_duckdb(views: list[tuple[str, str]], seed: int, batches: int = 25) -> Stack:
    """Maintains ``views`` (the last reads the others) over random batches; after each, every
    view equals duckdb's recomputation of it (inner views as duckdb views)."""
    stack = Stack(views)
    con = duckdb.connect()
    for name in TABLES:
        con.execute(f"CREATE TABLE {name} ({DUCK_COLUMNS})")
    for name, _ in views:
        con.execute(f"CREATE VIEW {name} AS {stack.plans[name].sql}")
    rng, ids = random.Random(seed), itertools.count()
    live: dict[str, dict[int, Any]] = {name: {} for name in TABLES}
    for _ in range(batches):
        batch = _theta_batch(rng, live, ids)
        for (name, row_id), (_, new) in batch.items():
            mirror(con, live, name, row_id, new)
        stack.apply(stored_changes(TABLES, batch))
        for name, _ in views:
            want = sorted(shown_row(r) for r in con.execute(f"SELECT * FROM {name}").fetchall())
            assert stack.view(name) == want, name
    return stack


# === views over views ============================================================================

LAYERED = [
    # an aggregate over an aggregate: the DBToaster derived-table shape
    [
        ("inner_v", "SELECT g, k, COUNT(*) AS n, AVG(v) AS m FROM a GROUP BY g, k"),
        ("outer_v", "SELECT g, MAX(n) AS top, SUM(m) AS s, COUNT(*) AS c FROM inner_v GROUP BY g"),
    ],
    # a view joined with a table on a group column, and HAVING in the inner view
    [
        ("inner_v", "SELECT k, SUM(v) AS s FROM b GROUP BY k HAVING COUNT(*) > 1"),
        (
            "outer_v",
            "SELECT a.g, COUNT(*) AS n, SUM(i.s) AS t FROM a JOIN inner_v i ON a.k = i.k "
            "GROUP BY a.g",
        ),
    ],
    # a one-row view crossed with a table (a scalar subquery's shape)
    [
        ("inner_v", "SELECT AVG(v) AS m, COUNT(*) AS n FROM b"),
        ("outer_v", "SELECT a.g, COUNT(*) AS n FROM a, inner_v i WHERE a.v > i.m GROUP BY a.g"),
    ],
    # a bag view: its rows count as often as they are there
    [
        ("inner_v", "SELECT a.g, b.x FROM a JOIN b ON a.k = b.k WHERE b.x IS NOT NULL"),
        ("outer_v", "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM inner_v GROUP BY g"),
    ],
    # three levels, and a DISTINCT view as a semi-join's support
    [
        ("d1", "SELECT DISTINCT k FROM b WHERE x > 0"),
        ("d2", "SELECT a.g, a.k, a.v FROM a JOIN d1 ON a.k = d1.k"),
        ("d3", "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM d2 GROUP BY g"),
    ],
]


@pytest.mark.parametrize("views", LAYERED, ids=lambda v: v[-1][1][:40])
def test_views_over_views_maintained_by_the_refresh_operator_equal_duckdb(
    views: list[tuple[str, str]],
) -> None:
    check_against_duckdb(views, seed=len(views[-1][1]), batches=40)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.sampled_from(LAYERED), seed=st.integers(0, 10**6))
def test_cascades_equal_duckdb_after_every_batch(layers: list[tuple[str, str]], seed: int) -> None:
    check_against_duckdb(layers, seed, batches=15)


def test_a_view_reads_a_views_columns_as_a_read_gives_them() -> None:
    stack = Stack(LAYERED[0])
    schema = stack.relation("inner_v")
    assert [c.name for c in schema.columns] == ["__count", "g", "k", "n", "m"]
    assert str(schema.column("m").type) == "DECIMAL(38,6)"
    star = compile_sql("CREATE MATERIALIZED VIEW s AS SELECT * FROM inner_v", stack.relation)
    assert star.output == ("g", "k", "n", "m")
    with pytest.raises(Exception, match="refresh = 'sync' or 'async'"):
        compile_sql(
            "CREATE MATERIALIZED VIEW c WITH (refresh = 'cumulus') AS "
            "SELECT g, COUNT(*) FROM inner_v GROUP BY g",
            stack.relation,
        )


# === subqueries ==================================================================================

SUBQUERIES = {
    "derived table": "SELECT s.g, MAX(s.n) AS top, SUM(s.t) AS t, COUNT(*) AS c FROM "
    "(SELECT g, k, COUNT(*) AS n, SUM(v) AS t FROM a GROUP BY g, k) s GROUP BY s.g",
    "derived bag joined": "SELECT a.g, COUNT(*) AS n FROM a JOIN (SELECT k, x FROM b WHERE x > 0) "
    "s ON a.k = s.k GROUP BY a.g",
    "IN": "SELECT a.g, COUNT(*) AS n, SUM(a.v) AS s FROM a WHERE a.x IN "
    "(SELECT b.k FROM b WHERE b.v > 0) GROUP BY a.g",
    "IN correlated": "SELECT a.g, COUNT(*) AS n FROM a WHERE a.x IN "
    "(SELECT b.x FROM b WHERE b.k = a.k) GROUP BY a.g",
    "IN grouped": "SELECT a.k, a.g FROM a WHERE a.x IN (SELECT COUNT(*) FROM b GROUP BY b.k)",
    "EXISTS": "SELECT a.g, COUNT(*) AS n FROM a WHERE EXISTS "
    "(SELECT 1 FROM b WHERE b.k = a.k AND b.x > 1) GROUP BY a.g",
    "EXISTS uncorrelated": "SELECT a.g, COUNT(*) AS n FROM a WHERE EXISTS "
    "(SELECT * FROM b WHERE b.x = 3) GROUP BY a.g",
    "scalar": "SELECT a.g, COUNT(*) AS n FROM a WHERE a.v > (SELECT AVG(b.v) FROM b) GROUP BY a.g",
    "scalar COUNT": "SELECT a.k, a.x FROM a WHERE a.x < (SELECT COUNT(*) FROM b WHERE b.x > 1)",
    "correlated scalar": "SELECT a.g, COUNT(*) AS n, SUM(a.v) AS s FROM a "
    "WHERE a.v >= (SELECT MAX(b.v) FROM b WHERE b.k = a.k) GROUP BY a.g",
    # TPC-H Q17's shape as written: arithmetic over the correlated aggregate
    "correlated arithmetic": "SELECT a.g, COUNT(*) AS n, SUM(a.v) AS s FROM a "
    "WHERE a.v < (SELECT 0.2 * AVG(b.v) FROM b WHERE b.k = a.k) GROUP BY a.g",
    "correlated ratio": "SELECT a.g, COUNT(*) AS n FROM a "
    "WHERE a.x >= (SELECT SUM(b.x) / COUNT(*) - 1 FROM b WHERE b.k = a.k) GROUP BY a.g",
    # TPC-H Q11's shape: HAVING against an uncorrelated scalar, the groups filtered in WHERE
    "HAVING scalar": "SELECT a.g, SUM(a.v) AS s FROM a GROUP BY a.g "
    "HAVING SUM(a.v) > (SELECT SUM(b.v) * 0.1 FROM b) AND COUNT(*) > 1",
    "HAVING IN over a group column": "SELECT a.k, a.g, MAX(a.x) AS hi FROM a GROUP BY a.k, a.g "
    "HAVING a.k IN (SELECT b.k FROM b WHERE b.x > 1) AND MIN(a.v) < (SELECT AVG(b.v) FROM b)",
    # TPC-H Q21's shape: another row of the same key with a different value, and none late
    "EXISTS <>": "SELECT a.g, COUNT(*) AS n FROM a WHERE EXISTS (SELECT 1 FROM a a2 "
    "WHERE a2.k = a.k AND a2.x <> a.x) AND NOT EXISTS (SELECT 1 FROM a a3 WHERE a3.k = a.k "
    "AND a.x <> a3.x AND a3.v > 0) GROUP BY a.g",
    "NOT EXISTS <> other table": "SELECT a.k, a.x FROM a WHERE NOT EXISTS (SELECT 1 FROM b "
    "WHERE b.k = a.k AND b.g <> a.g)",
    "nested": "SELECT a.g, COUNT(*) AS n FROM a WHERE a.k IN (SELECT b.k FROM b WHERE b.v < "
    "(SELECT AVG(c.v) FROM a c WHERE c.k = b.k))  GROUP BY a.g",
    # TPC-H Q18's and Q15's shapes (tests/test_tpch_shapes.py): a TypeError and a refusal before
    "IN grouped HAVING": "SELECT a.g, COUNT(*) AS n FROM a WHERE a.k IN "
    "(SELECT b.k FROM b GROUP BY b.k HAVING SUM(b.v) > 0) GROUP BY a.g",
    "scalar over derived": "SELECT a.g, COUNT(*) AS n FROM a WHERE a.v >= "
    "(SELECT MAX(s.t) FROM (SELECT k, SUM(v) AS t FROM b GROUP BY k) s) GROUP BY a.g",
    # a one-row subquery alone: its row is there over no rows (cumulus refuses it by name)
    "one-row derived table alone": "SELECT COUNT(*) AS n, SUM(d.c) AS c, MAX(d.s) AS s FROM "
    "(SELECT COUNT(*) AS c, SUM(b.v) AS s FROM b WHERE b.x > 1) d",
    "one-row derived table under HAVING alone": "SELECT COUNT(*) AS n FROM "
    "(SELECT SUM(b.x) AS t FROM b HAVING SUM(b.x) > 3) d",
}


@pytest.mark.parametrize("shape", SUBQUERIES)
def test_subqueries_maintained_by_the_refresh_operator_equal_duckdb(shape: str) -> None:
    check_against_duckdb([("q", SUBQUERIES[shape])], seed=len(shape), batches=40)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(SUBQUERIES)), seed=st.integers(0, 10**6))
def test_subquery_cascades_equal_duckdb_after_every_batch(shape: str, seed: int) -> None:
    check_against_duckdb([("q", SUBQUERIES[shape])], seed, batches=15)


def _compiled(select: str) -> list[ViewPlan]:
    return compile_sql_views(f"CREATE MATERIALIZED VIEW q AS {select}", TABLES.__getitem__)


def _edges(plan: ViewPlan) -> list[str]:
    return [f"{e.left} = {e.right}" for e in plan.edges]


def test_each_subquery_becomes_a_hidden_view_the_query_joins() -> None:
    derived, outer = _compiled(SUBQUERIES["derived table"])
    assert (derived.name, derived.shape, derived.mode) == ("__sub_q_1", "aggregate", "sync")
    assert outer.hidden == ("__sub_q_1",) and outer.sql == SUBQUERIES["derived table"]
    assert [(t.alias, t.table) for t in outer.tables] == [("s", "__sub_q_1")]

    semi, outer = _compiled(SUBQUERIES["IN correlated"])
    assert semi.shape == "distinct"  # a semi-join: each outer row counts once
    assert semi.output == ("v0", "c0")
    assert _edges(outer) == ["a.x = __sub_q_1.v0", "a.k = __sub_q_1.c0"]

    exists, outer = _compiled(SUBQUERIES["EXISTS"])
    assert (exists.shape, exists.output, len(exists.filters)) == ("distinct", ("c0",), 1)
    assert _edges(outer) == ["a.k = __sub_q_1.c0"]

    counted, outer = _compiled(SUBQUERIES["EXISTS uncorrelated"])
    assert [a.kind.value for a in counted.aggregates] == ["count_star"]
    assert outer.edges == () and outer.filters == (
        {"cmp": ">", "args": [{"col": ["__sub_q_1", "v0"]}, {"lit": 0, "type": "INT"}]},
    )

    one_row, outer = _compiled(SUBQUERIES["scalar"])
    assert one_row.group_by == () and outer.edges == ()  # a cross join with its one row
    assert outer.filters == (
        {"cmp": ">", "args": [{"col": ["a", "v"]}, {"col": ["__sub_q_1", "v0"]}]},
    )

    grouped, outer = _compiled(SUBQUERIES["correlated scalar"])
    assert [g.name for g in grouped.group_by] == ["c0"]
    assert _edges(outer) == ["a.k = __sub_q_1.c0"]

    inner, distinct, outer = _compiled(SUBQUERIES["IN grouped"])  # a DISTINCT over a GROUP BY
    assert (inner.name, distinct.name, distinct.hidden) == (
        "__sub_q_2",
        "__sub_q_1",
        ("__sub_q_2",),
    )
    assert [t.table for t in distinct.tables] == ["__sub_q_2"]

    *hidden, outer = _compiled(SUBQUERIES["nested"])
    assert [p.name for p in hidden] == ["__sub_q_2", "__sub_q_1"]


def test_subqueries_cumulus_does_not_take_are_refused_by_name() -> None:
    """(Those it takes are nested aggregates of its program: ``test_cumulus_subqueries``.)"""
    with pytest.raises(Exception, match="a subquery over a subquery or a union is maintained"):
        compile_sql_views(
            "CREATE MATERIALIZED VIEW q WITH (refresh = 'cumulus') AS " + SUBQUERIES["nested"],
            TABLES.__getitem__,
        )
