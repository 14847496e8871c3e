"""The Spark layer on a real cluster and a real local Spark session: the Data Source at a held
snapshot, bulk loads, views initialized and verified by Spark SQL, and failures half-way."""

from __future__ import annotations

import contextlib
import csv
import random
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")  # before the project's Spark modules are imported

from polling import wait_for  # noqa: E402
from test_views import as_tuples, recompute  # noqa: E402

from aggview import errors
from aggview.cluster import LocalCluster
from aggview.rowcodec import decode_stored, encode_stored
from aggview.schema import TableSchema
from coordinator import Client
from coordinator.bulk_client import BulkClient
from cumulus.spark import jobs
from cumulus.spark.compute import compute_states
from loadgen import dashboard
from ltm.store import open_store

SMALL = dashboard.Scale(shops=5, products=40, categories=4)
SHOP_TOTALS = (
    "SELECT p.shop_id, COUNT(*) AS n, SUM(e.cost) AS cost, AVG(e.cost) AS mean, "
    "MIN(e.cost) AS low, MAX(e.cost) AS high, COUNT(DISTINCT e.prod_id) AS products "
    "FROM events e JOIN products p ON e.prod_id = p.id WHERE e.cost > 0.25 GROUP BY p.shop_id"
)


def items_table(client: Client, name: str) -> None:
    client.sql(
        f"CREATE TABLE {name} (id INT PRIMARY KEY, label TEXT NOT NULL, price DECIMAL(8,2), "
        "day DATE, ok BOOL, score FLOAT)"
    )


def write_csv(path: Path, rows: list[list[Any]], header: list[str] | None) -> Path:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        if header:
            out.writerow(header)
        out.writerows(rows)
    return path


HEADER = ["id", "label", "price", "day", "ok", "score"]


def item_rows(n: int, start: int = 0) -> list[list[Any]]:
    return [
        [
            i,
            f"item {i}",
            f"{i % 97}.{i % 100:02d}",
            "2026-01-02",
            "true" if i % 2 else "false",
            i / 4,
        ]
        for i in range(start, start + n)
    ]


# ----------------------------------------------------------------------------- data source


def test_data_source_reads_exactly_one_snapshot_while_writes_continue(
    spark: Any, cluster: LocalCluster, client: Client, table_name: str
) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v INT NOT NULL)")
    committed: dict[int, int] = {}  # id -> commit timestamp
    stop = threading.Event()

    def writer() -> None:
        with Client(cluster.address) as own:
            i = 0
            while not stop.is_set():
                with own.transaction() as tx:
                    tx.insert(table_name, {"id": i, "v": i * 3})
                committed[i] = tx.timestamp  # type: ignore[assignment]
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(committed) < 50:
            time.sleep(0.02)
        bulk = BulkClient(client)
        lease, snapshot = bulk.hold_snapshot()
        frame = (
            spark.read.format("aggview")
            .option("address", cluster.address)
            .option("table", table_name)
            .option("snapshot", str(snapshot))
            .option("partitions", "3")
            .load()
        )
        seen = {row["id"]: row["v"] for row in frame.collect()}
        while max(committed.values()) <= snapshot:  # writes went on past the snapshot
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join()
    bulk.release_snapshot(lease)
    expected = {i: i * 3 for i, ts in committed.items() if ts <= snapshot}
    assert seen == expected
    assert len(committed) > len(expected)


def test_data_source_prunes_columns_and_narrows_key_ranges(
    spark: Any, cluster: LocalCluster, client: Client, table_name: str
) -> None:
    items_table(client, table_name)
    with client.transaction() as tx:
        for i, label, price, day, ok, score in item_rows(60):
            tx.insert(
                table_name,
                {
                    "id": i,
                    "label": label,
                    "price": price,
                    "day": day,
                    "ok": ok == "true",
                    "score": score,
                },
            )
    frame = (
        spark.read.format("aggview")
        .option("address", cluster.address)
        .option("table", table_name)
        .option("columns", "id,price")
        .load()
    )
    assert frame.columns == ["id", "price"]
    rows = frame.filter("id >= 10 AND id < 13").orderBy("id").collect()
    assert [(r["id"], r["price"]) for r in rows] == [
        (10, Decimal("10.10")),
        (11, Decimal("11.11")),
        (12, Decimal("12.12")),
    ]
    # the reader turns filters on the first key column into the key range it reads
    from pyspark.sql.datasource import GreaterThanOrEqual, LessThan
    from pyspark.sql.types import StructType

    from cumulus.spark.source import AggviewReader

    described = BulkClient(client).describe(table_name)
    reader = AggviewReader({"address": cluster.address}, described, StructType())
    filters = [GreaterThanOrEqual(("id",), 10), LessThan(("id",), 13)]
    assert list(reader.pushFilters(filters)) == filters  # Spark re-checks them all
    ranges = reader.partitions()
    assert ranges[0].start and ranges[-1].stop and ranges[0].start < ranges[-1].stop


