"""The AsyncClient's Transact stream: many transactions of one client on one stream, each
answered on its own with what a Commit call would have said, the stream surviving failed
transactions, and a new stream after the coordinator restarts."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

import grpc
import pytest

from aggclient import Client
from aggclient.aio import STREAM_MESSAGE_BYTES
from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.values import to_row
from aggview.wire import client_pb2 as pb


async def _outcomes(address: str, table: str) -> list[object]:
    """Eight transactions at once on one stream: four commit, four fail each its own way."""
    async with AsyncClient(address) as client:

        async def run(build) -> object:  # type: ignore[no-untyped-def]
            async with client.transaction() as tx:
                build(tx)
            return tx.timestamp

        cases = [
            lambda tx: tx.add(table, {"id": 1}, {"n": 1}),
            lambda tx: tx.insert(table, {"id": 1, "n": 0}),  # exists
            lambda tx: tx.add(table, {"id": 2}, {"n": 1}),
            lambda tx: tx.update(table, {"id": 99}, {"n": 1}),  # missing
            lambda tx: tx.add(table, {"id": 3}, {"n": 1}),
            lambda tx: tx.add(table, {"id": 3}, {"n": 5}, require={"n": (">", 100)}),
            lambda tx: tx.add(table, {"id": 4}, {"n": 1}),
            lambda tx: tx.insert("no_such_table", {"id": 1}),
        ]
        return await asyncio.gather(*(run(c) for c in cases), return_exceptions=True)


def test_each_transaction_on_the_stream_gets_its_own_answer(
    client: Client, table_name: str
) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")
    with client.transaction() as tx:
        for i in range(1, 5):
            tx.insert(table_name, {"id": i, "n": 0})
    outcomes = asyncio.run(_outcomes(client.address, table_name))
    committed = outcomes[0::2]
    assert all(isinstance(ts, int) and ts > 0 for ts in committed), outcomes
    assert len(set(committed)) == 4
    assert isinstance(outcomes[1], errors.AlreadyExists) and "id=1" in str(outcomes[1])
    assert isinstance(outcomes[3], errors.RowNotFound) and "id=99" in str(outcomes[3])
    assert isinstance(outcomes[5], errors.ConditionFailed) and "id=3" in str(outcomes[5])
    assert isinstance(outcomes[7], errors.UnknownTable)
    assert "no_such_table" in str(outcomes[7])
    assert [r["n"] for r in client.scan(table_name)] == [1, 1, 1, 1]  # the failures left nothing


def test_a_malformed_message_ends_only_its_stream(client: Client, table_name: str) -> None:
    """Bytes that are no TransactRequests: INVALID_ARGUMENT naming it; the server stays up."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")
    with grpc.insecure_channel(client.address) as channel:
        call = channel.stream_stream("/aggview.v1.Aggview/Transact")
        with pytest.raises(grpc.RpcError) as failure:
            list(call(iter([b"\xff\xff\xff"]), timeout=30))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed request" in (failure.value.details() or "")
    with client.transaction() as tx:
        tx.insert(table_name, {"id": 1, "n": 1})
    assert client.get(table_name, {"id": 1}) == {"id": 1, "n": 1}


