"""The Spark layer's view jobs on a real cluster and a real local Spark session: views
initialized and verified by Spark SQL while clients write, and failures half-way (split from
test_spark.py so the two run on separate workers)."""

from __future__ import annotations

import contextlib
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

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggspark import jobs
from aggspark.compute import compute_states
from aggview import errors
from aggview.rowcodec import decode_stored, encode_stored
from loadgen import dashboard
from ltm.store import open_store

SMALL = dashboard.Scale(shops=5, products=40, categories=4)
SHOP_TOTALS = (
    "SELECT p.shop_id, COUNT(*) AS n, SUM(e.cost) AS cost, AVG(e.cost) AS mean, "
    "MIN(e.cost) AS low, MAX(e.cost) AS high, COUNT(DISTINCT e.prod_id) AS products "
    "FROM events e JOIN products p ON e.prod_id = p.id WHERE e.cost > 0.25 GROUP BY p.shop_id"
)


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


PACE = 0.05  # seconds between a writer's transactions


def churn(address: str, seed: int, stop: threading.Event, count: list[int]) -> None:
    """Inserts, updates (moving events between products, so between groups) and deletes, a
    transaction every 50 ms: writes in every phase of a Spark job, without the CPU of writing
    flat out while it runs (which slowed the job and the rest of the suite)."""
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
            stop.wait(PACE)


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


# a theta join (issue #41): each event counts for every shop with a higher id, found by a
# scan of shops in sync and async maintenance, a guard in M3, a non-equi join in Spark SQL
THETA_TOTALS = (
    "SELECT s.id AS shop, COUNT(*) AS n, SUM(e.cost) AS cost FROM events e JOIN shops s "
    "ON e.shop_id < s.id WHERE e.cost > 0.25 GROUP BY s.id"
)

# a LEFT JOIN (issue #41): every shop, those without events included (COUNT(*) counts their
# NULL row, COUNT(e.id) does not); Spark SQL computes the same LEFT JOIN
LEFT_TOTALS = (
    "SELECT s.id AS shop, COUNT(*) AS n, COUNT(e.id) AS events, SUM(e.cost) AS cost "
    "FROM shops s LEFT JOIN events e ON e.shop_id = s.id GROUP BY s.id"
)

# scalar functions (issue #41) in WHERE and aggregate arguments: Spark SQL's ABS, GREATEST,
# LEAST, EXTRACT and SUBSTRING give what maintenance and M3 compute
FUNCTION_TOTALS = (
    "SELECT e.shop_id AS shop, COUNT(*) AS n, SUM(ABS(e.cost - 1)) AS spread, "
    "MAX(GREATEST(e.cost, 0.50)) AS top, MIN(EXTRACT(MONTH FROM e.day)) AS first_month, "
    "MAX(SUBSTRING(e.type FROM 1 FOR 3)) AS kind FROM events e WHERE LEAST(e.cost, 5) > 0.25 "
    "GROUP BY e.shop_id"
)


@pytest.mark.parametrize(
    ("mode", "select", "groups"),
    [
        ("sync", SHOP_TOTALS, SMALL.shops),
        ("async", SHOP_TOTALS, SMALL.shops),
        ("cumulus", SHOP_TOTALS, SMALL.shops),
        ("sync", THETA_TOTALS, SMALL.shops - 1),  # shop 0 has no lower id
        ("cumulus", THETA_TOTALS, SMALL.shops - 1),
        ("sync", LEFT_TOTALS, SMALL.shops),
        ("async", LEFT_TOTALS, SMALL.shops),
        ("cumulus", LEFT_TOTALS, SMALL.shops),  # the unmatched rows' map reads Rows_e[shop]
        ("sync", FUNCTION_TOTALS, SMALL.shops),
        ("cumulus", FUNCTION_TOTALS, SMALL.shops),
    ],
    ids=[
        "sync",
        "async",
        "cumulus",
        "sync-theta",
        "cumulus-theta",
        "sync-left",
        "async-left",
        "cumulus-left",
        "sync-functions",
        "cumulus-functions",
    ],
)
def test_bulk_init_while_clients_write_then_view_equals_recomputation(
    spark: Any, dashboard_cluster: LocalCluster, mode: str, select: str, groups: int
) -> None:
    """Spark computes the view at a snapshot (a cumulus view: its M3 program's maps, from
    their definitions) while two writers insert, move and delete events; the cluster
    installs it and applies what was captured after the snapshot."""
    address = dashboard_cluster.address
    with churning([address] * 2) as counts:
        before = sum(c[0] for c in counts)
        result = jobs.init_view(
            spark, address, sql=dashboard.view_ddl("shop_totals", select, mode, 200)
        )
        time.sleep(0.5)
    assert sum(c[0] for c in counts) > before  # writers never stopped
    assert result.groups == (groups if mode != "cumulus" else 0)
    assert result.entries > 0 if mode == "cumulus" else result.entries == 0
    with Client(address) as client:
        if mode != "sync":
            client.refresh("shop_totals")
        assert same(as_tuples(client.view("shop_totals")), recompute(client, select))
    # the options the command line passes for an insecure cluster
    insecure = {"ca": None, "token": None}
    [verified] = jobs.verify_views(spark, address, ["shop_totals"], client_options=insecure)
    assert verified.ok and verified.groups == groups


def test_a_cumulus_view_at_depth_1_is_initialized_with_the_relations_it_reads(
    spark: Any, dashboard_cluster: LocalCluster
) -> None:
    """At a bounded depth the program reads its base relations: Spark sends their rows with
    the maps, and the view stays exact while writers go on."""
    address = dashboard_cluster.address
    ddl = dashboard.view_ddl("shop_totals_d1", SHOP_TOTALS, "cumulus", 200, depth=1)
    with churning([address] * 2):
        result = jobs.init_view(spark, address, sql=ddl)
        time.sleep(0.5)
    assert result.entries > 0
    with Client(address) as client:
        client.refresh("shop_totals_d1")
        assert same(as_tuples(client.view("shop_totals_d1")), recompute(client, SHOP_TOTALS))
        client.sql("DROP MATERIALIZED VIEW shop_totals_d1")


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
    while two writers insert, move and delete events. A row changed on the way (as a wrong
    runtime would give it) is a difference naming its group and both values."""
    address = dashboard_cluster.address
    with Client(address) as client:
        client.sql(dashboard.view_ddl("shop_totals", SHOP_TOTALS, "cumulus", 100, 2, "speculative"))
    with churning([address] * 2):
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
    from aggspark.session import _java_major, check_java

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
