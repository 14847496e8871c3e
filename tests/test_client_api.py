"""The client API end to end against a real cluster: every operation, every type, snapshots."""

from __future__ import annotations

import datetime
from decimal import Decimal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggclient import Client, ConditionFailed
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.errors import RowNotFound
from aggview.net import GRPC_OPTIONS
from tests.chaos_proxy import ChaosProxy


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


def test_sql_reads_take_signed_and_exponent_literals_of_every_type(
    client: Client, table_name: str
) -> None:
    """One literal parser (cumulus.sqltext) reads every WHERE: -1.50 is the same DECIMAL the
    view compiler reads, 1e1 fits an INT key, -2.5e0 a DECIMAL, +3 a FLOAT."""
    client.sql(
        f"CREATE TABLE {table_name} (k INT, d DECIMAL(8,2), f FLOAT, day DATE, ok BOOL, "
        "label TEXT, PRIMARY KEY (k, d))"
    )
    rows = [
        (-10, Decimal("-1.50"), -0.25, "2024-02-29", True, "a"),
        (10, Decimal("-2.50"), 3.0, "2024-03-01", False, "b"),
        (7, Decimal("150.00"), 1500.0, "2023-12-31", True, "-x"),
    ]
    with client.transaction() as tx:
        for k, d, f, day, ok, label in rows:
            tx.insert(table_name, {"k": k, "d": d, "f": f, "day": day, "ok": ok, "label": label})

    def labels(where: str) -> list[str]:
        return sorted(r["label"] for r in client.sql(f"SELECT label FROM {table_name} {where}"))

    assert labels("WHERE d = -1.50") == ["a"]
    assert labels("WHERE k = -10 AND d = -1.5") == ["a"]
    assert labels("WHERE k = -(10) AND d = -(-(-1.50))") == ["a"]
    assert labels("WHERE k = 1e1") == ["b"]
    assert labels("WHERE k = 10.0 AND d = -2.5e0") == ["b"]
    assert labels("WHERE d = 1.5E+2") == ["-x"]
    assert labels("WHERE f = -0.25") == ["a"]
    assert labels("WHERE f = +3") == ["b"]
    assert labels("WHERE f = 1.5e3") == ["-x"]
    assert labels("WHERE day = '2024-02-29'") == ["a"]
    assert labels("WHERE day = DATE '2023-12-31'") == ["-x"]
    assert labels("WHERE ok = FALSE") == ["b"]
    assert labels("WHERE label = '-x'") == ["-x"]
    with pytest.raises(errors.InvalidArgument, match=r"\.d is DECIMAL\(8,2\).*1\.505"):
        labels("WHERE d = 1.505")  # more digits than the column keeps
    with pytest.raises(errors.InvalidArgument, match="LIMIT takes a whole number"):
        client.sql(f"SELECT * FROM {table_name} LIMIT -1")
    with pytest.raises(errors.InvalidArgument, match="unary minus"):
        client.sql(f"SELECT * FROM {table_name} WHERE label = -'x'")
    with pytest.raises(errors.InvalidArgument, match=r"\.k is INT; got Decimal 1\.5"):
        client.sql(f"SELECT * FROM {table_name} WHERE k = 1.5")


def test_a_server_slow_to_answer_a_new_connection_is_waited_for(
    cluster: LocalCluster, table_name: str
) -> None:
    """A busy machine delays a server's first HTTP/2 frame by hundreds of milliseconds: a new
    channel (the servers' to each other, a client's) waits for it and its calls succeed. (A
    100 ms connect timeout, which ``grpc.min_reconnect_backoff_ms`` really is, failed them as
    unavailable: "connection attempt timed out before receiving SETTINGS frame".)"""
    proxy = ChaosProxy(cluster.address).start()
    proxy.set_delay(0.25)  # each chunk either way, the server's SETTINGS frame first
    try:
        with grpc.insecure_channel(proxy.address, options=GRPC_OPTIONS) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=20
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with Client(proxy.address, timeout=20) as client:
            client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")
            with client.transaction() as tx:
                tx.insert(table_name, {"id": 1, "n": 1})
            assert client.get(table_name, {"id": 1}) == {"id": 1, "n": 1}
    finally:
        proxy.close()