def test_data_source_reads_views_and_refuses_unknown_names(
    spark: Any, cluster: LocalCluster, client: Client
) -> None:
    with pytest.raises(Exception, match="unknown table or materialized view 'no_such'"):
        spark.read.format("aggview").option("address", cluster.address).option(
            "table", "no_such"
        ).load()


# ----------------------------------------------------------------------------- bulk load


def test_bulk_load_is_atomic_while_transactions_run(
    spark: Any, cluster: LocalCluster, client: Client, table_name: str, tmp_path: Path
) -> None:
    items_table(client, table_name)
    other = table_name + "_other"
    client.sql(f"CREATE TABLE {other} (id INT PRIMARY KEY, n INT NOT NULL)")
    files = [
        write_csv(tmp_path / "a.csv", item_rows(3000), HEADER),
        write_csv(tmp_path / "b.csv", item_rows(2000, start=3000), HEADER),
    ]
    counts: list[int] = []
    written: list[int] = []
    stop = threading.Event()

    def alongside() -> None:
        with Client(cluster.address) as own:
            i = 0
            while not stop.is_set():
                with own.transaction() as tx:  # other writers keep committing
                    tx.insert(other, {"id": i, "n": i})
                written.append(i)
                counts.append(len(own.scan(table_name)))  # all of the load or none of it
                i += 1

    thread = threading.Thread(target=alongside)
    thread.start()
    try:
        result = jobs.load_files(spark, cluster.address, table_name, [str(f) for f in files])
    finally:
        time.sleep(0.3)
        stop.set()
        thread.join()
    assert result.rows == 5000
    assert set(counts) <= {0, 5000} and counts[-1] == 5000
    assert len(client.scan(other)) == len(written) > 0
    row = client.get(table_name, {"id": 4321})
    assert row == {
        "id": 4321,
        "label": "item 4321",
        "price": Decimal("53.21"),
        "day": __import__("datetime").date(2026, 1, 2),
        "ok": True,
        "score": 4321 / 4,
    }
    # the loaded rows are ordinary rows: transactions work on them
    with client.transaction() as tx:
        tx.update(table_name, {"id": 4321}, {"label": "changed"})
        tx.delete(table_name, {"id": 0})
    assert client.get(table_name, {"id": 4321})["label"] == "changed"  # type: ignore[index]
    assert client.get(table_name, {"id": 0}) is None


def test_bulk_load_parquet(
    spark: Any, cluster: LocalCluster, client: Client, table_name: str, tmp_path: Path
) -> None:
    client.sql(
        f"CREATE TABLE {table_name} (k TEXT, n INT, amount DECIMAL(6,1), PRIMARY KEY (k, n))"
    )
    frame = spark.createDataFrame(
        [(f"k{i % 3}", i, Decimal(f"{i}.5")) for i in range(30)],
        "k STRING, n BIGINT, amount DECIMAL(6,1)",
    )
    path = tmp_path / "rows.parquet"
    frame.coalesce(1).write.parquet(str(path))
    files = [str(p) for p in path.glob("*.parquet")]
    result = jobs.load_files(spark, cluster.address, table_name, files)
    assert result.rows == 30
    assert client.get(table_name, {"k": "k1", "n": 7}) == {
        "k": "k1",
        "n": 7,
        "amount": Decimal("7.5"),
    }


