"""Against a real Apache HBase 2.6 (standalone mode, its real Thrift servers; the session's
``real_hbase`` fixture): the store contract, a cluster with sync and async views, Spark bulk
work, kill -9 of an LTM under load, and HBase's own limits met for real -- a row over the
frame of a framed Thrift server, a scan across a region split, a Thrift server restart
mid-load. The in-process Thrift stand-in (tests/hbase_thrift_fixture.py) stays for faults a
real server cannot give on cue."""

from __future__ import annotations

import csv
import random
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for
from store_contract import StoreContract
from test_store_hbase import check_after_restart, run_view_workload

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.keycodec import encode_key
from aggview.schema import ColumnType
from loadgen import transfers
from ltm.store import open_store
from ltm.store.hbase import HBaseStore
from ltm.store.hbase_server import StandaloneHBase

INT = ColumnType("INT")


def store_url(hbase: StandaloneHBase, *, framed: bool = False, **options: object) -> str:
    running = hbase.running()
    assert running is not None
    base = running.framed_url if framed else running.url
    query = "&".join(f"{k}={v}" for k, v in {"retry_seconds": 20, **options}.items())
    return base + ("&" if "?" in base else "?") + query


def fresh_prefix() -> str:
    return f"r{uuid.uuid4().hex[:8]}"


class TestRealHBaseStore(StoreContract):
    @pytest.fixture
    def url(self, real_hbase: StandaloneHBase) -> str:
        return store_url(real_hbase)


def test_cluster_on_real_hbase_keeps_a_sync_view_exact_across_a_restart(
    real_hbase: StandaloneHBase, tmp_path: Path
) -> None:
    url = store_url(real_hbase, table_prefix=fresh_prefix())
    live = run_view_workload(url, tmp_path / "data")
    check_after_restart(url, tmp_path / "data", live)


