"""Read-only snapshot transactions: several reads (rows, scans, views, SQL, the query layer)
at one held timestamp while writers go on; as_of reads need a held snapshot."""

from __future__ import annotations

import asyncio

import pytest

from aggclient import Client
from aggclient.client import AsyncClient
from aggview import errors


def test_reads_in_a_snapshot_agree_while_writers_go_on(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT NOT NULL, v INT NOT NULL)")
    view = f"{table_name}_by_g"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} AS SELECT g, SUM(v) AS total FROM {table_name} GROUP BY g"
    )
    client.sql(f"INSERT INTO {table_name} VALUES (1, 'a', 5), (2, 'a', 7), (3, 'b', 1)")
    with client.snapshot() as snap:
        client.sql(f"INSERT INTO {table_name} VALUES (4, 'a', 100)")  # after the snapshot
        client.sql(f"UPDATE {table_name} SET v = 50 WHERE id = 3")
        rows = snap.scan(table_name)
        totals = {r["g"]: r["total"] for r in snap.view(view)}
        assert [r["id"] for r in rows] == [1, 2, 3] and rows.timestamp == snap.timestamp
        assert totals == {"a": 12, "b": 1}
        assert snap.get(table_name, {"id": 3}) == {"id": 3, "g": "b", "v": 1}
        assert [r["v"] for r in snap.sql(f"SELECT v FROM {table_name} WHERE id = 4")] == []
        assert [dict(r) for r in snap.query(view, rollup=[])] == [{"total": 13}]
        # the same reads now see the writes
        assert {r["g"]: r["total"] for r in client.view(view)} == {"a": 112, "b": 50}
    with pytest.raises(errors.FailedPrecondition, match="not held"):
        client.get(table_name, {"id": 1}, as_of=snap.timestamp)


def test_as_of_is_refused_where_it_cannot_hold(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY)")
    with client.snapshot() as snap:
        with pytest.raises(errors.InvalidArgument, match="as_of is for one SELECT"):
            client.sql(f"INSERT INTO {table_name} VALUES (1)", as_of=snap.timestamp)
        with pytest.raises(errors.InvalidArgument, match="in the future"):
            client.scan(table_name, as_of=snap.timestamp + 10**9)
    with pytest.raises(errors.FailedPrecondition, match="hold a snapshot first"):
        client.scan(table_name, as_of=1)
    assert client.scan(table_name) == []


def test_the_asyncio_client_reads_in_a_snapshot_too(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v INT NOT NULL)")
    client.sql(f"INSERT INTO {table_name} VALUES (1, 1)")

    async def main() -> tuple[list[int], list[int], int]:
        async with AsyncClient(client.address) as own:
            async with own.snapshot() as snap:
                await own.sql(f"UPDATE {table_name} SET v = 2 WHERE id = 1")
                inside = [r["v"] for r in await snap.scan(table_name)]
                row = await snap.get(table_name, {"id": 1})
                assert row is not None
            now = [r["v"] for r in await own.scan(table_name)]
            return inside, now, row["v"]

    assert asyncio.run(main()) == ([1], [2], 1)


def test_a_read_only_block_in_sql_reads_at_one_timestamp(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v INT NOT NULL)")
    view = f"{table_name}_total"
    client.sql(f"CREATE MATERIALIZED VIEW {view} AS SELECT SUM(v) AS total FROM {table_name}")
    client.sql(f"INSERT INTO {table_name} VALUES (1, 3), (2, 4)")
    block = client.sql(
        f"BEGIN READ ONLY; SELECT * FROM {table_name}; SELECT total FROM {view}; "
        f"SELECT COUNT(*) AS n FROM {table_name}; COMMIT;"
    )
    rows, total, count = block.results
    assert rows.timestamp == total.timestamp == count.timestamp == block.timestamp
    assert sum(r["v"] for r in rows) == total[0]["total"] == 7 and count[0]["n"] == 2
