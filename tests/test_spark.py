"""The Spark layer on a real cluster and a real local Spark session: the Data Source at a held
snapshot, bulk loads, views initialized and verified by Spark SQL, and failures half-way."""

from __future__ import annotations

import csv
import random
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")  # before the project's Spark modules are imported

from polling import wait_for  # noqa: E402

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggspark import jobs
from aggview import errors
from aggview.schema import TableSchema
from ltm.store import open_store


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


def test_spark_settings_from_the_environment_are_read_or_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, spark: Any
) -> None:
    """The suite's own AGGVIEW_SPARK_CONF reached its session; a malformed one is named."""
    from aggspark.session import extra_settings

    assert spark.conf.get("spark.sql.shuffle.partitions") == extra_settings().get(
        "spark.sql.shuffle.partitions", "4"
    )
    monkeypatch.setenv("AGGVIEW_SPARK_CONF", " a.b = 1 ,, c=x=y ")
    assert extra_settings() == {"a.b": "1", "c": "x=y"}
    monkeypatch.setenv("AGGVIEW_SPARK_CONF", "a.b=1,spark.sql.ansi.enabled")
    with pytest.raises(
        errors.FailedPrecondition, match="'spark.sql.ansi.enabled' is not key=value"
    ):
        extra_settings()


def test_python_workers_import_the_installed_pyspark(spark: Any) -> None:
    """Not ``pyspark.zip`` from SPARK_HOME, which Python compiles again in every worker
    process (1.8 CPU-s against 0.6): the installed package, with its bytecode cache."""
    import pyspark
    from pyspark.sql.functions import udf

    def imported_from(_):  # type: ignore[no-untyped-def]  # hints would make it a pandas UDF
        import pyspark as worker_pyspark

        return str(worker_pyspark.__file__)

    imported_from = udf(imported_from, "string")

    [row] = spark.range(1).select(imported_from("id").alias("path")).collect()
    assert row.path == pyspark.__file__


def test_the_sessions_jvm_maps_the_class_archive_it_names(spark: Any) -> None:
    """A JVM that cannot use the archive it is given (another class path, another build)
    goes on without it, silently: the archive must be mapped in the JVM's memory."""
    from aggspark.session import LOCAL_JAVA_OPTIONS

    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert LOCAL_JAVA_OPTIONS in options
    if "-XX:SharedArchiveFile=" not in options:
        pytest.skip("this session's JVM writes the archive (or another one was writing it)")
    archive = options.split("-XX:SharedArchiveFile=")[1].split()[0]
    jvm = spark.sparkContext._gateway.proc.pid
    assert archive in Path(f"/proc/{jvm}/maps").read_text()


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
                stop.wait(0.01)  # a steady stream, not a flat-out one: the read's CPU is Spark's

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

    from aggspark.source import AggviewReader

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
                stop.wait(0.01)  # steady, not flat out: each scan reads up to 5,000 rows

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
    command = [str(script)] if script.exists() else [sys.executable, "-m", "aggcli.cli"]
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


def test_bulk_load_retries_timestamp_order_aborts_while_clients_write_its_table(
    cluster: LocalCluster, client: Client, table_name: str
) -> None:
    """Clients updating the rows a load inserts read them at younger timestamps, so the load's
    older inserts lose to them (timestamp order): the load runs again at a new timestamp, as a
    transaction is retried, instead of failing the job with TooLate. (Under writes that never
    stop, a load of many rows keeps losing: the writers stop during the load's retries.)"""
    from aggspark.source import stage_rows, staging_name

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