def test_data_source_writer_appends_at_one_timestamp(
    spark: Any, cluster: LocalCluster, client: Client, table_name: str
) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, v TEXT)")
    frame = spark.createDataFrame([(i, f"v{i}") for i in range(100)], "id BIGINT, v STRING")
    frame.write.format("aggview").option("address", cluster.address).option(
        "table", table_name
    ).mode("append").save()
    assert len(client.scan(table_name)) == 100


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1, "a", "1.00", "2026-01-01", "true", 1.0], [2, "b"]], r"b\.csv:3: expected 6 fields"),
        ([[1, "a", "x1", "2026-01-01", "true", 1.0]], r"b\.csv:2: .*not a decimal number"),
        ([[1, "a", "1.00", "2026-13-01", "true", 1.0]], r"b\.csv:2: .*ISO-8601 date"),
        ([[1, "a", "1.00", "2026-01-01", "maybe", 1.0]], r"b\.csv:2: .*not true or false"),
        ([["one", "a", "1.00", "2026-01-01", "true", 1.0]], r"b\.csv:2: .*not an integer"),
        ([[1, "", "1.00", "2026-01-01", "true", 1.0]], r"b\.csv:2: .*label is NOT NULL"),
        (
            [[7, "a", "1.00", "", "", ""], [7, "b", "", "", "", ""]],
            r"(?s)same primary key.*b\.csv:2, .*b\.csv:3",
        ),
    ],
)
def test_bulk_load_refuses_bad_rows_and_loads_nothing(
    spark: Any,
    cluster: LocalCluster,
    client: Client,
    table_name: str,
    tmp_path: Path,
    rows: list[list[Any]],
    message: str,
) -> None:
    items_table(client, table_name)
    good = write_csv(tmp_path / "a.csv", item_rows(50, start=100), HEADER)
    bad = write_csv(tmp_path / "b.csv", rows, HEADER)
    with pytest.raises(errors.InvalidArgument, match=message):
        jobs.load_files(spark, cluster.address, table_name, [str(good), str(bad)])
    assert client.scan(table_name) == []
    staged = [t for t in open_store(cluster.store_url).list_tables() if t.startswith("load_")]
    assert staged == []  # no staging table left behind


def test_bulk_load_names_missing_files_unknown_tables_and_columns(
    spark: Any, cluster: LocalCluster, client: Client, table_name: str, tmp_path: Path
) -> None:
    items_table(client, table_name)
    good = write_csv(tmp_path / "a.csv", item_rows(5), HEADER)
    with pytest.raises(errors.InvalidArgument, match="no such file: .*missing.csv"):
        jobs.load_files(spark, cluster.address, table_name, [str(tmp_path / "missing.csv")])
    with pytest.raises(errors.UnknownTable, match="no_table"):
        jobs.load_files(spark, cluster.address, "no_table", [str(good)])
    odd = write_csv(tmp_path / "odd.csv", [[1, 2]], ["id", "colour"])
    with pytest.raises(errors.UnknownColumn, match="no column 'colour'"):
        jobs.load_files(spark, cluster.address, table_name, [str(odd)])
    with pytest.raises(errors.InvalidArgument, match="unknown format 'txt'"):
        jobs.load_files(
            spark, cluster.address, table_name, [str(write_csv(tmp_path / "x.txt", [], None))]
        )
    assert client.scan(table_name) == []


# ----------------------------------------------------------------------------- views


