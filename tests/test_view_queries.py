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
from profiles import examples
from test_sql_writes import each_refused

from aggclient import Client
from aggview import errors

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
    st.sampled_from(["p", "q", "r"]),
    st.integers(0, 4),
    st.sampled_from(["u", "w"]),
    st.none() | st.integers(-9, 9),
)
_TEXT = st.sampled_from(["p", "q", "r", "u", "w", "z"])
_CONDITIONS = {
    "a": st.one_of(_TEXT, st.lists(_TEXT, min_size=1, max_size=3)),
    "c": st.one_of(_TEXT, st.lists(_TEXT, min_size=1, max_size=3)),
    "b": st.one_of(st.integers(0, 4), st.tuples(st.integers(0, 2), st.integers(1, 4))),
}


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


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[str], list[str], list[tuple[Any, ...]]]:
    """A random view (its GROUP BY columns and aggregates) and queries over it."""
    groups = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    aggregates = draw(st.lists(st.sampled_from(list(AGGREGATES)), min_size=1, unique=True))
    keep = st.none() | st.lists(st.sampled_from(groups), unique=True)
    where = st.lists(st.sampled_from(groups), unique=True, max_size=2).flatmap(
        lambda cols: st.fixed_dictionaries({c: _CONDITIONS[c] for c in cols})
    )
    queries = draw(st.lists(st.tuples(keep, where), min_size=1, max_size=4))
    return groups, aggregates, queries


@settings(
    max_examples=examples(6, 12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    case=_case(),
    rows=st.lists(_row, max_size=25),
    deletes=st.sets(st.integers(0, 24), max_size=6),
)
def test_rollups_slices_and_dices_equal_duckdb(
    client: Client,
    case: tuple[list[str], list[str], list[tuple[Any, ...]]],
    rows: list[tuple[str, int, str, int | None]],
    deletes: set[int],
) -> None:
    groups, aggregates, queries = case
    table = f"q_{uuid.uuid4().hex[:10]}"
    columns = "(id INT PRIMARY KEY, a TEXT, b INT, c TEXT, x INT)"
    client.sql(f"CREATE TABLE {table} {columns}")
    items = ", ".join([*groups, *(f"{AGGREGATES[n]} AS {n}" for n in aggregates)])
    client.sql(
        f"CREATE MATERIALIZED VIEW {table}_v AS SELECT {items} FROM {table} "
        f"GROUP BY {', '.join(groups)}"
    )
    db = duckdb.connect()
    db.execute(f"CREATE TABLE {table} {columns}")
    if rows:
        values = ", ".join(
            f"({i}, '{a}', {b}, '{c}', {'NULL' if x is None else x})"
            for i, (a, b, c, x) in enumerate(rows)
        )
        for target in (client.sql, db.execute):
            target(f"INSERT INTO {table} VALUES {values}")
    gone = [i for i in deletes if i < len(rows)]
    if gone:
        for target in (client.sql, db.execute):
            target(f"DELETE FROM {table} WHERE id IN ({', '.join(map(str, gone))})")
    for keep, where in queries:
        answer = client.query(f"{table}_v", where, rollup=keep)
        grouped = groups if keep is None else keep
        terms = " AND ".join(_sql_condition(c, w) for c, w in where.items())
        wanted = [AGGREGATES[n] for n in aggregates]
        sql = f"SELECT {', '.join([*grouped, *wanted, 'COUNT(*)'])} FROM {table}"
        sql += f" WHERE {terms}" if terms else ""
        sql += f" GROUP BY {', '.join(grouped)}" if grouped else ""
        expected = [
            tuple(_normal(v) for v in r[:-1])
            for r in db.execute(sql).fetchall()
            if r[-1]  # no rows at all: no group, here as in SQL
        ]
        got = [tuple(r[c] for c in [*grouped, *aggregates]) for r in answer]
        assert sorted(got, key=repr) == sorted(expected, key=repr), (groups, keep, where)


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
    client.sql(f"INSERT INTO {table_name} VALUES (1, 'p', 1), (2, 'p', 2), (3, 'q', 3)")
    assert [dict(r) for r in client.view(f"{table_name}_h")] == [{"a": "p", "n": 2}]  # no roll-up
    assert [dict(r) for r in client.query(f"{table_name}_h", {"a": ["p", "q"]})] == [
        {"a": "p", "n": 2}
    ]
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
    per_shop = (
        f"AS SELECT shop, SUM(amount) AS total, SUM(amount) / COUNT(*) AS mean "
        f"FROM {sales} GROUP BY shop"
    )
    client.sql(f"CREATE MATERIALIZED VIEW {table_name}_per_shop {per_shop}")
    db.execute(f"CREATE VIEW {table_name}_per_shop {per_shop}")
    queries = [
        f"SELECT s.city, COUNT(*) AS n, SUM(x.amount) AS total FROM {sales} x "
        f"JOIN {shops} s ON x.shop = s.id GROUP BY s.city ORDER BY s.city",
        f"SELECT shop, MAX(day) AS last FROM {sales} GROUP BY shop HAVING COUNT(*) > 5 "
        "ORDER BY shop",
        f"SELECT DISTINCT shop FROM {sales} WHERE amount > 5 ORDER BY shop",
        f"SELECT id, amount * 2 AS twice FROM {sales} WHERE id < 5 ORDER BY id",
        f"SELECT p.shop, p.total, s.city FROM {table_name}_per_shop p JOIN {shops} s "
        "ON p.shop = s.id ORDER BY p.shop",
        f"SELECT p.shop, s.city FROM {table_name}_per_shop p JOIN {shops} s "
        "ON p.shop = s.id WHERE p.mean > 4.5 ORDER BY p.shop",
    ]
    for sql in queries:
        got = client.sql(sql)
        assert [tuple(r.values()) for r in got] == db.execute(sql).fetchall(), sql
        assert "rows read" in got.message
    assert "reads the same tables" in client.sql(f"SELECT SUM(amount) FROM {sales}").message


def test_names_aliases_and_date_literals_as_sql_has_them(client: Client, table_name: str) -> None:
    """COUNT(*) is a column named count; ORDER BY takes an alias (or the aggregate) of a
    roll-up; DATE('1995-03-15') is a date literal in a view, a query and a write."""
    t = table_name
    client.sql(f"CREATE TABLE {t} (id INT PRIMARY KEY, cat INT, shop TEXT, cost INT, at DATE)")
    client.sql(
        f"INSERT INTO {t} VALUES (1, 1, 'n', 10, '1995-03-15'), (2, 2, 'n', 30, '1995-03-16'), "
        "(3, 1, 's', 5, DATE('1995-03-14'))"
    )
    counted = client.sql(f"SELECT COUNT(*), COUNT(*) AS rows_ FROM {t}")
    assert counted.columns == ["count", "rows_"] and list(counted[0].values()) == [3, 3]
    view = f"{t}_v"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} AS SELECT cat, shop, SUM(cost) AS cost FROM {t} "
        "WHERE at >= DATE('1995-03-15') GROUP BY cat, shop"
    )
    for order in ("c DESC", "SUM(cost) DESC"):
        rows = client.sql(f"SELECT cat, SUM(cost) AS c FROM {view} GROUP BY cat ORDER BY {order}")
        assert [(r["cat"], r["c"]) for r in rows] == [(2, 30), (1, 10)], order
    assert [r["id"] for r in client.sql(f"SELECT id FROM {t} WHERE at = DATE('1995-03-16')")] == [2]
    client.sql(f"DELETE FROM {t} WHERE at = DATE('1995-03-16')")
    assert [r["cat"] for r in client.sql(f"SELECT cat FROM {view}")] == [1]
