"""SQL writes (INSERT, UPDATE, DELETE, BEGIN … COMMIT) and SQL reads of views.

Random statements run both here and in duckdb; the table and a sync view over it must equal
duckdb's after every statement, and a statement fails here exactly when it fails there.
Concurrent UPDATEs of one row lose nothing; a transaction with a failing statement applies
nothing; what is not supported is refused naming the construct."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples

from aggclient import Client
from aggview import errors

GROUPS = ["a", "b", "c"]


def _table(client: Client, name: str) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["g"], r["v"]) for r in client.scan(name))


def _view(client: Client, name: str) -> list[tuple[Any, ...]]:
    return sorted((r["g"], r["total"], r["n"]) for r in client.sql(f"SELECT * FROM {name}"))


def test_sql_writes_match_the_python_client(client: Client, table_name: str) -> None:
    sql_table, api_table = f"{table_name}_sql", f"{table_name}_api"
    for name in (sql_table, api_table):
        client.sql(f"CREATE TABLE {name} (id INT PRIMARY KEY, g TEXT, v INT, d DECIMAL(8,2))")
    client.sql(
        f"INSERT INTO {sql_table} VALUES (1, 'a', 5, 1.25), (2, 'b', NULL, 0); "
        f"INSERT INTO {sql_table} (id, g) VALUES (3, 'c')"
    )
    with client.transaction() as tx:
        tx.insert(api_table, {"id": 1, "g": "a", "v": 5, "d": Decimal("1.25")})
        tx.insert(api_table, {"id": 2, "g": "b", "v": None, "d": Decimal("0")})
    with client.transaction() as tx:
        tx.insert(api_table, {"id": 3, "g": "c"})
    said = client.sql(f"UPDATE {sql_table} SET v = v + 2, d = 9.5 WHERE id = 1").message
    assert said.startswith("UPDATE 1 at timestamp")
    with client.transaction() as tx:
        tx.update(api_table, {"id": 1}, {"v": 7, "d": Decimal("9.5")})
    assert client.sql(f"DELETE FROM {sql_table} WHERE v IS NULL").message.startswith("DELETE 2")
    with client.transaction() as tx:
        tx.delete(api_table, {"id": 2})
        tx.delete(api_table, {"id": 3})
    assert client.scan(sql_table) == client.scan(api_table)
    assert client.sql(f"UPDATE {sql_table} SET v = 1 WHERE id = 99").message.startswith("UPDATE 0")


def test_a_transaction_with_a_failing_statement_applies_nothing(
    client: Client, table_name: str
) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v INT NOT NULL)")
    client.sql(f"INSERT INTO {table_name} VALUES (1, 10)")
    with pytest.raises(errors.AlreadyExists, match="already exists"):
        client.sql(
            f"BEGIN; UPDATE {table_name} SET v = 0 WHERE id = 1; "
            f"INSERT INTO {table_name} VALUES (2, 20); INSERT INTO {table_name} VALUES (1, 30); "
            "COMMIT;"
        )
    said = client.sql(f"BEGIN; DELETE FROM {table_name}; ROLLBACK;").message
    assert said == "ROLLBACK: nothing applied"
    assert client.scan(table_name) == [{"id": 1, "v": 10}]
    said = client.sql(
        f"BEGIN; UPDATE {table_name} SET v = v - 1; INSERT INTO {table_name} VALUES (2, 20); "
        "COMMIT;"
    ).message
    assert said.startswith("COMMIT UPDATE 1, INSERT 1 at timestamp")
    assert _rows(client.scan(table_name)) == [(1, 9), (2, 20)]


def each_refused(client: Client, refusals: dict[str, str]) -> None:
    """Each statement fails with an error whose message matches its pattern."""
    for sql, problem in refusals.items():
        with pytest.raises(errors.AggviewError, match=problem):
            client.sql(sql)


def _rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in rows)


def test_concurrent_updates_of_one_row_lose_nothing(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT, n INT NOT NULL)")
    client.sql(f"INSERT INTO {table_name} VALUES (1, 'x', 0), (2, 'y', 0)")
    address = client.address

    def bump() -> None:
        with Client(address) as own:
            for _ in range(15):  # a WHERE that is not the key: the read-then-write path
                own.sql(f"UPDATE {table_name} SET n = n + 1 WHERE g = 'x'")

    workers = [threading.Thread(target=bump) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert client.get(table_name, {"id": 1})["n"] == 60  # type: ignore[index]
    assert client.get(table_name, {"id": 2})["n"] == 0  # type: ignore[index]


def test_a_dimension_rewritten_by_a_where_reaches_the_join_view(
    client: Client, table_name: str
) -> None:
    """An UPDATE whose WHERE is not the key writes rows the coordinator caches for view
    lookups: the next insert must join with the new row, not the cached old one."""
    t = table_name
    client.sql(f"CREATE TABLE {t}_p (id INT PRIMARY KEY, cat INT, name TEXT)")
    client.sql(f"CREATE TABLE {t} (id INT PRIMARY KEY, prod INT, cost INT)")
    client.sql(f"INSERT INTO {t}_p VALUES (1, 10, 'a'), (2, 20, 'b')")
    client.sql(
        f"CREATE MATERIALIZED VIEW {t}_v AS SELECT p.cat, SUM(e.cost) AS s, COUNT(*) AS n "
        f"FROM {t} e JOIN {t}_p p ON e.prod = p.id GROUP BY p.cat"
    )
    client.sql(f"INSERT INTO {t} VALUES (1, 1, 5)")
    client.sql(f"UPDATE {t}_p SET cat = 30 WHERE name = 'a'")
    client.sql(f"INSERT INTO {t} VALUES (2, 1, 7)")
    assert sorted((r["cat"], r["s"], r["n"]) for r in client.view(f"{t}_v")) == [(30, 12, 2)]


def test_bad_writes_are_refused_naming_the_problem(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v INT)")
    client.sql(f"CREATE MATERIALIZED VIEW {table_name}_n AS SELECT COUNT(*) AS n FROM {table_name}")
    refusals = {
        f"INSERT INTO {table_name}_n VALUES (1)": "is a materialized view",
        f"UPDATE {table_name} SET id = 2 WHERE id = 1": "primary-key column",
        f"UPDATE {table_name} SET v = v * 2": "unsupported SET v = v \\* 2",
        f"DELETE FROM {table_name} WHERE v LIKE '1%'": "unsupported condition",
        f"INSERT INTO {table_name} VALUES (1)": "1 values for 2 columns",
        f"INSERT INTO {table_name} SELECT * FROM {table_name}": "not a query",
        f"BEGIN; INSERT INTO {table_name} VALUES (1, 1);": "BEGIN without COMMIT",
        "COMMIT": "COMMIT without BEGIN",
        f"BEGIN READ ONLY; INSERT INTO {table_name} VALUES (2, 2); COMMIT;": "SELECTs only",
        f"INSERT INTO {table_name} VALUES (1, 1); SELECT * FROM {table_name}": "SELECT among",
        f"INSERT INTO nowhere_{table_name} VALUES (1)": "unknown table",
    }
    each_refused(client, refusals)
    assert client.scan(table_name) == []
    assert [r["n"] for r in client.sql(f"SELECT n FROM {table_name}_n")] == [0]


# ----------------------------------------------------------------------------- differential

_value = st.one_of(st.none(), st.integers(-5, 9))
_where = st.one_of(
    st.builds(lambda i: f"id = {i}", st.integers(0, 12)),
    st.builds(lambda g: f"g = '{g}'", st.sampled_from(GROUPS)),
    st.builds(lambda v: f"v > {v}", st.integers(-5, 9)),
    st.builds(lambda a, b: f"id BETWEEN {a} AND {b}", st.integers(0, 6), st.integers(4, 12)),
    st.just("v IS NULL"),
    st.builds(lambda g, i: f"(g = '{g}' OR id < {i})", st.sampled_from(GROUPS), st.integers(0, 9)),
)


def _sql_value(v: int | None) -> str:
    return "NULL" if v is None else str(v)


@st.composite
def _statement(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["insert", "insert", "update", "add", "delete"]))
    if kind == "insert":
        rows = draw(
            st.lists(
                st.tuples(st.integers(0, 12), st.sampled_from(GROUPS), _value),
                min_size=1,
                max_size=3,
                unique_by=lambda r: r[0],
            )
        )
        values = ", ".join(f"({i}, '{g}', {_sql_value(v)})" for i, g, v in rows)
        return f"INSERT INTO {{t}} VALUES {values}"
    where = draw(_where)
    if kind == "update":
        group = draw(st.sampled_from(GROUPS))
        return f"UPDATE {{t}} SET g = '{group}', v = {_sql_value(draw(_value))} WHERE {where}"
    if kind == "add":
        return (
            f"UPDATE {{t}} SET v = v + {draw(st.integers(-3, 3))} WHERE v IS NOT NULL AND {where}"
        )
    return f"DELETE FROM {{t}} WHERE {where}"


@st.composite
def _dimension_statement(draw: st.DrawFn) -> str:
    """A write to the dimension table ``{t}_d`` (g -> region) that the join view looks up: by
    key, or by another column (read at the transaction's timestamp, then written)."""
    group, region = draw(st.sampled_from(GROUPS)), draw(st.integers(1, 3))
    return draw(
        st.sampled_from(
            [
                f"INSERT INTO {{t}}_d VALUES ('{group}', {region})",
                f"UPDATE {{t}}_d SET region = {region} WHERE g = '{group}'",
                f"UPDATE {{t}}_d SET region = {region} WHERE region = {draw(st.integers(1, 3))}",
                f"UPDATE {{t}}_d SET region = region + 1 WHERE region < {region}",
                f"DELETE FROM {{t}}_d WHERE region = {region}",
            ]
        )
    )


@settings(
    max_examples=examples(6, 12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(
        st.lists(
            st.one_of(_statement(), _statement(), _dimension_statement()), min_size=1, max_size=3
        ),
        min_size=1,
        max_size=6,
    )
)
def test_random_sql_writes_equal_duckdb(client: Client, batches: list[list[str]]) -> None:
    """Each batch runs as BEGIN …; COMMIT; when it has several statements. A second sync view
    joins a dimension table that some statements rewrite (its rows are looked up, and cached,
    by the coordinator)."""
    import uuid

    table = f"w_{uuid.uuid4().hex[:10]}"
    client.sql(f"CREATE TABLE {table} (id INT PRIMARY KEY, g TEXT, v INT)")
    client.sql(f"CREATE TABLE {table}_d (g TEXT PRIMARY KEY, region INT)")
    client.sql(f"INSERT INTO {table}_d VALUES ('a', 1), ('b', 1), ('c', 2)")
    client.sql(
        f"CREATE MATERIALIZED VIEW {table}_by_g AS SELECT g, SUM(v) AS total, COUNT(*) AS n "
        f"FROM {table} GROUP BY g"
    )
    joined = (
        f"SELECT d.region, SUM(t.v) AS total, COUNT(*) AS n FROM {table} t "
        f"JOIN {table}_d d ON t.g = d.g GROUP BY d.region"
    )
    client.sql(f"CREATE MATERIALIZED VIEW {table}_by_region AS {joined}")
    try:
        db = duckdb.connect()
        db.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, g TEXT, v INT)")
        db.execute(f"CREATE TABLE {table}_d (g TEXT PRIMARY KEY, region INT)")
        db.execute(f"INSERT INTO {table}_d VALUES ('a', 1), ('b', 1), ('c', 2)")
        for batch in batches:
            statements = [s.format(t=table) for s in batch]
            sql = "; ".join(statements)
            if len(statements) > 1:
                sql = f"BEGIN; {sql}; COMMIT;"
            ours: Exception | None = None
            try:
                client.sql(sql)
            except errors.AggviewError as exc:
                ours = exc
            theirs: Exception | None = None
            db.execute("BEGIN")
            try:
                for statement in statements:
                    db.execute(statement)
                db.execute("COMMIT")
            except duckdb.Error as exc:
                db.execute("ROLLBACK")
                theirs = exc
            assert (ours is None) == (theirs is None), (sql, ours, theirs)
            assert _table(client, table) == sorted(db.execute(f"SELECT * FROM {table}").fetchall())
            expected = db.execute(
                f"SELECT g, SUM(v), COUNT(*) FROM {table} GROUP BY g ORDER BY g"
            ).fetchall()
            assert _view(client, f"{table}_by_g") == sorted(expected), sql
            by_region = sorted(
                (r["region"], r["total"], r["n"]) for r in client.view(f"{table}_by_region")
            )
            assert by_region == sorted(db.execute(joined).fetchall()), sql
    finally:
        for view in (f"{table}_by_g", f"{table}_by_region"):
            client.sql(f"DROP MATERIALIZED VIEW {view}")
        client.sql(f"DROP TABLE {table}")
        client.sql(f"DROP TABLE {table}_d")