def test_a_typed_stream_answers_by_id(client: Client, table_name: str) -> None:
    """The wire contract without the client library: ids echo, codes are grpc.StatusCode."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")
    row = to_row({"id": 7, "n": 1})
    insert = pb.Operation(kind=pb.Operation.INSERT, table=table_name, values=row)
    message = pb.TransactRequests(
        requests=[
            pb.TransactRequest(id=41, operations=[insert]),
            pb.TransactRequest(id=42, operations=[insert]),  # the same row again
        ]
    )
    with grpc.insecure_channel(client.address) as channel:
        call = channel.stream_stream(
            "/aggview.v1.Aggview/Transact",
            request_serializer=pb.TransactRequests.SerializeToString,
            response_deserializer=pb.TransactReplies.FromString,
        )
        replies = {r.id: r for m in call(iter([message]), timeout=30) for r in m.replies}
    assert set(replies) == {41, 42}
    first, second = sorted(replies.values(), key=lambda r: r.timestamp or 2**64)
    assert first.code == 0 and first.timestamp > 0  # one of them inserted the row
    assert second.code == grpc.StatusCode.ALREADY_EXISTS.value[0] and second.timestamp == 0
    assert "already exists" in second.message
    assert client.get(table_name, {"id": 7}) == {"id": 7, "n": 1}


def test_a_new_stream_after_the_coordinator_restarts(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "data", ltms=2) as cluster:

        async def run() -> tuple[int, int]:
            async with AsyncClient(cluster.address, timeout=30) as client:
                await client.sql("CREATE TABLE acc (id INT PRIMARY KEY, v DECIMAL(10,2))")
                async with client.transaction() as tx:
                    tx.insert("acc", {"id": 1, "v": Decimal("1.50")})
                before = tx.timestamp
                cluster.coordinator.stop()  # the client's stream ends with it
                cluster.coordinator.start()
                for _ in range(50):  # the first try may still meet the old stream
                    try:
                        async with client.transaction() as tx:
                            tx.add("acc", {"id": 1}, {"v": Decimal("1.00")})
                        break
                    except errors.Unavailable:
                        await asyncio.sleep(0.1)
                assert (await client.get("acc", {"id": 1})) == {"id": 1, "v": Decimal("2.50")}
                return before, tx.timestamp

        before, after = asyncio.run(run())
        assert after > before


def test_closing_a_client_leaves_no_task_of_it_pending(client: Client, table_name: str) -> None:
    """On a loop run by hand (as the benchmarks do), whatever is still pending when the loop
    closes is 'destroyed but pending': closing the client must have finished its own tasks."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")

    async def use_and_close() -> list[asyncio.Task]:
        own = AsyncClient(client.address)
        for i in range(5):
            async with own.transaction() as tx:
                tx.insert(table_name, {"id": i, "n": i})
        await asyncio.gather(*(own.get(table_name, {"id": i}) for i in range(5)))
        await own.close()
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    loop = asyncio.new_event_loop()
    try:
        left = loop.run_until_complete(use_and_close())
    finally:
        loop.close()
    assert [t for t in left if not t.done()] == [], left


def test_transactions_racing_to_a_member_at_first_use_leave_no_task_pending(
    client: Client, table_name: str
) -> None:
    """Many transactions at once on a fresh client, routed to members it has no stream to yet:
    each member gets one stream, and closing the client finishes all of them (two tasks that
    each opened one had the second replace the first, whose reader outlived the loop:
    'Task was destroyed but it is pending!' at the end of the demo's benchmark)."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")

    async def race_and_close(first: int) -> tuple[list[asyncio.Task], int]:
        own = AsyncClient(client.address)

        async def one(i: int) -> None:
            async with own.transaction() as tx:
                tx.insert(table_name, {"id": i, "n": i})

        await asyncio.gather(*(one(i) for i in range(first, first + 32)))
        members = len(own._members)
        await own.close()
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()], members

    for round in range(3):
        loop = asyncio.new_event_loop()
        try:
            left, members = loop.run_until_complete(race_and_close(32 * round))
        finally:
            loop.close()
        assert members >= 1  # the rows went to members other than the address given
        assert [t for t in left if not t.done()] == [], left


def test_a_transaction_too_big_to_share_the_stream_goes_by_its_own_call(
    client: Client, table_name: str
) -> None:
    """Over ``STREAM_MESSAGE_BYTES`` a transaction is a Commit call of its own, beside small
    ones on the stream: both commit, every row stored once."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, note TEXT NOT NULL)")
    note = "x" * 1000
    big = STREAM_MESSAGE_BYTES // len(note) + 8  # rows of 1,000 bytes: over the message

    async def run() -> tuple[int, int]:
        async with AsyncClient(client.address) as own:

            async def insert(ids: range) -> int:
                async with own.transaction() as tx:
                    for i in ids:
                        tx.insert(table_name, {"id": i, "note": note})
                assert tx.timestamp is not None
                return tx.timestamp

            alone, shared = await asyncio.gather(insert(range(big)), insert(range(big, big + 2)))
            streams = [own._transactions, *(stream for _, _, stream in own._members.values())]
            # the small one only (a stream may be both the address's and a member's)
            assert sum(s.requests_written for s in set(streams)) == 1
            return alone, shared

    alone, shared = asyncio.run(run())
    assert alone > 0 and shared > 0 and alone != shared
    assert len(client.scan(table_name)) == big + 2