def test_views_bulk_load_bulk_init_and_verify_through_spark_on_real_hbase(
    spark: Any, real_hbase: StandaloneHBase, tmp_path: Path
) -> None:
    from aggspark import jobs

    url = store_url(real_hbase, table_prefix=fresh_prefix())
    with LocalCluster(tmp_path / "data", ltms=2, checkpoint_interval=0.3, store=url) as cluster:
        with Client(cluster.address, timeout=60) as client:
            client.sql(
                "CREATE TABLE sales (id INT PRIMARY KEY, shop TEXT NOT NULL, "
                "amount DECIMAL(10,2) NOT NULL)"
            )
            client.sql(
                "CREATE MATERIALIZED VIEW by_shop AS SELECT shop, COUNT(*) AS n, "
                "SUM(amount) AS total, MAX(amount) AS top FROM sales GROUP BY shop"
            )
            client.sql(
                "CREATE MATERIALIZED VIEW all_sales WITH (refresh = 'async', interval_ms = 100) "
                "AS SELECT COUNT(*) AS n, SUM(amount) AS total FROM sales"
            )
            rng = random.Random(5)
            for i in range(40):
                with client.transaction() as tx:
                    tx.insert(
                        "sales",
                        {"id": i, "shop": f"s{i % 3}", "amount": Decimal(rng.randrange(1, 999))},
                    )
                    if i % 7 == 6:
                        tx.delete("sales", {"id": i - 3})
            path = tmp_path / "sales.csv"
            with path.open("w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["id", "shop", "amount"])
                out.writerows([i, f"s{i % 5}", f"{i % 97}.25"] for i in range(1000, 3000))
            loaded = jobs.load_files(spark, cluster.address, "sales", [str(path)])
            assert loaded.rows == 2000
            created = jobs.init_view(
                spark,
                cluster.address,
                sql="CREATE MATERIALIZED VIEW shop_avg AS SELECT shop, AVG(amount) AS mean, "
                "COUNT(DISTINCT amount) AS prices FROM sales GROUP BY shop",
            )
            assert created.groups == 5
            client.refresh("all_sales")
            results = jobs.verify_views(spark, cluster.address)
            assert {r.view for r in results} == {"by_shop", "all_sales", "shop_avg"}
            assert all(r.ok for r in results), [r for r in results if not r.ok]
            rows = client.scan("sales")
            totals: dict[str, list[Decimal]] = {}
            for row in rows:
                totals.setdefault(row["shop"], []).append(row["amount"])
            assert sorted(
                (r["shop"], r["n"], r["total"]) for r in client.view("by_shop")
            ) == sorted((shop, len(a), sum(a, Decimal(0))) for shop, a in totals.items())


def test_kill_9_of_an_ltm_under_load_loses_nothing_on_real_hbase(
    real_hbase: StandaloneHBase, tmp_path: Path
) -> None:
    url = store_url(real_hbase, table_prefix=fresh_prefix())
    cluster = LocalCluster(
        tmp_path / "data", ltms=3, processes=2, checkpoint_interval=0.3, store=url
    )
    with cluster:
        with Client(cluster.address, timeout=60) as client:
            transfers.create(client, "accounts", "ledger", 30)
            client.sql(
                "CREATE MATERIALIZED VIEW sent AS SELECT src, SUM(amount) AS total, "
                "COUNT(*) AS n FROM ledger GROUP BY src"
            )
        with transfers.running(
            cluster.address, "accounts", "ledger", 30, clients=4, seed=3, join_timeout=60
        ) as outcomes:
            wait_for("transfers before the kill", lambda: len(outcomes.committed) > 20)
            victim = cluster.member(1)
            victim.kill()
            victim.start()
            restarted = len(outcomes.committed)
            wait_for(
                "transfers after the restart", lambda: len(outcomes.committed) > restarted + 20
            )
        with Client(cluster.address, timeout=60) as client:
            transfers.check(client, "accounts", "ledger", 30, outcomes.committed)
            groups: dict[int, list[int]] = {}
            for row in client.scan("ledger"):
                groups.setdefault(row["src"], []).append(row["amount"])
            assert sorted((r["src"], r["total"], r["n"]) for r in client.view("sent")) == (
                sorted((src, sum(a), len(a)) for src, a in groups.items())
            )


def test_a_row_over_the_frame_of_a_framed_thrift_server_is_refused_and_nothing_applied(
    real_hbase: StandaloneHBase,
) -> None:
    with open_store(store_url(real_hbase, framed=True, table_prefix=fresh_prefix())) as store:
        assert isinstance(store, HBaseStore)
        store.create_table("t")
        # five 600 kB rows: one call would pass the 2 MiB frame; batches end at about 1 MiB
        big = [("t", f"b{i}".encode(), bytes([65 + i]) * 600_000) for i in range(5)]
        store.write(big)
        assert dict(store.scan("t")) == {k: v for _, k, v in big}
        too_big = ("t", b"huge", b"x" * (3 << 20))
        started = time.monotonic()
        with pytest.raises(errors.InvalidArgument, match=r"'huge'.*3145732 bytes.*framed"):
            store.write([("t", b"small", b"s"), too_big])
        assert time.monotonic() - started < 5  # refused at once, not retried as a lost link
        assert store.get_many("t", [b"small", b"huge"]) == {}
        store.write([("t", b"after", b"ok")])  # the connection is still good
        assert store.get_many("t", [b"after"]) == {b"after": b"ok"}
        store.drop_table("t")


def test_a_cell_over_hbase_s_own_limit_is_refused_before_sending(
    real_hbase: StandaloneHBase,
) -> None:
    """HBase refuses a cell over hbase.client.keyvalue.maxsize (10 MiB) with an
    IllegalArgument; the adapter refuses it first, naming the row."""
    with open_store(store_url(real_hbase, table_prefix=fresh_prefix())) as store:
        store.create_table("t")
        with pytest.raises(errors.InvalidArgument, match="'big'.*buffered"):
            store.write([("t", b"big", b"x" * (11 << 20))])
        store.write([("t", b"k", b"x" * (3 << 20))])  # 3 MiB is fine unframed
        assert len(store.get_many("t", [b"k"])[b"k"]) == 3 << 20
        store.drop_table("t")


def test_scans_cross_a_region_split(real_hbase: StandaloneHBase) -> None:
    prefix = fresh_prefix()
    with open_store(store_url(real_hbase, table_prefix=prefix, scan_batch_size=7)) as store:
        store.create_table("t")
        keys = [encode_key([INT], [i]) for i in range(-150, 150)]
        store.write([("t", k, b"v%d" % n) for n, k in enumerate(keys)])
        real_hbase.split(f"{prefix}_t", encode_key([INT], [10]))
        import happybase

        running = real_hbase.running()
        assert running is not None
        connection = happybase.Connection(running.host, running.ports.thrift)

        def split_seen() -> bool:
            """The Thrift server learns of the new regions a moment after the master: until
            then it may answer with an application error (seen once in four full runs)."""
            try:
                return len(connection.table(f"{prefix}_t").regions()) == 2
            except Exception:  # noqa: BLE001 - thriftpy2's TApplicationException and the like
                return False

        try:
            wait_for("the split to show two regions through Thrift", split_seen)
        finally:
            connection.close()
        assert [k for k, _ in store.scan("t")] == keys  # in order, each once, across the split
        across = list(store.scan("t", encode_key([INT], [0]), encode_key([INT], [20])))
        assert [k for k, _ in across] == keys[150:170]
        store.drop_table("t")


def test_a_thrift_server_restart_mid_load_loses_nothing(real_hbase: StandaloneHBase) -> None:
    with open_store(store_url(real_hbase, table_prefix=fresh_prefix(), pool_size=2)) as store:
        store.create_table("t")
        written: list[bytes] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def load() -> None:
            n = 0
            while not stop.is_set():
                batch = [("t", b"k%06d" % (n + i), b"v") for i in range(50)]
                try:
                    store.write(batch)
                except BaseException as exc:  # noqa: BLE001 - the test reports it
                    failures.append(exc)
                    return
                written.extend(k for _, k, _ in batch)
                n += 50

        loader = threading.Thread(target=load)
        loader.start()
        try:
            wait_for("some rows before the restart", lambda: len(written) > 200)
            real_hbase.restart_thrift()
            after = len(written)
            wait_for("rows after the restart", lambda: len(written) > after + 200)
        finally:
            stop.set()
            loader.join(timeout=60)
        assert failures == []
        assert [k for k, _ in store.scan("t")] == sorted(written)
        store.drop_table("t")


def test_the_readme_commands_run_a_cluster_on_real_hbase(
    real_hbase: StandaloneHBase, tmp_path: Path
) -> None:
    """`aggview start --store hbase://…` then `aggview sql`, as the README shows."""
    import re
    import subprocess
    import sys

    url = store_url(real_hbase, table_prefix=fresh_prefix())
    cli = [sys.executable, "-m", "aggcli.cli"]
    server = subprocess.Popen(
        [*cli, "start", "--data", str(tmp_path / "data"), "--ltms", "2", "--store", url]
        + ["--insecure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.match(r"aggview listening on (\S+)", line)
        assert match, line
        address = match.group(1)

        def sql(statement: str) -> str:
            done = subprocess.run(
                [*cli, "sql", address, statement], capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        sql("CREATE TABLE notes (id INT PRIMARY KEY, body TEXT NOT NULL)")
        with Client(address) as client, client.transaction() as tx:
            tx.insert("notes", {"id": 1, "body": "on hbase"})
        assert "on hbase" in sql("SELECT body FROM notes WHERE id = 1")
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=60)
    assert "aggview stopped" in out


def test_hbase_commands_name_what_is_missing(tmp_path: Path) -> None:
    import subprocess
    import sys

    cli = [sys.executable, "-m", "aggcli.cli", "hbase"]
    stop = subprocess.run(
        [*cli, "stop", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert stop.returncode == 2 and "no HBase runs from" in stop.stderr
    no_java = subprocess.run(
        [*cli, "start", "--dir", str(tmp_path / "h"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},  # neither java nor mvn
    )
    assert no_java.returncode == 2 and "needs java" in no_java.stderr, no_java.stderr
