"""Views end to end: the dashboard schema, hot groups, bad input, restarts."""

from __future__ import annotations

import copy
import itertools
import random
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lookup_check import lookup_mismatches

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.merge import accumulate, combine, gather
from aggview.partition_map import group_of, partial_key, partition_of
from coordinator.adhoc import load_rows
from loadgen import dashboard

SMALL = dashboard.Scale(shops=5, products=40, categories=4)


def recompute(client: Client, select: str) -> list[tuple]:  # type: ignore[type-arg]
    con = duckdb.connect()
    for ddl in dashboard.TABLES:
        con.execute(ddl.replace("PRIMARY KEY", ""))
    for table in ("categories", "shops", "products", "events"):
        rows = client.scan(table)
        if rows:
            load_rows(con, table, [tuple(r.values()) for r in rows], list(rows[0]))
    return sorted(con.execute(select).fetchall(), key=repr)


def as_tuples(rows: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    return sorted((tuple(r.values()) for r in rows), key=repr)


@pytest.fixture
def dashboard_cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    # two members: a test kills member 1 under load
    cluster = LocalCluster(tmp_path / "data", ltms=3, processes=2, checkpoint_interval=0.5)
    cluster.start()
    try:
        with Client(cluster.address) as client:
            dashboard.create_schema(client)
            dashboard.populate(client, SMALL)
            rng = random.Random(7)
            with client.transaction() as tx:  # events before the views exist
                for i in range(30):
                    tx.insert("events", dashboard.event(rng, i, SMALL))
        yield cluster
    finally:
        cluster.stop()
        cluster.kill()
    assert not lookup_mismatches(tmp_path), lookup_mismatches(tmp_path)


def write_events(address: str, clients: int, per_client: int, seed: int) -> int:
    """Concurrent inserts, deletes and cost updates of events, and product moves between
    categories (group keys change through a join). Returns timestamp-order retries."""
    retries = []

    def work(worker: int) -> None:
        rng = random.Random(seed * 100 + worker)
        ids = itertools.count(10_000 * (worker + 1) + seed * 1000)
        mine: list[int] = []
        with Client(address) as client:
            for _ in range(per_client):
                with client.transaction() as tx:
                    for _ in range(rng.randint(1, 3)):
                        if mine and rng.random() < 0.3:
                            tx.delete("events", {"id": mine.pop(rng.randrange(len(mine)))})
                        elif mine and rng.random() < 0.3:
                            tx.update(
                                "events",
                                {"id": rng.choice(mine)},
                                {"cost": Decimal(rng.randrange(1, 900)) / 100},
                            )
                        else:
                            event_id = next(ids)
                            tx.insert("events", dashboard.event(rng, event_id, SMALL))
                            mine.append(event_id)
                    if rng.random() < 0.2:
                        tx.update(
                            "products",
                            {"id": rng.randrange(SMALL.products)},
                            {"cat_id": rng.randrange(SMALL.categories)},
                        )
            retries.append(client.retries)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(retries)


def test_dashboard_views_sync_and_async(dashboard_cluster: LocalCluster) -> None:
    address = dashboard_cluster.address
    with Client(address) as client:
        client.sql(dashboard.view_ddl("shop_category_cost", dashboard.SHOP_CATEGORY_COST))
        client.sql(dashboard.view_ddl("category_cost", dashboard.CATEGORY_COST))
        client.sql(
            dashboard.view_ddl("category_cost_async", dashboard.CATEGORY_COST, "async", 100_000)
        )
        write_events(address, clients=4, per_client=15, seed=1)
        expected = recompute(client, dashboard.SHOP_CATEGORY_COST)
        assert as_tuples(client.view("shop_category_cost")) == expected
        assert as_tuples(client.view("category_cost")) == recompute(client, dashboard.CATEGORY_COST)

        # SQL-1 as a point lookup by the full group key
        shop, category = expected[0][0], expected[0][1]
        answer = client.view("shop_category_cost", {"shop": shop, "category": category})
        assert as_tuples(answer) == [expected[0]]

        stale = client.view("category_cost_async")
        refreshed_at = client.refresh("category_cost_async")
        fresh = client.view("category_cost_async")
        assert stale.timestamp < refreshed_at == fresh.timestamp
        assert as_tuples(fresh) == recompute(client, dashboard.CATEGORY_COST)


def test_hot_group_writers_do_not_wait_for_each_other(dashboard_cluster: LocalCluster) -> None:
    address = dashboard_cluster.address
    with Client(address) as client:
        client.sql(
            "CREATE MATERIALIZED VIEW one_category AS SELECT p.cat_id, SUM(e.cost) AS cost, "
            "COUNT(*) AS n, MIN(e.cost) AS low FROM events e JOIN products p "
            "ON e.prod_id = p.id WHERE p.cat_id = 0 GROUP BY p.cat_id"
        )
    hot_products = [p for p in range(SMALL.products) if p % SMALL.categories == 0]
    retries = []

    def work(worker: int) -> None:
        rng = random.Random(worker)
        with Client(address) as client:
            for i in range(12):
                with client.transaction() as tx:
                    tx.insert(
                        "events",
                        {
                            **dashboard.event(rng, 50_000 + worker * 100 + i, SMALL),
                            "prod_id": rng.choice(hot_products),
                        },
                    )
            retries.append(client.retries)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with Client(address) as client:
        assert as_tuples(client.view("one_category")) == recompute(
            client,
            "SELECT p.cat_id, SUM(e.cost), COUNT(*), MIN(e.cost) FROM events e JOIN products p "
            "ON e.prod_id = p.id WHERE p.cat_id = 0 GROUP BY p.cat_id",
        )
    assert sum(retries) == 0, "writers to one group aborted each other"
    with Client(address) as client:  # the hot group is kept as partial rows, spread out
        bulk = BulkClient(client)
        store_table = bulk.describe("one_category").store_table
        lease, ts = bulk.hold_snapshot()
        try:
            stored = [kv for page in bulk.read_range("one_category", b"", b"", ts) for kv in page]
        finally:
            bulk.release_snapshot(lease)
    homes = {partition_of(store_table, key, dashboard_cluster.ltms) for key, _ in stored}
    assert len({group_of(key) for key, _ in stored}) == 1
    assert len(homes) > 1, "every writer merged into one row"
    assert {int.from_bytes(key[-2:], "big") for key, _ in stored} == homes


def test_partial_rows_add_up_and_cancel_out() -> None:
    """Unit: a group's partial rows are summed, multisets too; a group whose partials cancel
    is absent; a view from before partial rows is read as it is."""
    g1, g2 = b"\x01a", b"\x01b"
    rows = [
        (partial_key(g1, 0), {"_count": 2, "s0": 10, "m0": {3: 1, 4: 1}}),
        (partial_key(g1, 3), {"_count": -1, "s0": -4, "m0": {4: -1}}),
        (partial_key(g2, 1), {"_count": 1, "s0": 5}),
        (partial_key(g2, 2), {"_count": -1, "s0": -5}),
    ]
    assert gather(rows, partials=True) == {g1: {"_count": 1, "s0": 6, "m0": {3: 1}}}
    assert partition_of("u7_sales", partial_key(g1, 3), 4) == 3
    assert gather([(g1, {"_count": 1})], partials=False) == {g1: {"_count": 1}}


_NUMBERS = st.dictionaries(st.sampled_from(["_count", "s0"]), st.integers(-3, 3))
_MULTISETS = st.dictionaries(
    st.sampled_from(["m0", "m1"]), st.dictionaries(st.integers(0, 3), st.integers(-2, 2))
)
_DELTAS = st.lists(st.tuples(_NUMBERS, _MULTISETS).map(lambda p: {**p[0], **p[1]}), max_size=12)


@given(deltas=_DELTAS)
def test_accumulate_adds_in_place_as_combine_does(deltas: list[dict[str, Any]]) -> None:
    """Unit: a sum of deltas built in place equals the one ``combine`` builds, and leaves the
    deltas it read as they were (their multisets are copied, not shared)."""
    before = copy.deepcopy(deltas)
    expected: dict[str, Any] = {}
    total: dict[str, Any] = {}
    for delta in deltas:
        expected = combine(expected, delta)
        accumulate(total, delta)
    assert total == expected
    assert deltas == before


def test_a_group_whose_float_sums_do_not_cancel_exactly_is_gone_with_its_rows(
    client: Client, table_name: str
) -> None:
    """A join on a non-key column keeps the view as partial rows, one per partition that
    changed a group; FLOAT sums added up in another order than they were written leave a
    residue (-1.1e-13 was seen) when the group's rows are all gone. The group must go with
    its rows (``_count`` 0), in every read path: the differential test found it shown with
    COUNT(*) = 0."""
    facts, dims = f"{table_name}_f", f"{table_name}_d"
    client.sql(f"CREATE TABLE {facts} (id INT PRIMARY KEY, k INT, g TEXT, f FLOAT)")
    client.sql(f"CREATE TABLE {dims} (id INT PRIMARY KEY, k INT)")
    client.sql(
        f"CREATE MATERIALIZED VIEW {table_name}_v AS SELECT a.g, SUM(a.f) AS total, "
        f"COUNT(*) AS n FROM {facts} a JOIN {dims} b ON a.k = b.k GROUP BY a.g"
    )
    rng = random.Random(7)
    with client.transaction() as tx:
        for i in range(12):
            tx.insert(facts, {"id": i, "k": i % 3, "g": "x", "f": rng.uniform(-1000, 1000)})
    for i in range(9):  # the matches arrive from the other side, one partition at a time
        with client.transaction() as tx:
            tx.insert(dims, {"id": i, "k": i % 3})
    for i in range(12):
        with client.transaction() as tx:
            tx.update(facts, {"id": i}, {"f": rng.uniform(-1000, 1000)})
    assert [r["n"] for r in client.view(f"{table_name}_v")] == [36]
    for i in range(12):
        with client.transaction() as tx:
            tx.delete(facts, {"id": i})
    assert list(client.view(f"{table_name}_v")) == []
    assert list(client.sql(f"SELECT * FROM {table_name}_v")) == []


def test_min_survives_deleting_the_minimum(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT, v INT)")
    client.sql(
        f"CREATE MATERIALIZED VIEW {table_name}_mm AS SELECT g, MIN(v) AS low, MAX(v) AS high, "
        f"COUNT(DISTINCT v) AS kinds FROM {table_name} GROUP BY g"
    )
    with client.transaction() as tx:
        for i, v in enumerate([5, 1, 9, 1, 7]):
            tx.insert(table_name, {"id": i, "g": "x", "v": v})
    assert list(client.view(f"{table_name}_mm")) == [{"g": "x", "low": 1, "high": 9, "kinds": 4}]
    with client.transaction() as tx:
        tx.delete(table_name, {"id": 1})
        tx.delete(table_name, {"id": 2})
    assert list(client.view(f"{table_name}_mm")) == [{"g": "x", "low": 1, "high": 7, "kinds": 3}]
    with client.transaction() as tx:
        tx.delete(table_name, {"id": 3})
    assert list(client.view(f"{table_name}_mm")) == [{"g": "x", "low": 5, "high": 7, "kinds": 2}]


@pytest.mark.parametrize(
    "sql, error, fragment",
    [
        (
            "SELECT a.g, COUNT(*) FROM {t} a FULL JOIN {t} b ON a.id = b.id "
            "JOIN {t} c ON c.id = a.id GROUP BY a.g",
            errors.InvalidArgument,
            "a FULL JOIN beside other joins",
        ),
        ("SELECT g, SUM(g) FROM {t} GROUP BY g", errors.InvalidArgument, "SUM over TEXT"),
        (
            "SELECT g, COUNT(*) FROM {t} WHERE v > (SELECT 1) GROUP BY g",
            errors.InvalidArgument,
            "subquer",
        ),
        ("SELECT g, COUNT(*) FROM {t} GROUP BY g ORDER BY g", errors.InvalidArgument, "ORDER BY"),
        ("SELECT g, v, COUNT(*) FROM {t} GROUP BY g", errors.InvalidArgument, "GROUP BY"),
        ("SELECT g, COUNT(*) FROM nowhere GROUP BY g", errors.UnknownTable, "nowhere"),
        ("SELECT g, COUNT(nope) FROM {t} GROUP BY g", errors.InvalidArgument, "nope"),
    ],
)
def test_unsupported_views_are_refused(
    client: Client, cluster: LocalCluster, table_name: str, sql: str, error: type, fragment: str
) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT, v INT)")
    with pytest.raises(error, match=fragment):
        client.sql(f"CREATE MATERIALIZED VIEW {table_name}_v AS {sql.format(t=table_name)}")
    with pytest.raises(errors.UnknownTable):
        client.view(f"{table_name}_v")
    assert all(server.running() for server in cluster.servers)


