"""Every limit refuses with a clear error naming it, applies nothing, and leaves the servers up.

One cluster with small limits (so the tests stay fast), plaintext: limits do not depend on
security (there a client is its connection; with tokens it is its token, see test_security)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from inflight import burst, scan_of
from polling import wait_for

from aggclient import Client
from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.wire import client_pb2 as pb
from aggview.wire.client_pb2_grpc import AggviewStub
from coordinator.convert import Limits

LIMITS = {
    "max_operations": 50,
    "max_key_bytes": 64,
    "max_row_bytes": 512,
    "max_request_bytes": 64 * 1024,
    "max_sql_bytes": 2048,
    "max_views": 2,
    "max_client_transactions": 3,
    "max_adhoc_rows": 30,
    "watch_stall_seconds": 2,
}


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # inflight.burst pauses member 1 under member 0's clients
    cluster = LocalCluster(tmp_path_factory.mktemp("limited"), ltms=2, processes=2, limits=LIMITS)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        cluster.kill()


@pytest.fixture(scope="module")
def client(limited: LocalCluster) -> Iterator[Client]:
    with Client(limited.address, timeout=20) as c:
        c.sql("CREATE TABLE items (id INT PRIMARY KEY, name TEXT)")
        c.sql("CREATE TABLE named (name TEXT PRIMARY KEY, n INT)")
        with c.transaction() as tx:
            tx.insert("items", {"id": 1, "name": "one"})
        yield c


def assert_intact(client: Client, cluster: LocalCluster) -> None:
    assert all(server.running() for server in cluster.servers)
    assert [r["id"] for r in client.scan("items")] == [1]
    assert client.scan("named") == []


def test_rows_per_transaction(client: Client, limited: LocalCluster) -> None:
    with pytest.raises(
        errors.LimitExceeded, match=r"51 operations; the limit is 50 \(max_operations"
    ):
        with client.transaction() as tx:
            for i in range(51):
                tx.insert("items", {"id": 100 + i, "name": "x"})
    with client.transaction() as tx:  # at the limit is fine
        for i in range(50):
            tx.insert("named", {"name": f"n{i}", "n": i})
    with client.transaction() as tx:
        for i in range(50):
            tx.delete("named", {"name": f"n{i}"})
    assert_intact(client, limited)


def test_key_size(client: Client, limited: LocalCluster) -> None:
    with pytest.raises(errors.LimitExceeded, match=r"key of \d+ bytes is over the 64 byte limit"):
        with client.transaction() as tx:
            tx.insert("named", {"name": "k" * 100, "n": 1})
    with pytest.raises(errors.LimitExceeded, match="max_key_bytes"):
        client.get("named", {"name": "k" * 100})
    assert_intact(client, limited)


def test_value_size(client: Client, limited: LocalCluster) -> None:
    with pytest.raises(errors.LimitExceeded, match=r"row of \d+ bytes .* \(max_row_bytes\)"):
        with client.transaction() as tx:
            tx.insert("items", {"id": 2, "name": "v" * 600})
    with pytest.raises(errors.LimitExceeded, match="max_row_bytes"):
        with client.transaction() as tx:
            tx.update("items", {"id": 1}, {"name": "v" * 600})
    assert_intact(client, limited)


def test_request_size(client: Client, limited: LocalCluster) -> None:
    with pytest.raises(errors.LimitExceeded, match="max_request_bytes"):
        with client.transaction() as tx:
            tx.insert("items", {"id": 2, "name": "r" * (100 * 1024)})
    assert_intact(client, limited)


def test_sql_size(client: Client, limited: LocalCluster) -> None:
    long_select = "SELECT * FROM items WHERE id = 1" + " " * 3000
    with pytest.raises(errors.LimitExceeded, match=r"over the 2048 byte limit \(max_sql_bytes\)"):
        client.sql(long_select)
    assert len(client.sql(long_select.strip())) == 1
    assert_intact(client, limited)


def test_view_count(client: Client, limited: LocalCluster) -> None:
    client.sql("CREATE MATERIALIZED VIEW n1 AS SELECT COUNT(*) AS n FROM items")
    client.sql("CREATE MATERIALIZED VIEW n2 AS SELECT SUM(id) AS s FROM items")
    with pytest.raises(errors.LimitExceeded, match=r"2 materialized views .* 2 \(max_views\)"):
        client.sql("CREATE MATERIALIZED VIEW n3 AS SELECT MAX(id) AS m FROM items")
    client.sql("DROP MATERIALIZED VIEW n2")
    client.sql("CREATE MATERIALIZED VIEW n3 AS SELECT MAX(id) AS m FROM items")
    assert client.view("n3")[0]["m"] == 1
    client.sql("DROP MATERIALIZED VIEW n3")
    client.sql("DROP MATERIALIZED VIEW n1")
    assert_intact(client, limited)


def test_concurrent_calls_per_connection(client: Client, limited: LocalCluster) -> None:
    """3 calls in flight per client (here: per connection, no tokens): with member 1 paused, 3
    scans wait and 2 more are refused at once; the slots come back afterwards."""
    outcomes = asyncio.run(burst(limited, scan_of("items"), 5))
    refused = [o for o in outcomes if isinstance(o, errors.AggviewError)]
    assert len(refused) == 2, outcomes
    for failure in refused:
        assert isinstance(failure, errors.LimitExceeded)
        assert "3 calls in flight; the limit is 3" in str(failure)
        assert "max_client_transactions" in str(failure)
    assert all(isinstance(o, list) for o in outcomes if o not in refused)
    assert_intact(client, limited)


def test_transactions_on_one_stream_take_a_slot_each(client: Client, limited: LocalCluster) -> None:
    """An AsyncClient's transactions share one Transact stream, and each takes one of the
    client's 3 slots: with member 1 paused, 3 wait and 2 more are refused at once; the waiting
    ones commit afterwards."""
    client.sql("CREATE TABLE tally (id INT PRIMARY KEY, n INT NOT NULL)")
    try:
        with client.transaction() as tx:
            for i in range(20):  # some row is member 1's: each transaction below waits for it
                tx.insert("tally", {"id": i, "n": 0})

        async def add_to_all(c: AsyncClient) -> None:
            async with c.transaction() as tx:
                for i in range(20):
                    tx.add("tally", {"id": i}, {"n": 1})

        outcomes = asyncio.run(burst(limited, add_to_all, 5, role="write"))
        refused = [o for o in outcomes if isinstance(o, errors.AggviewError)]
        assert len(refused) == 2, outcomes
        for failure in refused:
            assert isinstance(failure, errors.LimitExceeded)
            assert "max_client_transactions" in str(failure)
        assert {r["n"] for r in client.scan("tally")} == {3}
    finally:
        client.sql("DROP TABLE tally")
    assert_intact(client, limited)


def test_an_oversized_transaction_fails_alone(client: Client, limited: LocalCluster) -> None:
    """Over max_request_bytes from an AsyncClient: refused, while a transaction sent beside
    it on the client's stream commits."""

    async def run() -> list[object]:
        async with AsyncClient(limited.address) as c:

            async def big() -> None:
                async with c.transaction() as tx:
                    tx.insert("items", {"id": 2, "name": "r" * (100 * 1024)})

            async def small() -> None:
                async with c.transaction() as tx:
                    tx.insert("named", {"name": "beside", "n": 1})

            return await asyncio.gather(big(), small(), return_exceptions=True)

    big, small = asyncio.run(run())
    assert isinstance(big, errors.LimitExceeded) and "max_request_bytes" in str(big)
    assert small is None
    with client.transaction() as tx:
        tx.delete("named", {"name": "beside"})
    assert_intact(client, limited)


