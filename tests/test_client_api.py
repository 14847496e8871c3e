"""The client API end to end against a real cluster: every operation, every type, snapshots."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest

from aggview.errors import RowNotFound
from coordinator import Client, ConditionFailed


def make_accounts(client: Client, name: str, count: int = 10) -> None:
    client.sql(
        f"CREATE TABLE {name} (id INT PRIMARY KEY, owner TEXT NOT NULL, balance DECIMAL(12,2))"
    )
    with client.transaction() as tx:
        for i in range(count):
            tx.insert(name, {"id": i, "owner": f"owner-{i}", "balance": Decimal("100.00")})


def test_insert_get_scan_update_add_delete(client: Client, table_name: str) -> None:
    make_accounts(client, table_name)
    row = client.get(table_name, {"id": 3})
    assert row == {"id": 3, "owner": "owner-3", "balance": Decimal("100.00")}
    assert row.timestamp > 0

    with client.transaction() as tx:
        tx.update(table_name, {"id": 3}, {"owner": "carol"})
        tx.add(table_name, {"id": 4}, {"balance": Decimal("-0.50")})
        tx.delete(table_name, {"id": 5})
    assert tx.timestamp is not None and tx.timestamp >= row.timestamp

    assert client.get(table_name, {"id": 3})["owner"] == "carol"
    assert client.get(table_name, {"id": 4})["balance"] == Decimal("99.50")
    assert client.get(table_name, {"id": 5}) is None

    rows = client.scan(table_name)
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4, 6, 7, 8, 9]  # key order across LTMs
    assert rows.timestamp >= tx.timestamp
    assert client.scan(table_name, limit=2) == rows[:2]


def test_condition_failure_applies_nothing(client: Client, table_name: str) -> None:
    make_accounts(client, table_name)
    with pytest.raises(ConditionFailed) as failure:
        with client.transaction() as tx:
            tx.add(table_name, {"id": 1}, {"balance": Decimal("50")})  # would apply alone
            tx.add(
                table_name,
                {"id": 2},
                {"balance": Decimal("-500")},
                require={"balance": (">=", Decimal("500"))},
            )
    message = str(failure.value)
    assert table_name in message and "id=2" in message and "100.00" in message
    assert sum(r["balance"] for r in client.scan(table_name)) == Decimal("1000.00")


def test_conditions_see_the_row_before_the_transaction(client: Client, table_name: str) -> None:
    make_accounts(client, table_name, 2)
    with client.transaction() as tx:
        tx.update(table_name, {"id": 0}, {"balance": Decimal("1")})
        tx.add(table_name, {"id": 0}, {"balance": Decimal("2")}, require={"balance": ("==", 100)})
    assert client.get(table_name, {"id": 0})["balance"] == Decimal("3.00")


def test_every_type_round_trips(client: Client, table_name: str) -> None:
    client.sql(
        f"CREATE TABLE {table_name} (k TEXT, d DATE, i INT, dec DECIMAL(20,4), f FLOAT, "
        "t TEXT, b BOOL, PRIMARY KEY (k, d))"
    )
    row = {
        "k": "naïve \x00 key",
        "d": datetime.date(1969, 7, 20),
        "i": -(2**63),
        "dec": Decimal("-1234567890123456.7890"),
        "f": 0.1,
        "t": "",
        "b": False,
    }
    with client.transaction() as tx:
        tx.insert(table_name, row)
        tx.insert(table_name, {"k": "b", "d": "2026-11-22", "i": 1, "dec": 7, "b": True})
    assert client.get(table_name, {"k": row["k"], "d": row["d"]}) == row
    other = client.get(table_name, {"k": "b", "d": datetime.date(2026, 11, 22)})
    assert other == {
        "k": "b",
        "d": datetime.date(2026, 11, 22),
        "i": 1,
        "dec": Decimal("7.0000"),
        "f": None,
        "t": None,
        "b": True,
    }


def test_prefix_scan_on_composite_key(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (shop TEXT, n INT, v INT, PRIMARY KEY (shop, n))")
    with client.transaction() as tx:
        for shop in ("a", "ab", "b"):
            for n in (3, 1, 2):
                tx.insert(table_name, {"shop": shop, "n": n, "v": n})
    rows = client.scan(table_name, {"shop": "a"})
    assert [(r["shop"], r["n"]) for r in rows] == [("a", 1), ("a", 2), ("a", 3)]
    assert client.scan(table_name, {"shop": "ab", "n": 2}) == [{"shop": "ab", "n": 2, "v": 2}]


def test_missing_row_errors_name_the_row(client: Client, table_name: str) -> None:
    make_accounts(client, table_name, 1)
    with pytest.raises(RowNotFound, match=rf"{table_name}.*id=42"):
        with client.transaction() as tx:
            tx.update(table_name, {"id": 42}, {"owner": "x"})


def test_sql_reads(client: Client, table_name: str) -> None:
    make_accounts(client, table_name, 3)
    rows = client.sql(f"SELECT owner, balance FROM {table_name} WHERE id = 2")
    assert rows == [{"owner": "owner-2", "balance": Decimal("100.00")}]
    assert rows.columns == ["owner", "balance"]
    assert len(client.sql(f"SELECT * FROM {table_name} LIMIT 2")) == 2
