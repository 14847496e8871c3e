"""Bad input gets a clear status naming the problem; nothing is applied; the servers stay up."""

from __future__ import annotations

import datetime
from decimal import Decimal

import grpc
import pytest

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.wire import client_pb2 as pb


@pytest.fixture
def accounts(client: Client, table_name: str) -> str:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, balance DECIMAL(12,2) NOT NULL)")
    with client.transaction() as tx:
        for i in range(5):
            tx.insert(table_name, {"id": i, "balance": Decimal("10")})
    return table_name


def assert_intact(client: Client, table: str, cluster: LocalCluster) -> None:
    assert all(server.running() for server in cluster.servers)
    rows = client.scan(table)
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4]
    assert sum(r["balance"] for r in rows) == Decimal("50.00")


CASES = [
    (
        "unknown table",
        lambda t: lambda tx: tx.insert("nope", {"id": 1}),
        errors.UnknownTable,
        "unknown table 'nope'",
    ),
    (
        "unknown column",
        lambda t: lambda tx: tx.insert(t, {"id": 9, "balance": 1, "colour": "red"}),
        errors.InvalidArgument,
        "colour",
    ),
    (
        "wrong type",
        lambda t: lambda tx: tx.insert(t, {"id": 9, "balance": "ten"}),
        errors.InvalidArgument,
        "balance is DECIMAL",
    ),
    (
        "inexact decimal",
        lambda t: lambda tx: tx.insert(t, {"id": 9, "balance": Decimal("1.001")}),
        errors.InvalidArgument,
        "balance",
    ),
    (
        "missing primary key",
        lambda t: lambda tx: tx.insert(t, {"balance": 1}),
        errors.InvalidArgument,
        "id",
    ),
    (
        "NOT NULL",
        lambda t: lambda tx: tx.insert(t, {"id": 9, "balance": None}),
        errors.InvalidArgument,
        "NOT NULL",
    ),
    (
        "duplicate insert",
        lambda t: lambda tx: tx.insert(t, {"id": 1, "balance": 1}),
        errors.AlreadyExists,
        "id=1",
    ),
    (
        "update of a missing row",
        lambda t: lambda tx: tx.update(t, {"id": 99}, {"balance": 1}),
        errors.RowNotFound,
        "id=99",
    ),
    (
        "delete of a missing row",
        lambda t: lambda tx: tx.delete(t, {"id": 99}),
        errors.RowNotFound,
        "id=99",
    ),
    (
        "update of the key",
        lambda t: lambda tx: tx.update(t, {"id": 1}, {"id": 2}),
        errors.InvalidArgument,
        "primary-key column",
    ),
    (
        "add to overflow",
        lambda t: lambda tx: tx.add(t, {"id": 1}, {"balance": Decimal("9999999999")}),
        errors.InvalidArgument,
        "overflow",
    ),
    (
        "bad condition op",
        lambda t: lambda tx: tx.delete(t, {"id": 1}, require={"balance": ("~", 1)}),
        errors.InvalidArgument,
        "require",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_operation(client: Client, accounts: str, cluster: LocalCluster, case) -> None:  # type: ignore[no-untyped-def]
    _, build, error, fragment = case
    with pytest.raises(error, match=fragment):
        with client.transaction() as tx:
            tx.add(accounts, {"id": 0}, {"balance": 5})  # a good operation that must not apply
            build(accounts)(tx)
    assert_intact(client, accounts, cluster)


def test_oversized_transaction(client: Client, accounts: str, cluster: LocalCluster) -> None:
    with pytest.raises(errors.LimitExceeded, match="10000"):
        with client.transaction() as tx:
            for i in range(10_001):
                tx.insert(accounts, {"id": 100 + i, "balance": 1})
    assert_intact(client, accounts, cluster)


def test_oversized_value(client: Client, table_name: str, cluster: LocalCluster) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, body TEXT)")
    with pytest.raises(errors.LimitExceeded, match="byte limit"):
        with client.transaction() as tx:
            tx.insert(table_name, {"id": 1, "body": "x" * (2 * 1024 * 1024)})
    with pytest.raises(errors.LimitExceeded):  # over the request size: refused by gRPC itself
        with client.transaction() as tx:
            tx.insert(table_name, {"id": 1, "body": "x" * (20 * 1024 * 1024)})
    assert client.scan(table_name) == []
    assert all(server.running() for server in cluster.servers)


def test_malformed_request(cluster: LocalCluster, client: Client, accounts: str) -> None:
    channel = grpc.insecure_channel(cluster.address)
    raw = channel.unary_unary("/aggview.v1.Aggview/Commit")
    with pytest.raises(grpc.RpcError) as failure:
        raw(b"\xff\xff\xff\xff garbage", timeout=10)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request" in (failure.value.details() or "")
    with pytest.raises(grpc.RpcError) as failure:
        raw(pb.CommitRequest().SerializeToString(), timeout=10)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    assert_intact(client, accounts, cluster)


@pytest.mark.parametrize(
    "sql, fragment",
    [
        ("CREATE TABLE x (id INT)", "PRIMARY KEY"),
        ("CREATE TABLE x (id BLOB PRIMARY KEY)", "unsupported column type"),
        ("CREATE TABLE x (id INT PRIMARY KEY, id TEXT)", "two columns"),
        ("SELEC * FROM x", "syntax error near .SELEC."),
        ("MERGE INTO x USING y ON x.a = y.a WHEN MATCHED THEN DELETE", "unsupported SQL"),
        ("UPDATE x SET a = 1", "unknown table 'x'"),
        ("SELECT * FROM x; SELECT 1", "one SQL statement"),
        ("SELECT * FROM {t} a JOIN read_csv('/etc/passwd') b ON true", "unsupported source"),
        ("SELECT * FROM {t} WHERE nope = 1", "no column 'nope'"),
        ("SELECT * FROM {t} WHERE id = 'x'", "id is INT"),
        ("SELECT * FROM missing", "unknown table"),
    ],
)
def test_bad_sql(client: Client, accounts: str, sql: str, fragment: str) -> None:
    with pytest.raises(errors.AggviewError, match=fragment):
        client.sql(sql.format(t=accounts))


def test_create_existing_and_drop(client: Client, accounts: str) -> None:
    with pytest.raises(errors.AlreadyExists, match=accounts):
        client.sql(f"CREATE TABLE {accounts} (id INT PRIMARY KEY)")
    client.sql(f"CREATE TABLE IF NOT EXISTS {accounts} (id INT PRIMARY KEY)")
    client.sql(f"DROP TABLE {accounts}")
    with pytest.raises(errors.UnknownTable):
        client.scan(accounts)
    with pytest.raises(errors.UnknownTable):
        client.sql(f"DROP TABLE {accounts}")
    client.sql(f"DROP TABLE IF EXISTS {accounts}")
    # a new table of the same name starts empty
    client.sql(f"CREATE TABLE {accounts} (id INT PRIMARY KEY)")
    assert client.scan(accounts) == []


def test_client_side_type_error(client: Client, accounts: str) -> None:
    with pytest.raises(errors.TypeMismatch, match="unsupported value"):
        with client.transaction() as tx:
            tx.insert(accounts, {"id": 7, "balance": [1, 2]})


@pytest.mark.parametrize(
    "value, why",
    [
        ([1, 2], "unsupported value"),
        (datetime.datetime(2024, 1, 1, 12), "is a datetime"),
        (2**64, "does not fit in 64 bits"),
        (-(2**63) - 1, "does not fit in 64 bits"),
        (b"10", "unsupported value"),
    ],
)
def test_every_client_side_type_error_names_the_column(
    client: Client, accounts: str, value: object, why: str
) -> None:
    for write in (
        lambda tx: tx.insert(accounts, {"id": 7, "balance": value}),
        lambda tx: tx.update(accounts, {"id": 1}, {"balance": value}),
        lambda tx: tx.add(accounts, {"id": value}, {"balance": 1}),
    ):
        with pytest.raises(
            errors.TypeMismatch, match=f"^column {accounts}\\.(balance|id): .*{why}"
        ):
            with client.transaction() as tx:
                write(tx)
    with pytest.raises(errors.InvalidArgument, match=f"column {accounts}.id: .*64 bits"):
        client.sql(f"INSERT INTO {accounts} VALUES ({2**64}, 1)")
