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
from test_view_language import _theta_batch, theta_tables

from aggview.keycodec import encode_key
from aggview.merge import combine
from aggview.schema import ColumnType, TableSchema, from_storage, row_to_storage
from cumulus.aggstate import Row, ViewState
from cumulus.cascade import cascade
from cumulus.compiler import compile_sql
from cumulus.delta import Changes
from cumulus.plan import ViewPlan
from cumulus.view_rows import row_schema, rows_id, view_rows, with_views

TABLES = theta_tables()  # a and b: id, k, x, g, v, f
DUCK_COLUMNS = "id INT, k INT, x INT, g TEXT, v DECIMAL(8,2), f DOUBLE"


class Stack:
    """Views over views kept in memory: base tables as rows, each view as its groups' stored
    states, maintained by ``cascade`` as the coordinator maintains sync views."""

    def __init__(self, views: list[tuple[str, str]]) -> None:
        self.rows: dict[str, dict[bytes, Row]] = {name: {} for name in TABLES}
        self.plans: dict[str, ViewPlan] = {}
        self.states: dict[str, ViewState] = {}
        self.groups: dict[str, dict[bytes, Row]] = {}
        self.numbers: dict[str, int] = {}
        for number, (name, select) in enumerate(views):
            plan = compile_sql(f"CREATE MATERIALIZED VIEW {name} AS {select}", self.relation)
            self.plans[name] = plan
            self.states[name] = ViewState(plan, self.relation)
            self.groups[name] = {}
            self.numbers[name] = number

    def relation(self, name: str) -> TableSchema:
        if name in self.plans:
            return row_schema(self.plans[name], rows_id(self.numbers[name], name))
        return TABLES[name]

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
        state = self.states[name]
        rows = view_rows(state, self.groups[name])
        out = []
        for row in rows.values():
            values = tuple(row[c] for c in state.plan.output)
            types = [ColumnType.parse(state.plan.column_type(c)) for c in state.plan.output]
            pairs = zip(types, values, strict=True)
            shown = [None if v is None else from_storage(t, v) for t, v in pairs]
            out += [shown_row(shown)] * row["__count"]
        return sorted(out)


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
        changes: Changes = {}
        for (name, row_id), (old, new) in batch.items():
            schema = TABLES[name]
            key = encode_key(schema.key_types, [row_id])
            stored = [row_to_storage(schema, r) if r else None for r in (old, new)]
            changes.setdefault(name, {})[key] = (stored[0], stored[1])
            con.execute(f"DELETE FROM {name} WHERE id = ?", [row_id])
            if new is None:
                live[name].pop(row_id)
            else:
                live[name][row_id] = new
                con.execute(f"INSERT INTO {name} VALUES (?, ?, ?, ?, ?, ?)", list(new.values()))
        stack.apply(changes)
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