def test_limits_parse() -> None:
    assert Limits.parse(["max_views=7", "max_operations=9"]) == Limits(
        max_views=7, max_operations=9
    )
    with pytest.raises(errors.InvalidArgument, match="unknown limit 'nope'; limits are"):
        Limits.parse(["nope=1"])
    with pytest.raises(errors.InvalidArgument, match="needs an integer"):
        Limits.parse(["max_views=x"])
    with pytest.raises(errors.InvalidArgument, match="at least 1"):
        Limits.parse(["max_views=0"])
    with pytest.raises(errors.InvalidArgument, match="max_request_bytes must be at least 65536"):
        Limits.parse(["max_request_bytes=1000"])


def test_coordinator_refuses_a_bad_limit_flag(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "aggcli.cli", "start", "--insecure", "--data", str(tmp_path)]
        + ["--limit", "max_veiws=3"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=60,
    )
    assert done.returncode == 2 and "unknown limit 'max_veiws'" in done.stderr


def test_defaults_are_generous() -> None:
    """The defaults the rest of the suite (and the README) rely on."""
    limits = Limits()
    assert limits.max_operations == 10_000 and limits.max_row_bytes == 1024 * 1024
    assert limits.max_request_bytes == 16 * 1024 * 1024 and limits.max_views >= 100
    assert Decimal(limits.max_client_transactions) >= 1024