def same(view_rows: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> bool:
    """Equal, with AVG compared to the view's 6 decimal places."""
    if len(view_rows) != len(expected):
        return False
    for got, want in zip(view_rows, expected, strict=True):
        for a, b in zip(got, want, strict=True):
            if isinstance(a, Decimal) and not isinstance(b, int):
                if abs(Decimal(a) - Decimal(str(b))) > Decimal("0.000001"):
                    return False
            elif a != b:
                return False
    return True


@pytest.fixture
def dashboard_cluster(tmp_path: Path) -> Any:
    cluster = LocalCluster(tmp_path / "data", ltms=3, checkpoint_interval=0.5)
    cluster.start()
    try:
        with Client(cluster.address) as client:
            dashboard.create_schema(client)
            dashboard.populate(client, SMALL)
            rng = random.Random(5)
            with client.transaction() as tx:
                for i in range(300):
                    tx.insert("events", dashboard.event(rng, i, SMALL))
        yield cluster
    finally:
        cluster.stop()
        cluster.kill()


def churn(address: str, seed: int, stop: threading.Event, count: list[int]) -> None:
    """Inserts, updates (moving events between products, so between groups) and deletes."""
    rng = random.Random(seed)
    with Client(address) as client:
        mine: list[int] = []
        while not stop.is_set():
            with client.transaction() as tx:
                roll = rng.random()
                if roll < 0.5 or len(mine) < 3:
                    event_id = 10_000 * seed + rng.randrange(10_000)
                    if event_id in mine:
                        continue
                    tx.insert("events", dashboard.event(rng, event_id, SMALL))
                    mine.append(event_id)
                elif roll < 0.8:
                    tx.update("events", {"id": rng.choice(mine)}, dashboard.correction(rng, SMALL))
                else:
                    tx.delete("events", {"id": mine.pop(rng.randrange(len(mine)))})
            count[0] += 1


@contextlib.contextmanager
def churning(addresses: list[str]) -> Iterator[list[list[int]]]:
    """One ``churn`` writer per address (seeds 1, 2, …) until the block ends, started once
    they have committed 20 transactions; yields their counts."""
    stop = threading.Event()
    counts = [[0] for _ in addresses]
    writers = [
        threading.Thread(target=churn, args=(address, seed + 1, stop, counts[seed]))
        for seed, address in enumerate(addresses)
    ]
    for writer in writers:
        writer.start()
    try:
        while sum(c[0] for c in counts) < 20:
            time.sleep(0.05)
        yield counts
    finally:
        stop.set()
        for writer in writers:
            writer.join()


@pytest.mark.parametrize("mode", ["sync", "async", "cumulus"])
def test_bulk_init_while_four_clients_write_then_view_equals_recomputation(
    spark: Any, dashboard_cluster: LocalCluster, mode: str
) -> None:
    """Spark computes the view at a snapshot (a cumulus view: its M3 program's maps, from
    their definitions) while four writers insert, move and delete events; the cluster
    installs it and applies what was captured after the snapshot."""
    address = dashboard_cluster.address
    with churning([address] * 4) as counts:
        before = sum(c[0] for c in counts)
        result = jobs.init_view(
            spark, address, sql=dashboard.view_ddl("shop_totals", SHOP_TOTALS, mode, 200)
        )
        time.sleep(0.5)
    assert sum(c[0] for c in counts) > before  # writers never stopped
    assert result.groups == (SMALL.shops if mode != "cumulus" else 0)
    assert result.entries > 0 if mode == "cumulus" else result.entries == 0
    with Client(address) as client:
        if mode != "sync":
            client.refresh("shop_totals")
        assert same(as_tuples(client.view("shop_totals")), recompute(client, SHOP_TOTALS))
    # the options the command line passes for an insecure cluster
    insecure = {"ca": None, "token": None}
    [verified] = jobs.verify_views(spark, address, ["shop_totals"], client_options=insecure)
    assert verified.ok and verified.groups == SMALL.shops


def test_verify_catches_a_view_row_corrupted_in_the_store(
    spark: Any, dashboard_cluster: LocalCluster
) -> None:
    address = dashboard_cluster.address
    jobs.init_view(spark, address, sql=dashboard.view_ddl("shop_totals", SHOP_TOTALS))
    assert all(r.ok for r in jobs.verify_views(spark, address))
    with Client(address) as client:
        view_table = BulkClient(client).describe("shop_totals").store_table
    dashboard_cluster.stop()  # a clean stop checkpoints every row to the store
    store = open_store(dashboard_cluster.store_url)
    key, value = next(iter(store.scan(view_table, None, None)))
    ts, state, lsn = decode_stored(value)
    state["_count"] += 1
    store.write([(view_table, key, encode_stored(ts, state, lsn))])
    store.close()
    dashboard_cluster.servers.clear()
    dashboard_cluster.start()
    [result] = jobs.verify_views(spark, dashboard_cluster.address, ["shop_totals"])
    assert [d.actual["n"] - d.expected["n"] for d in result.differences] == [1]  # type: ignore[index]


def test_verify_checks_a_cumulus_view_at_an_epoch_while_writers_go_on(
    spark: Any, dashboard_cluster: LocalCluster
) -> None:
    """A cumulus view keeps no states: verify forces an epoch inside its held snapshot, reads
    the view's rows at it and compares them with Spark's recomputation at that timestamp,
    while four writers insert, move and delete events. A row changed on the way (as a wrong
    runtime would give it) is a difference naming its group and both values."""
    address = dashboard_cluster.address
    with Client(address) as client:
        client.sql(dashboard.view_ddl("shop_totals", SHOP_TOTALS, "cumulus", 100, 2, "speculative"))
    with churning([address] * 4):
        [result] = jobs.verify_views(spark, address, ["shop_totals"])
    assert result.ok and result.groups == SMALL.shops and result.timestamp > 0
    with Client(address) as client:
        bulk = BulkClient(client)
        described = bulk.describe("shop_totals")
        lease, _ = bulk.hold_snapshot()
        try:
            ts, rows = jobs._cumulus_epoch(client, "shop_totals")
            state = jobs._view_state(described.plan, described.base_schemas)  # type: ignore[arg-type]
            with jobs.snapshot_tables(spark, address, state, ts, {}) as tables:
                expected = compute_states(spark, state, tables)
        finally:
            bulk.release_snapshot(lease)
    assert jobs.compare_rows("shop_totals", ts, state, expected, rows).ok
    rows[0] = {**rows[0], "n": rows[0]["n"] + 1}
    [difference] = jobs.compare_rows("shop_totals", ts, state, expected, rows).differences
    assert difference.actual["n"] - difference.expected["n"] == 1  # type: ignore[index]
    assert difference.group == {"shop_id": rows[0]["shop_id"]}


def test_a_failed_job_leaves_no_view_and_a_recomputed_view_as_it_was(
    spark: Any, dashboard_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = dashboard_cluster.address

    def broken(*args: Any) -> Any:
        raise RuntimeError("Spark executor lost (injected)")

    monkeypatch.setattr(jobs, "compute_states", broken)
    with pytest.raises(RuntimeError, match="injected"):
        jobs.init_view(spark, address, sql=dashboard.view_ddl("shop_totals", SHOP_TOTALS))
    with Client(address) as client:
        with pytest.raises(errors.UnknownTable):
            client.view("shop_totals")
    monkeypatch.undo()
    jobs.init_view(spark, address, sql=dashboard.view_ddl("shop_totals", SHOP_TOTALS))
    monkeypatch.setattr(jobs, "compute_states", broken)
    rng = random.Random(9)
    with Client(address) as client:
        before = as_tuples(client.view("shop_totals"))
        stop = threading.Event()
        count = [0]
        writer = threading.Thread(target=churn, args=(address, 7, stop, count))
        writer.start()
        try:
            with pytest.raises(RuntimeError, match="injected"):
                jobs.init_view(spark, address, view="shop_totals")
        finally:
            stop.set()
            writer.join()
        with client.transaction() as tx:
            tx.insert("events", dashboard.event(rng, 99_999, SMALL))
        assert count[0] > 0 and before  # it was live before, and writes went on meanwhile
        assert same(as_tuples(client.view("shop_totals")), recompute(client, SHOP_TOTALS))
    monkeypatch.undo()
    jobs.init_view(spark, address, view="shop_totals")  # recomputing a live view works too
    assert all(r.ok for r in jobs.verify_views(spark, address))


def test_an_abandoned_initialization_is_undone_when_its_lease_lapses(
    dashboard_cluster: LocalCluster,
) -> None:
    with Client(dashboard_cluster.address) as client:
        bulk = BulkClient(client)
        begun = bulk.begin_view(sql=dashboard.view_ddl("shop_totals", SHOP_TOTALS), ttl_ms=500)
        with pytest.raises(errors.FailedPrecondition, match="still initializing"):
            client.view("shop_totals")
        deadline = time.monotonic() + 10
        while "shop_totals" in bulk.list()[1]:
            assert time.monotonic() < deadline, "the abandoned view was never dropped"
            time.sleep(0.2)
        with pytest.raises(errors.FailedPrecondition, match="not being initialized"):
            bulk.finish_view(begun.view, begun.snapshot, [])
        with client.transaction() as tx:  # writers were never held up
            tx.insert("events", dashboard.event(random.Random(1), 55_555, SMALL))


def test_a_missing_or_old_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cumulus.spark.session import _java_major, check_java

    assert _java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert _java_major('java version "1.8.0_392"') == 8
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(errors.FailedPrecondition, match="Java 17 or newer"):
        check_java()
    old = tmp_path / "bin"
    old.mkdir()
    (old / "java").write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    (old / "java").chmod(0o755)
    with pytest.raises(errors.FailedPrecondition, match="is Java 8"):
        check_java()


def test_load_on_the_command_line_from_elsewhere_with_another_python_on_path(
    cluster: LocalCluster, client: Client, table_name: str, tmp_path: Path
) -> None:
    """As a user runs an installed aggview: by its path, from another directory, with PATH
    leading to some other python3 (here one that refuses to run). Spark's workers must run on
    aggview's own interpreter, and Spark's console output stays out of the terminal."""
    import os
    import shutil
    import subprocess
    import sys

    items_table(client, table_name)
    good = write_csv(tmp_path / "a.csv", item_rows(20), HEADER)
    decoy = tmp_path / "decoy-bin"
    decoy.mkdir()
    for name in ("python", "python3"):
        (decoy / name).write_text("#!/bin/sh\necho 'the wrong python ran' >&2\nexit 3\n")
        (decoy / name).chmod(0o755)
    java = shutil.which("java")
    assert java is not None
    path = os.pathsep.join([str(decoy), os.path.dirname(os.path.realpath(java)), "/usr/bin:/bin"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    env.update(PATH=path, AGGVIEW_SPARK_LOG=str(tmp_path / "spark.log"))
    script = Path(sys.executable).parent / "aggview"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "aggview.cli"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [*command, "load", cluster.address, table_name, str(good)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=elsewhere,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert f"loaded 20 rows into {table_name}" in done.stdout
    assert len(client.scan(table_name)) == 20
    for noise in ("[Stage", "WARN", "log4j", "Using incubator modules", "the wrong python"):
        assert noise not in done.stdout + done.stderr, noise
    assert (tmp_path / "spark.log").stat().st_size > 0  # Spark's own output went here


def test_async_views_initialized_by_spark_refresh_on_both_members(
    spark: Any, tmp_path: Path
) -> None:
    """Two async views initialized by Spark on a two-member cluster while clients write: one
    is refreshed by each member (view n at member n % 2), and the follower skips the changes
    its view's snapshot already holds, as member 0 does."""
    cluster = LocalCluster(tmp_path / "data", ltms=2, processes=2, checkpoint_interval=0.5)
    cluster.start()
    try:
        address = cluster.address
        with Client(address) as client:
            dashboard.create_schema(client)
            dashboard.populate(client, SMALL)
        with churning([cluster.member(0).address, cluster.member(1).address]):
            for name in ("shop_totals", "shop_totals_2"):
                jobs.init_view(
                    spark, address, sql=dashboard.view_ddl(name, SHOP_TOTALS, "async", 50)
                )
            time.sleep(0.5)
        with Client(address) as client:
            expected = recompute(client, SHOP_TOTALS)

            def fresh() -> bool:
                return all(
                    same(as_tuples(client.view(name)), expected)
                    for name in ("shop_totals", "shop_totals_2")
                )

            wait_for("both views to catch up", fresh, timeout=30)
    finally:
        cluster.stop()
        cluster.kill()


def test_bulk_load_retries_timestamp_order_aborts_while_clients_write_its_table(
    cluster: LocalCluster, client: Client, table_name: str
) -> None:
    """Clients updating the rows a load inserts read them at younger timestamps, so the load's
    older inserts lose to them (timestamp order): the load runs again at a new timestamp, as a
    transaction is retried, instead of failing the job with TooLate. (Under writes that never
    stop, a load of many rows keeps losing: the writers stop during the load's retries.)"""
    from cumulus.spark.source import stage_rows, staging_name

    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, n INT NOT NULL)")
    rows = 10_000  # two prepare rounds
    bulk = BulkClient(client)
    described = bulk.describe(table_name)
    assert described.schema is not None
    staging = staging_name()
    store = open_store(described.store_url)
    try:
        store.create_table(staging)
        values = ({"id": i, "n": 0} for i in range(rows))
        stage_rows(store, staging, TableSchema.from_json(described.schema), values)
    finally:
        store.close()
    stop = threading.Event()
    updates = [0]

    def alongside(seed: int) -> None:
        rng = random.Random(seed)
        with Client(cluster.address) as own:
            while not stop.is_set():  # reads (at its own, younger timestamp) a row being loaded
                own.sql(f"UPDATE {table_name} SET n = n + 1 WHERE id = {rng.randrange(rows)}")
                updates[0] += 1

    threads = [threading.Thread(target=alongside, args=(seed,)) for seed in range(2)]
    for thread in threads:
        thread.start()
    wait_for("the first updates", lambda: updates[0] >= 10)
    calm = threading.Timer(1.0, stop.set)
    calm.start()
    try:
        ts, loaded = bulk.load(table_name, staging)
    finally:
        stop.set()
        calm.cancel()
        for thread in threads:
            thread.join()
    assert loaded == rows
    assert len(client.scan(table_name)) == rows
    assert ts > 0
