"""The query layer over views (slice, dice, roll-up, drill-down), through SQL and
``client.query``: property-based, every answer equals duckdb's aggregate of the base rows;
what a view cannot answer is refused naming it."""

from __future__ import annotations

import uuid
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sql_writes import each_refused

from aggview import errors
from coordinator import Client

AGGREGATES = {  # view column -> its SQL over the base table
    "s": "SUM(x)",
    "n": "COUNT(*)",
    "nx": "COUNT(x)",
    "lo": "MIN(x)",
    "hi": "MAX(x)",
    "av": "AVG(x)",
    "d": "COUNT(DISTINCT x)",
}
_row = st.tuples(
    st.sampled_from(["p", "q", "r"]), st.integers(0, 4), st.none() | st.integers(-9, 9)
)
_condition = st.one_of(
    st.builds(lambda a: ("a", a), st.sampled_from(["p", "q", "r", "z"])),
    st.builds(lambda a: ("a", a), st.lists(st.sampled_from(["p", "q", "r"]), min_size=1).map(list)),
    st.builds(lambda lo, hi: ("b", (lo, hi)), st.integers(0, 2), st.integers(1, 4)),
    st.builds(lambda b: ("b", b), st.integers(0, 4)),
)


def _sql_condition(column: str, wanted: Any) -> str:
    if isinstance(wanted, list):
        return f"{column} IN ({', '.join(repr(v) for v in wanted)})"
    if isinstance(wanted, tuple):
        return f"{column} BETWEEN {wanted[0]} AND {wanted[1]}"
    return f"{column} = {wanted!r}"


def _normal(value: Any) -> Any:
    if isinstance(value, float):  # duckdb's AVG is a double; ours DECIMAL(38, 6), half-even
        return Decimal(repr(value)).quantize(Decimal("0.000001"), ROUND_HALF_EVEN)
    return value


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rows=st.lists(_row, max_size=25),
    deletes=st.sets(st.integers(0, 24), max_size=6),
    queries=st.lists(
        st.tuples(
            st.sampled_from([None, ["a"], ["b"], [], ["a", "b"], ["b", "a"]]),
            st.dictionaries(st.sampled_from(["a", "b"]), st.none()).flatmap(
                lambda _: st.lists(_condition, max_size=2).map(dict)
            ),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_rollups_slices_and_dices_equal_duckdb(
    client: Client, rows: list[tuple[str, int, int | None]], deletes: set[int], queries: list
) -> None:
    table = f"q_{uuid.uuid4().hex[:10]}"
    client.sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, a TEXT, b INT, x INT)")
    aggregates = ", ".join(f"{sql} AS {name}" for name, sql in AGGREGATES.items())
    view = f"CREATE MATERIALIZED VIEW {table}_v AS SELECT a, b, {aggregates} FROM {table}"
    client.sql(f"{view} GROUP BY a, b")
    db = duckdb.connect()
    db.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, a TEXT, b INT, x INT)")
    if rows:
        values = ", ".join(
            f"({i}, '{a}', {b}, {'NULL' if x is None else x})" for i, (a, b, x) in enumerate(rows)
        )
        for target in (client.sql, db.execute):
            target(f"INSERT INTO {table} VALUES {values}")
    gone = [i for i in deletes if i < len(rows)]
    if gone:
        for target in (client.sql, db.execute):
            target(f"DELETE FROM {table} WHERE id IN ({', '.join(map(str, gone))})")
    for keep, where in queries:
        answer = client.query(f"{table}_v", where, rollup=keep)
        grouped = ["a", "b"] if keep is None else keep
        terms = " AND ".join(_sql_condition(c, w) for c, w in where.items())
        sql = f"SELECT {', '.join([*grouped, *AGGREGATES.values()])} FROM {table}"
        sql += f" WHERE {terms}" if terms else ""
        sql += f" GROUP BY {', '.join(grouped)}" if grouped else ""
        expected = [
            tuple(_normal(v) for v in r)
            for r in db.execute(sql).fetchall()
            if grouped or r[len(grouped) + 1]  # no rows at all: no group, here as in SQL
        ]
        got = [tuple(r[c] for c in [*grouped, *AGGREGATES]) for r in answer]
        assert sorted(got, key=repr) == sorted(expected, key=repr), (keep, where)