def test_rows_an_adhoc_select_may_read(client: Client, limited: LocalCluster) -> None:
    client.sql("CREATE TABLE many (id INT PRIMARY KEY, g INT)")
    client.sql("INSERT INTO many VALUES " + ", ".join(f"({i}, {i % 3})" for i in range(40)))
    with pytest.raises(errors.LimitExceeded, match="max_adhoc_rows.*materialized view"):
        client.sql("SELECT g, COUNT(*) FROM many GROUP BY g")
    assert len(client.sql("SELECT * FROM many WHERE g = 1")) == 13  # a key-value read: no limit
    client.sql("DROP TABLE many")
    assert_intact(client, limited)


def test_a_subscriber_that_takes_nothing_is_dropped(client: Client, limited: LocalCluster) -> None:
    """A subscriber that stops reading is dropped once flow control fills and it has taken no
    message for ``watch_stall_seconds``: RESOURCE_EXHAUSTED naming the limit, and the server,
    the data and other subscribers go on."""
    client.sql("CREATE TABLE wide (id INT PRIMARY KEY, g INT, pad TEXT)")
    client.sql(
        "CREATE MATERIALIZED VIEW wide_g AS SELECT g, COUNT(*) AS n, MAX(pad) AS top "
        "FROM wide GROUP BY g"
    )
    client.sql("INSERT INTO wide VALUES " + ", ".join(f"({g}, {g}, '')" for g in range(40)))
    channel = grpc.insecure_channel(limited.address, options=[("grpc.http2.bdp_probe", 0)])
    stalled = AggviewStub(channel).WatchView(
        pb.WatchRequest(view="wide_g", interval_ms=10), timeout=90
    )
    next(stalled)  # the first message (the whole view), then nothing is taken for a while
    healthy = client.watch("wide_g", interval_ms=10)
    try:
        # Every round changes every group (diffs of 16 KiB); the stalled channel's flow
        # control window stays at its first 64 KiB, so a few rounds fill it, and the rounds
        # go on past the stall limit.
        stop_at = time.monotonic() + LIMITS["watch_stall_seconds"] + 5
        round_ = 0
        while time.monotonic() < stop_at or round_ < 40:
            round_ += 1
            with client.transaction() as tx:
                for g in range(40):
                    tx.update("wide", {"id": g}, {"pad": f"{round_:06d}" + "p" * 400})
        with pytest.raises(grpc.RpcError) as dropped:
            for _ in stalled:  # what the transport held, then the status
                pass
        assert dropped.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, dropped.value
        assert "watch_stall_seconds" in (dropped.value.details() or "")
    finally:
        channel.close()
    top = f"{round_:06d}" + "p" * 400
    wait_for(
        "the healthy copy", lambda: [r["top"] for r in healthy.copy.rows.values()] == [top] * 40
    )
    assert healthy.error is None
    healthy.stop()
    client.sql("DROP MATERIALIZED VIEW wide_g")
    client.sql("DROP TABLE wide")
    assert_intact(client, limited)