def test_view_ddl_rules(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT, v INT)")
    view = f"{table_name}_v"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} WITH (refresh = 'async', interval_ms = 50) AS "
        f"SELECT g, COUNT(*) AS n FROM {table_name} GROUP BY g"
    )
    with pytest.raises(errors.AlreadyExists):
        client.sql(f"CREATE MATERIALIZED VIEW {view} AS SELECT COUNT(*) FROM {table_name}")
    with pytest.raises(errors.AlreadyExists):
        client.sql(f"CREATE TABLE {view} (id INT PRIMARY KEY)")
    with pytest.raises(errors.FailedPrecondition, match=view):
        client.sql(f"DROP TABLE {table_name}")
    with pytest.raises(errors.InvalidArgument, match="interval"):
        client.sql(f"ALTER MATERIALIZED VIEW {view} SET (interval_ms = -5)")
    client.sql(f"ALTER MATERIALIZED VIEW {view} SET (interval_ms = 20)")
    with client.transaction() as tx:
        tx.insert(table_name, {"id": 1, "g": "a", "v": 1})
    for _ in range(100):  # the refresher runs by itself every 20 ms
        if list(client.view(view)) == [{"g": "a", "n": 1}]:
            break
        threading.Event().wait(0.05)
    assert list(client.view(view)) == [{"g": "a", "n": 1}]
    with pytest.raises(errors.InvalidArgument, match="no column"):
        client.view(view, {"colour": "red"})
    client.sql(f"DROP MATERIALIZED VIEW {view}")
    client.sql(f"DROP TABLE {table_name}")


