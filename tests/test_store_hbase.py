"""The store contract on the HBase adapter, plus what only a networked store can show.

Everything runs against the real happybase client talking over a socket to the HBase Thrift
TEST FIXTURE (``hbase_thrift_fixture``), in a thread of this process; the end-to-end test's
coordinator and LTMs are separate processes that reach the same fixture over TCP.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hbase_thrift_fixture import HBaseThriftFixture
from store_contract import StoreContract

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview.errors import InvalidArgument, Unavailable
from aggview.processes import free_port
from ltm.store import open_store
from ltm.store.base import GuardFailed
from ltm.store.hbase import HBaseStore


@pytest.fixture(scope="module")
def hbase() -> Iterator[HBaseThriftFixture]:
    """One fixture server for the module; tests use their own table names or prefixes."""
    with HBaseThriftFixture() as server:
        yield server


@pytest.fixture(scope="module")
def hbase_framed() -> Iterator[HBaseThriftFixture]:
    with HBaseThriftFixture(transport="framed", protocol="compact") as server:
        yield server


class TestHBaseStore(StoreContract):
    @pytest.fixture
    def url(self, hbase: HBaseThriftFixture) -> str:
        return hbase.url(retry_seconds=5)


class TestHBaseStoreFramedCompactUnbatched(StoreContract):
    """The other Thrift server modes, and one mutateRows call per row (batching off)."""

    @pytest.fixture
    def url(self, hbase_framed: HBaseThriftFixture) -> str:
        return hbase_framed.url(transport="framed", protocol="compact", batch_size=0)


@pytest.fixture
def store(hbase: HBaseThriftFixture) -> Iterator[HBaseStore]:
    prefix = f"p{uuid.uuid4().hex[:8]}"
    with HBaseStore(hbase.host, hbase.port, table_prefix=prefix, retry_seconds=5) as opened:
        assert isinstance(opened, HBaseStore)
        yield opened


def _rows(n: int, tag: bytes = b"v") -> list[tuple[str, bytes, bytes]]:
    return [("t", f"k{i:03d}".encode(), tag + str(i).encode()) for i in range(n)]


# --- reconnection -------------------------------------------------------------------------


def test_dropped_connections_are_reconnected_without_error(
    store: HBaseStore, hbase: HBaseThriftFixture
) -> None:
    """HBase's Thrift server closes idle sockets: every pooled connection goes stale at once."""
    store.create_table("t")
    # Several threads at once, so the pool holds several open connections.
    threads = [
        threading.Thread(target=store.write, args=([("t", f"w{i}".encode(), b"x")],))
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = hbase.connections_accepted
    assert hbase.drop_connections() >= 1
    mutated = hbase.rows_mutated
    store.write(_rows(50))
    assert hbase.rows_mutated - mutated == 50  # each row applied once: nothing duplicated
    assert hbase.drop_connections() >= 1
    assert store.get("t", b"k007") == b"v7"
    hbase.drop_connections()
    assert [k for k, _ in store.scan("t", batch_size=7)] == sorted(
        [f"w{i}".encode() for i in range(4)] + [k for _, k, _ in _rows(50)]
    )
    assert hbase.connections_accepted > accepted


@pytest.mark.parametrize("after_apply", [False, True], ids=["request-lost", "reply-lost"])
def test_write_cut_mid_batch_is_retried_to_the_same_rows(
    hbase: HBaseThriftFixture, after_apply: bool
) -> None:
    """A connection dies on the 2nd of 3 mutateRows calls, before applying it or after (so the
    retry sends rows the server has): puts and deletes of whole values end in the same rows."""
    prefix = f"p{uuid.uuid4().hex[:8]}"
    with HBaseStore(hbase.host, hbase.port, table_prefix=prefix, batch_size=20) as store:
        store.create_table("t")
        store.write(_rows(60, b"old"))
        hbase.fail_next("mutateRows", after_apply=after_apply, skip=1)
        hbase.calls["mutateRows"] = 0
        mutations = _rows(40, b"new") + [("t", f"k{i:03d}".encode(), None) for i in range(40, 60)]
        store.write(mutations)
        assert hbase.calls["mutateRows"] == 2 + 3  # cut on the 2nd; then the whole write again
        assert list(store.scan("t")) == [(k, v) for _, k, v in _rows(40, b"new")]


def test_big_values_split_batches(store: HBaseStore, hbase: HBaseThriftFixture) -> None:
    """A batch holds at most 1 MiB of keys and values (or one bigger row), so it stays under a
    framed Thrift server's 2 MiB frame: two 600 kB values never share one."""
    store.create_table("t")
    big = [("t", f"b{i}".encode(), bytes([i]) * 600_000) for i in range(5)]
    before = hbase.calls["mutateRows"]
    store.write(big)
    assert hbase.calls["mutateRows"] - before == 5
    small = [("t", f"s{i}".encode(), bytes([i]) * 300_000) for i in range(5)]
    before = hbase.calls["mutateRows"]
    store.write(small)
    assert hbase.calls["mutateRows"] - before == 2  # 3 + 2 values of 300 kB
    assert dict(store.scan("t")) == {k: v for _, k, v in big + small}


def test_scan_and_get_cut_mid_call_are_retried(
    store: HBaseStore, hbase: HBaseThriftFixture
) -> None:
    store.create_table("t")
    store.write(_rows(30))
    hbase.fail_next("scannerGetList", times=2)
    assert [k for k, _ in store.scan("t", batch_size=4)] == [k for _, k, _ in _rows(30)]
    hbase.fail_next("getRowsWithColumns")
    assert store.get_many("t", [b"k001", b"nope"]) == {b"k001": b"v1"}


@pytest.mark.parametrize("expected", [None, b"old"], ids=["absent", "value"])
def test_a_compare_and_set_cut_mid_call_is_retried_and_counted_once(
    store: HBaseStore, hbase: HBaseThriftFixture, expected: bytes | None
) -> None:
    """One checkAndPut per compare-and-set; a lost request is sent again, and a lost reply
    finds its own value in place (the retry's check fails on it): applied, once."""
    store.create_table("t")
    if expected is not None:
        store.write([("t", b"k", expected)])
    before = hbase.calls["checkAndPut"]
    hbase.fail_next("checkAndPut")
    store.write_guarded(("t", b"k", expected), [("t", b"k", b"1")])
    hbase.fail_next("checkAndPut", after_apply=True)
    store.write_guarded(("t", b"k", b"1"), [("t", b"k", b"2")])
    assert hbase.calls["checkAndPut"] - before == 4
    assert store.get("t", b"k") == b"2"
    with pytest.raises(GuardFailed):
        store.write_guarded(("t", b"k", b"1"), [("t", b"k", b"3")])
    # a guarded write of other keys (or a delete) is a check, then a write: no checkAndPut
    store.write_guarded(("t", b"k", b"2"), [("t", b"j", b"x"), ("t", b"k", None)])
    assert hbase.calls["checkAndPut"] - before == 5
    assert (store.get("t", b"k"), store.get("t", b"j")) == (None, b"x")


# --- HBase unreachable, gone, back --------------------------------------------------------


def test_unreachable_address_fails_fast_naming_it() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(Unavailable, match=f"127.0.0.1:{port}"):
        open_store(f"hbase://127.0.0.1:{port}")
    assert time.monotonic() - started < 5


def test_a_socket_that_is_not_a_thrift_server_fails_at_open() -> None:
    """Opening makes a real Thrift call: an open port that never answers is refused too."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port}.*unreachable"):
            HBaseStore("127.0.0.1", port, timeout_ms=300, retry_seconds=0)


def test_hbase_stopped_is_unavailable_then_works_when_restarted() -> None:
    with HBaseThriftFixture() as server:
        url = server.url(retry_seconds=0.3)
        with open_store(url) as store:
            store.create_table("t")
            store.write([("t", b"k", b"before")])
            server.stop()
            for attempt in (
                lambda: store.get("t", b"k"),
                lambda: store.write([("t", b"k", b"lost")]),
                lambda: list(store.scan("t")),
            ):
                with pytest.raises(Unavailable, match=server.address):
                    attempt()
            with pytest.raises(Unavailable, match=server.address):
                open_store(url)
            server.start()  # same port, tables kept: HBase is back
            assert store.get("t", b"k") == b"before"
            store.write([("t", b"k", b"after")])
            assert list(store.scan("t")) == [(b"k", b"after")]


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("hbase://h:9090?bogus=1", "unknown option 'bogus'"),
        ("hbase://h:9090?transport=http", "transport must be buffered or framed"),
        ("hbase://h:9090?protocol=json", "protocol must be binary or compact"),
        ("hbase://h:9090?batch_size=-1", "batch_size must be an int >= 0"),
        ("hbase://h:9090?pool_size=x", "bad pool_size"),
        ("hbase://h:99999", "bad port"),
        ("hbase://h:9090/some/path", "hbase://host"),
        ("hbase://h:9090?table_prefix=a/b", "table_prefix"),
    ],
)
def test_bad_hbase_urls_are_refused_before_connecting(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        open_store(url)


def test_tables_live_under_the_prefix_with_one_family(
    store: HBaseStore, hbase: HBaseThriftFixture
) -> None:
    store.create_table("Orders_1")
    table = hbase.tables[f"{store.table_prefix}_Orders_1".encode()]
    assert list(table.families) == [b"d:"]
    assert table.families[b"d:"].maxVersions == 1
    store.write([("Orders_1", b"\x00\xffkey", b"value")])
    assert {k: {c: v for c, (v, _) in cells.items()} for k, cells in table.rows.items()} == {
        b"\x00\xffkey": {b"d:v": b"value"}
    }
    assert store.list_tables() == ["Orders_1"]  # other prefixes on the server are not listed
    assert store.fast_point_reads is False


# --- a whole cluster on HBase -------------------------------------------------------------


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _view_rows(client: Client) -> list[tuple[object, ...]]:
    rows = client.view("shop_totals")
    return sorted((r["shop"], r["total"], r["n"], r["top"]) for r in rows)


def _recomputed(client: Client) -> list[tuple[object, ...]]:
    groups: dict[str, list[Decimal]] = {}
    for row in client.scan("orders"):
        groups.setdefault(row["shop"], []).append(row["amount"])
    return sorted((s, sum(a, Decimal(0)), len(a), max(a)) for s, a in groups.items())


def run_view_workload(url: str, data: Path) -> int:
    """A cluster on ``url``: health of every server, a table and a sync view, transactions
    (inserts, deletes, group moves), the view checked against a recomputation; then a clean
    stop (each LTM checkpoints into the store). Returns the number of live rows."""
    cluster = LocalCluster(data, ltms=3, checkpoint_interval=0.3, store=url)
    rng = random.Random(11)
    live: set[int] = set()
    with cluster:
        assert all(_serving(server.address) for server in cluster.servers)
        with Client(cluster.address, timeout=30) as client:
            client.sql(
                "CREATE TABLE orders (id INT PRIMARY KEY, shop TEXT NOT NULL, "
                "amount DECIMAL(12,2) NOT NULL)"
            )
            client.sql(
                "CREATE MATERIALIZED VIEW shop_totals AS SELECT shop, SUM(amount) AS total, "
                "COUNT(*) AS n, MAX(amount) AS top FROM orders GROUP BY shop"
            )
            with client.transaction() as tx:
                for i in range(20):
                    amount = Decimal(rng.randrange(100, 9999)) / 100
                    tx.insert("orders", {"id": i, "shop": f"s{i % 4}", "amount": amount})
                    live.add(i)
            for i in range(20, 32):
                with client.transaction() as tx:
                    victim = rng.choice(sorted(live))
                    tx.delete("orders", {"id": victim})
                    live.discard(victim)
                    moved = rng.choice(sorted(live))
                    tx.update("orders", {"id": moved}, {"shop": f"s{rng.randrange(5)}"})
                    tx.insert("orders", {"id": i, "shop": "s9", "amount": Decimal(i)})
                    live.add(i)
            assert _view_rows(client) == _recomputed(client)
            assert len(client.scan("orders")) == len(live)
    return len(live)


def check_after_restart(url: str, data: Path, live: int) -> None:
    """The same data directory and store again: rows and view as before the stop."""
    with LocalCluster(data, ltms=3, store=url) as again:
        with Client(again.address, timeout=30) as client:
            assert len(client.scan("orders")) == live
            assert _view_rows(client) == _recomputed(client)


def test_cluster_on_hbase_keeps_a_sync_view_exact(
    hbase: HBaseThriftFixture, tmp_path: Path
) -> None:
    prefix = f"e{uuid.uuid4().hex[:8]}"
    url = hbase.url(table_prefix=prefix, retry_seconds=5)
    live = run_view_workload(url, tmp_path / "data")
    # every LTM checkpointed its rows into HBase tables under the prefix
    mine = {name: t for name, t in hbase.tables.items() if name.startswith(prefix.encode())}
    assert len(mine) >= 4  # catalog, meta, orders, the view
    assert sum(len(t.rows) for t in mine.values()) >= live
    check_after_restart(url, tmp_path / "data", live)