def test_what_a_view_cannot_answer_is_refused(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, a TEXT, x INT)")
    client.sql(
        f"CREATE MATERIALIZED VIEW {table_name}_v AS SELECT a, SUM(x) AS s, MIN(x) AS lo, "
        f"COUNT(DISTINCT x) AS d FROM {table_name} GROUP BY a"
    )
    client.sql(
        f"CREATE MATERIALIZED VIEW {table_name}_h AS SELECT a, COUNT(*) AS n FROM {table_name} "
        "GROUP BY a HAVING COUNT(*) > 1"
    )
    view = f"{table_name}_v"
    refusals = {
        f"SELECT a, SUM(lo) FROM {view} GROUP BY a": "lo is MIN per group, so it rolls up as MIN",
        f"SELECT SUM(d) FROM {view}": "d is COUNT DISTINCT per group",
        f"SELECT x FROM {view}": "has no column 'x'",
        f"SELECT * FROM {view} GROUP BY s": "its groups are by a",
        f"SELECT * FROM {view} WHERE a LIKE 'p%'": "unsupported condition",
        f"SELECT COUNT(*) FROM {view}": "unsupported select item",
        f"SELECT * FROM {table_name}_h GROUP BY ()": "HAVING",
    }
    each_refused(client, refusals)
    with pytest.raises(errors.InvalidArgument, match="invalid name"):
        client.query(view, {"a; DROP TABLE x": 1})


def test_adhoc_selects_equal_duckdb(client: Client, table_name: str) -> None:
    """Joins, aggregates, ORDER BY, DISTINCT and expressions over base tables (and a view) are
    answered at one snapshot, as duckdb answers them over the same rows."""
    import random

    rng = random.Random(5)
    shops, sales = f"{table_name}_shops", f"{table_name}_sales"
    schema = {
        shops: "(id INT PRIMARY KEY, city TEXT NOT NULL)",
        sales: "(id INT PRIMARY KEY, shop INT NOT NULL, amount DECIMAL(8,2), day DATE)",
    }
    rows = {
        shops: [f"({i}, '{rng.choice(['oslo', 'rome'])}')" for i in range(6)],
        sales: [
            f"({i}, {rng.randrange(6)}, {rng.randint(1, 999) / 100}, "
            f"DATE '2026-01-{rng.randint(1, 28):02d}')"
            for i in range(40)
        ],
    }
    db = duckdb.connect()
    for name, columns in schema.items():
        for target in (client.sql, db.execute):
            target(f"CREATE TABLE {name} {columns}")
            target(f"INSERT INTO {name} VALUES {', '.join(rows[name])}")
    client.sql(
        f"CREATE MATERIALIZED VIEW {table_name}_per_shop AS SELECT shop, SUM(amount) AS total "
        f"FROM {sales} GROUP BY shop"
    )
    db.execute(
        f"CREATE VIEW {table_name}_per_shop AS SELECT shop, SUM(amount) AS total "
        f"FROM {sales} GROUP BY shop"
    )
    queries = [
        f"SELECT s.city, COUNT(*) AS n, SUM(x.amount) AS total FROM {sales} x "
        f"JOIN {shops} s ON x.shop = s.id GROUP BY s.city ORDER BY s.city",
        f"SELECT shop, MAX(day) AS last FROM {sales} GROUP BY shop HAVING COUNT(*) > 5 "
        "ORDER BY shop",
        f"SELECT DISTINCT shop FROM {sales} WHERE amount > 5 ORDER BY shop",
        f"SELECT id, amount * 2 AS twice FROM {sales} WHERE id < 5 ORDER BY id",
        f"SELECT p.shop, p.total, s.city FROM {table_name}_per_shop p JOIN {shops} s "
        "ON p.shop = s.id ORDER BY p.shop",
    ]
    for sql in queries:
        got = client.sql(sql)
        assert [tuple(r.values()) for r in got] == db.execute(sql).fetchall(), sql
        assert "rows read" in got.message
    assert "reads the same tables" in client.sql(f"SELECT SUM(amount) FROM {sales}").message