def test_views_survive_a_restart(dashboard_cluster: LocalCluster) -> None:
    cluster = dashboard_cluster
    with Client(cluster.address) as client:
        client.sql(dashboard.view_ddl("category_cost", dashboard.CATEGORY_COST))
        client.sql(dashboard.view_ddl("category_cost_async", dashboard.CATEGORY_COST, "async", 50))
        write_events(cluster.address, clients=2, per_client=8, seed=3)
    cluster.stop()
    cluster.servers.clear()
    cluster.start()
    write_events(cluster.address, clients=2, per_client=8, seed=4)
    with Client(cluster.address) as client:
        expected = recompute(client, dashboard.CATEGORY_COST)
        assert as_tuples(client.view("category_cost")) == expected
        client.refresh("category_cost_async")
        assert as_tuples(client.view("category_cost_async")) == expected


@pytest.mark.parametrize("victim", ["ltm", "coordinator"])
def test_views_stay_exact_across_kill_9(dashboard_cluster: LocalCluster, victim: str) -> None:
    """kill -9 under view-maintaining load: acknowledged or not, every transaction is all or
    nothing, so after the restart the views still equal recomputation."""
    cluster = dashboard_cluster
    with Client(cluster.address) as client:
        client.sql(dashboard.view_ddl("category_cost", dashboard.CATEGORY_COST))
        client.sql(dashboard.view_ddl("category_cost_async", dashboard.CATEGORY_COST, "async", 50))
    stop = threading.Event()

    def load(worker: int) -> None:
        rng = random.Random(worker)
        ids = itertools.count(100_000 * (worker + 1))
        with Client(cluster.address, timeout=10) as client:
            while not stop.is_set():
                try:
                    with client.transaction() as tx:
                        tx.insert("events", dashboard.event(rng, next(ids), SMALL))
                        if rng.random() < 0.3:
                            tx.update(
                                "products",
                                {"id": rng.randrange(SMALL.products)},
                                {"cat_id": rng.randrange(SMALL.categories)},
                            )
                except errors.AggviewError:
                    stop.wait(0.05)  # server down: the outcome is unknown, go on

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        threading.Event().wait(1.0)
        server = cluster.member(1) if victim == "ltm" else cluster.coordinator
        server.kill()
        threading.Event().wait(0.3)
        server.start()
        threading.Event().wait(1.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    with Client(cluster.address, timeout=30) as client:
        for attempt in range(100):  # until the restarted server has resolved what it holds
            try:
                expected = recompute(client, dashboard.CATEGORY_COST)
                sync_rows = as_tuples(client.view("category_cost"))
                client.refresh("category_cost_async")
                async_rows = as_tuples(client.view("category_cost_async"))
                break
            except errors.Unavailable:
                if attempt == 99:
                    raise
                threading.Event().wait(0.1)
        assert sync_rows == expected
        assert async_rows == expected


def test_dropping_the_last_sync_view_over_an_index_drops_the_index(
    dashboard_cluster: LocalCluster,
) -> None:
    from ltm.store import open_store

    def indexes() -> set[str]:
        store = open_store(dashboard_cluster.store_url)
        try:
            return {t for t in store.list_tables() if t.startswith("j") and t.endswith("_events")}
        finally:
            store.close()

    with Client(dashboard_cluster.address) as client:
        client.sql(dashboard.view_ddl("one", dashboard.CATEGORY_COST))
        client.sql(dashboard.view_ddl("two", dashboard.CATEGORY_COST))
        assert len(indexes()) == 1  # events.prod_id, shared
        client.sql("DROP MATERIALIZED VIEW one")
        assert len(indexes()) == 1  # still joined through by view two
        client.sql("DROP MATERIALIZED VIEW two")
        assert indexes() == set()
        write_events(dashboard_cluster.address, clients=1, per_client=3, seed=9)  # still fine
        client.sql(dashboard.view_ddl("three", dashboard.CATEGORY_COST))
        assert as_tuples(client.view("three")) == recompute(client, dashboard.CATEGORY_COST)
