"""Views over views and subqueries on a cluster, in sync and async, against duckdb's
recomputation after every round of concurrent random transactions (inserts, deletes, updates
of values, join keys and group keys, in any table, children before parents); and what stays
refused, by name."""

from __future__ import annotations

import itertools
import random
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import own_cluster
from test_views_differential import (
    Model,
    assert_same,
    create_tables,
    random_row,
    recompute,
    run_round,
)

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggview import errors

_runs = itertools.count()


def rich_seed(start: int, tables: int) -> int:
    """The first seed from ``start`` whose tables start with 4 rows or more each
    (``create_tables`` draws 0-6): a view over empty tables would test nothing."""
    for seed in itertools.count(start):
        rng, counts = random.Random(seed), []
        for _ in range(tables):
            counts.append(rng.randint(0, 6))
            for _ in range(counts[-1]):
                random_row(rng, 0)
        if min(counts) >= 4:
            return seed
    raise AssertionError("unreachable")


def modes_equal_recomputation(
    cluster: LocalCluster,
    tables: int,
    inner: list[str],
    outer: str,
    spec: dict[str, Any],
    seed: int,
) -> list[int]:
    """Sync views ``inner`` (SELECTs over tables {0}, {1}, ... and earlier inner views {i0},
    ...), then ``outer`` over them as a sync and an async view: after each of three rounds both
    equal duckdb's recomputation, as they do when created; returns the number of rows as
    created (deterministic: one writer so far) and after each round (not: the writers race)."""
    run = f"lay{next(_runs)}"
    names = [f"{run}_t{i}" for i in range(tables)]
    seed = rich_seed(seed, tables)
    model = Model(names)
    sizes = []
    with Client(cluster.address, timeout=60) as client:
        create_tables(client, names, model, random.Random(seed))
        views: list[tuple[str, str]] = []
        for j, select in enumerate(inner):
            text = select.format(*names, **{f"i{n}": v for n, (v, _) in enumerate(views)})
            views.append((f"{run}_i{j}", text))
            client.sql(f"CREATE MATERIALIZED VIEW {run}_i{j} AS {text}")
        select = outer.format(*names, **{f"i{n}": v for n, (v, _) in enumerate(views)})
        client.sql(f"CREATE MATERIALIZED VIEW {run}_sync AS {select}")
        client.sql(
            f"CREATE MATERIALIZED VIEW {run}_async WITH (refresh = 'async', interval_ms = 60000)"
            f" AS {select}"
        )
        for round_number in range(-1, 3):  # -1: as created, before any concurrent writer
            if round_number >= 0:
                run_round(cluster.address, model, seed + round_number, clients=3, per_client=4)
            client.refresh(f"{run}_async")
            with client.snapshot() as snapshot:  # no write since: every view at this state
                expected = recompute(snapshot, names, select, tuple(views))
            assert_same(client.view(f"{run}_sync"), expected, spec)
            assert_same(client.view(f"{run}_async"), expected, spec)
            sizes.append(len(expected))
        for view in (f"{run}_sync", f"{run}_async", *(v for v, _ in reversed(views))):
            client.sql(f"DROP MATERIALIZED VIEW {view}")
    return sizes


# (inner views, the outer view, how many group columns and aggregates the outer shows)
LAYERED = {
    "aggregate of aggregates": (
        ["SELECT g, k, COUNT(*) AS n, SUM(v) AS s, MIN(x) AS lo FROM {0} GROUP BY g, k"],
        "SELECT g AS g0, MAX(n) AS agg0, SUM(s) AS agg1, COUNT(*) AS agg2, MIN(lo) AS agg3 "
        "FROM {i0} GROUP BY g",
    ),
    "joined with a table": (
        ["SELECT k, SUM(v) AS s, COUNT(*) AS n FROM {1} GROUP BY k HAVING COUNT(*) > 1"],
        "SELECT a.g AS g0, COUNT(*) AS agg0, SUM(i.s) AS agg1 FROM {0} a "
        "JOIN {i0} i ON a.k = i.k GROUP BY a.g",
    ),
    "a bag over a join, three levels": (
        [
            "SELECT DISTINCT k FROM {1} WHERE x > 1",
            "SELECT a.g, a.k, a.v FROM {0} a JOIN {i0} d ON a.k = d.k",
        ],
        "SELECT g AS g0, SUM(v) AS agg0, COUNT(*) AS agg1 FROM {i1} GROUP BY g",
    ),
}


@pytest.mark.parametrize("shape", LAYERED)
def test_views_over_sync_views_equal_recomputation(cluster: LocalCluster, shape: str) -> None:
    inner, outer = LAYERED[shape]
    spec = {"group": ["g0"], "aggregates": ["exact"] * outer.count(" AS agg")}
    sizes = modes_equal_recomputation(cluster, 2, inner, outer, spec, seed=len(shape))
    assert sizes[0], "the view is empty as created: the seed tests nothing"


def test_what_views_over_views_refuse_by_name(client: Client) -> None:
    run = f"ref{next(_runs)}"
    client.sql(f"CREATE TABLE {run}_t (id INT PRIMARY KEY, k INT, v INT)")
    client.sql(f"CREATE MATERIALIZED VIEW {run}_s AS SELECT k, SUM(v) AS s FROM {run}_t GROUP BY k")
    client.sql(
        f"CREATE MATERIALIZED VIEW {run}_a WITH (refresh = 'async') AS "
        f"SELECT k, COUNT(*) AS n FROM {run}_t GROUP BY k"
    )
    over = f"SELECT COUNT(*) AS n, SUM(s) AS total FROM {run}_s"
    with pytest.raises(errors.InvalidArgument, match="needs the inner view to be sync"):
        client.sql(f"CREATE MATERIALIZED VIEW {run}_o1 AS SELECT SUM(n) AS n FROM {run}_a")
    with pytest.raises(errors.InvalidArgument, match="refresh = 'sync' or 'async'"):
        client.sql(f"CREATE MATERIALIZED VIEW {run}_o2 WITH (refresh = 'cumulus') AS {over}")
    client.sql(f"CREATE MATERIALIZED VIEW {run}_o AS {over}")
    with pytest.raises(errors.FailedPrecondition, match=f"read by {run}_o; drop it first"):
        client.sql(f"DROP MATERIALIZED VIEW {run}_s")
    with pytest.raises(errors.FailedPrecondition, match="views over views"):
        client.sql(f"ALTER MATERIALIZED VIEW {run}_s SET (refresh = 'async')")
    with client.transaction() as tx:
        for i in range(6):
            tx.insert(f"{run}_t", {"id": i, "k": i % 2, "v": i})
    assert list(client.view(f"{run}_o")) == [{"n": 2, "total": 15}]
    client.sql(f"DROP MATERIALIZED VIEW {run}_o")
    client.sql(f"DROP MATERIALIZED VIEW {run}_s")


def test_concurrent_writers_of_one_inner_group_keep_the_outer_view_exact(client: Client) -> None:
    """Writers of one hot group of the inner view each read its row and merge into it: an
    older writer's merge arriving after a younger one read the row is too late (retried), so
    the outer view, which depends on the inner row's value, stays exact."""
    run = f"hot{next(_runs)}"
    client.sql(f"CREATE TABLE {run}_t (id INT PRIMARY KEY, k INT, v INT)")
    client.sql(f"CREATE MATERIALIZED VIEW {run}_i AS SELECT k, SUM(v) AS s FROM {run}_t GROUP BY k")
    client.sql(
        f"CREATE MATERIALIZED VIEW {run}_o AS SELECT COUNT(*) AS n, SUM(s) AS total, "
        f"MAX(s) AS top, MIN(s) AS low FROM {run}_i"
    )
    ids = itertools.count()

    def write(worker: int) -> None:
        rng = random.Random(worker)
        with Client(client.address) as mine:
            for _ in range(15):
                with mine.transaction() as tx:
                    for _ in range(2):
                        row_id = next(ids)
                        tx.insert(f"{run}_t", {"id": row_id, "k": rng.randrange(2), "v": 1})

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sums = {}
    for row in client.scan(f"{run}_t"):
        sums[row["k"]] = sums.get(row["k"], 0) + row["v"]
    want = {"n": len(sums), "total": 120, "top": max(sums.values()), "low": min(sums.values())}
    assert list(client.view(f"{run}_o")) == [want]
    client.sql(f"DROP MATERIALIZED VIEW {run}_o")
    client.sql(f"DROP MATERIALIZED VIEW {run}_i")


# each shape of subquery (issue #41), over tables {0} and {1}: duckdb runs the same SELECT
SUBQUERIES = {
    "derived table": "SELECT s.g AS g0, MAX(s.n) AS agg0, SUM(s.t) AS agg1, COUNT(*) AS agg2 "
    "FROM (SELECT g, k, COUNT(*) AS n, SUM(v) AS t FROM {0} GROUP BY g, k) s GROUP BY s.g",
    "derived table joined": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a JOIN "
    "(SELECT k, SUM(v) AS s FROM {1} GROUP BY k) b ON a.k = b.k WHERE a.v < b.s GROUP BY a.g",
    "IN": "SELECT a.g AS g0, COUNT(*) AS agg0, SUM(a.v) AS agg1 FROM {0} a "
    "WHERE a.x IN (SELECT b.k FROM {1} b WHERE b.v > 0) GROUP BY a.g",
    "EXISTS": "SELECT a.g AS g0, COUNT(*) AS agg0, SUM(a.v) AS agg1 FROM {0} a "
    "WHERE EXISTS (SELECT 1 FROM {1} b WHERE b.k = a.k AND b.x > 2) GROUP BY a.g",
    "EXISTS by key": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a "
    "WHERE EXISTS (SELECT 1 FROM {1} b WHERE b.id = a.k AND b.x > 1) GROUP BY a.g",
    "uncorrelated scalar": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a "
    "WHERE a.v > (SELECT AVG(b.v) FROM {1} b WHERE b.x IS NOT NULL) GROUP BY a.g",
    "correlated scalar": "SELECT a.g AS g0, COUNT(*) AS agg0, SUM(a.v) AS agg1 FROM {0} a "
    "WHERE a.v >= (SELECT MAX(b.v) FROM {1} b WHERE b.k = a.k) GROUP BY a.g",
    "HAVING scalar": "SELECT a.g AS g0, SUM(a.v) AS agg0 FROM {0} a GROUP BY a.g "
    "HAVING SUM(a.v) > (SELECT SUM(b.v) * 0.1 FROM {1} b)",
    "EXISTS <>": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a WHERE EXISTS (SELECT 1 FROM "
    "{1} b WHERE b.k = a.k AND b.x <> a.x) AND NOT EXISTS (SELECT 1 FROM {1} c WHERE "
    "c.k = a.k AND c.g <> a.g AND c.v > 0) GROUP BY a.g",
    "correlated arithmetic": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a "
    "WHERE a.v < (SELECT 0.5 * AVG(b.v) + 1 FROM {1} b WHERE b.k = a.k) GROUP BY a.g",
}


# anti-joins and LEFT JOIN (issue #41): an outer alias, a NULL row where nothing matches
OUTER = {
    "NOT EXISTS": "SELECT a.g AS g0, COUNT(*) AS agg0, SUM(a.v) AS agg1 FROM {0} a "
    "WHERE NOT EXISTS (SELECT 1 FROM {1} b WHERE b.k = a.k AND b.x > 2) GROUP BY a.g",
    "NOT EXISTS on a nullable key": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a "
    "WHERE NOT EXISTS (SELECT 1 FROM {1} b WHERE b.x = a.x) GROUP BY a.g",
    "NOT IN over a nullable column": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a "
    "WHERE a.x NOT IN (SELECT b.x FROM {1} b WHERE b.k = a.k) GROUP BY a.g",
    "LEFT JOIN counts": "SELECT a.g AS g0, COUNT(*) AS agg0, COUNT(b.x) AS agg1, "
    "SUM(b.v) AS agg2, MAX(b.x) AS agg3 FROM {0} a LEFT JOIN {1} b ON b.k = a.k GROUP BY a.g",
    "LEFT JOIN grouped by its NULLs": "SELECT b.g AS g0, COUNT(*) AS agg0, SUM(a.v) AS agg1 "
    "FROM {0} a LEFT OUTER JOIN {1} b ON a.x = b.k GROUP BY b.g",
    "LEFT JOIN ON filter": "SELECT a.g AS g0, COUNT(*) AS agg0, COUNT(b.x) AS agg1 FROM {0} a "
    "LEFT JOIN {1} b ON b.k = a.k AND b.x > 1 GROUP BY a.g",
    "LEFT JOIN by key, IS NULL": "SELECT a.g AS g0, COUNT(*) AS agg0 FROM {0} a "
    "LEFT JOIN {1} b ON b.id = a.x WHERE b.id IS NULL GROUP BY a.g",
}


@pytest.mark.parametrize("shape", {**SUBQUERIES, **OUTER})
def test_subqueries_equal_recomputation_in_sync_and_async(
    cluster: LocalCluster, shape: str
) -> None:
    outer = {**SUBQUERIES, **OUTER}[shape]
    spec = {"group": ["g0"], "aggregates": ["exact"] * outer.count(" AS agg")}
    sizes = modes_equal_recomputation(cluster, 2, [], outer, spec, seed=len(shape))
    assert sizes[0], "the view is empty as created: the seed tests nothing"


def test_hidden_views_live_and_die_with_their_view(client: Client) -> None:
    """A subquery's hidden view is listed under its reserved name, readable, never dropped
    alone, and dropped with its view; a user cannot name a view so."""
    run = f"hid{next(_runs)}"
    client.sql(f"CREATE TABLE {run}_t (id INT PRIMARY KEY, k INT, v INT)")
    with client.transaction() as tx:
        for i in range(6):
            tx.insert(f"{run}_t", {"id": i, "k": i % 3, "v": i})
    client.sql(
        f"CREATE MATERIALIZED VIEW {run}_v AS SELECT COUNT(*) AS n FROM {run}_t t "
        f"WHERE t.v > (SELECT AVG(u.v) FROM {run}_t u)"
    )
    hidden = f"__sub_{run}_v_1"
    assert hidden in BulkClient(client).list()[1]
    assert [dict(r) for r in client.view(hidden)] == [{"v0": Decimal("2.5")}]
    assert list(client.view(f"{run}_v")) == [{"n": 3}]
    with pytest.raises(errors.FailedPrecondition, match=f"read by {run}_v"):
        client.sql(f"DROP MATERIALIZED VIEW {hidden}")
    with pytest.raises(errors.InvalidArgument, match="hidden views of subqueries"):
        client.sql(f"CREATE MATERIALIZED VIEW __sub_{run} AS SELECT COUNT(*) FROM {run}_t")
    with pytest.raises(errors.InvalidArgument, match="refresh = 'sync' or 'async'"):
        client.sql(
            f"CREATE MATERIALIZED VIEW {run}_c WITH (refresh = 'cumulus') AS SELECT COUNT(*) "
            f"AS n FROM {run}_t t WHERE t.v > (SELECT COUNT(DISTINCT u.k) FROM {run}_t u)"
        )
    client.sql(f"DROP MATERIALIZED VIEW {run}_v")
    assert not [v for v in BulkClient(client).list()[1] if v.startswith(f"__sub_{run}")]
    client.sql(f"DROP TABLE {run}_t")  # nothing reads it any more


def test_views_over_views_and_hidden_views_survive_a_restart(tmp_path: Path) -> None:
    """After a restart the catalog's views come back in number order (a view after those it
    reads, whatever their names) and maintenance cascades as before."""
    with own_cluster(tmp_path, ltms=2, processes=1) as cluster:
        with Client(cluster.address, timeout=30) as client:
            client.sql("CREATE TABLE t (id INT PRIMARY KEY, k INT, v INT)")
            client.sql(
                "CREATE MATERIALIZED VIEW z_inner AS SELECT k, SUM(v) AS s FROM t GROUP BY k"
            )
            client.sql(
                "CREATE MATERIALIZED VIEW a_outer AS SELECT COUNT(*) AS n, MAX(s) AS top "
                "FROM z_inner WHERE k IN (SELECT t.k FROM t WHERE t.v > 1)"
            )
            with client.transaction() as tx:
                tx.insert("t", {"id": 1, "k": 1, "v": 2})
        cluster.stop()
        cluster.start()
        with Client(cluster.address, timeout=30) as client:
            with client.transaction() as tx:
                tx.insert("t", {"id": 2, "k": 1, "v": 5})
            with client.transaction() as tx:
                tx.insert("t", {"id": 3, "k": 2, "v": 1})
            assert list(client.view("a_outer")) == [{"n": 1, "top": 7}]


def test_a_view_over_a_one_row_subquery_alone_has_its_row_over_no_rows(client: Client) -> None:
    """SQL gives an aggregate without GROUP BY its row over no rows; a view over such a
    subquery alone counts that row in sync and async (initialized from the hidden view's
    rows, which have it); cumulus refuses it by name (its maps start empty)."""
    run = f"one{next(_runs)}"
    client.sql(f"CREATE TABLE {run}_t (id INT PRIMARY KEY, k INT, v INT)")
    select = (
        f"SELECT COUNT(*) AS n, SUM(d.c) AS c, MAX(d.s) AS s FROM "
        f"(SELECT SUM(v) AS s, COUNT(*) AS c FROM {run}_t WHERE k > 0) d"
    )
    client.sql(f"CREATE MATERIALIZED VIEW {run}_sync AS {select}")
    client.sql(
        f"CREATE MATERIALIZED VIEW {run}_async WITH (refresh = 'async', interval_ms = 60000) "
        f"AS {select}"
    )
    with pytest.raises(errors.InvalidArgument, match="one row alone .* not 'cumulus'"):
        client.sql(f"CREATE MATERIALIZED VIEW {run}_c WITH (refresh = 'cumulus') AS {select}")
    writes = [
        f"INSERT INTO {run}_t VALUES (1, 1, 5)",
        f"INSERT INTO {run}_t VALUES (2, 0, 7)",  # filtered out
        f"DELETE FROM {run}_t WHERE id = 1",
    ]
    expected = [(1, 0, None), (1, 1, 5), (1, 1, 5), (1, 0, None)]
    for step, want in enumerate(expected):
        if step:
            client.sql(writes[step - 1])
        client.refresh(f"{run}_async")
        for view in (f"{run}_sync", f"{run}_async"):
            assert [tuple(r.values()) for r in client.view(view)] == [want], (view, step)
    for view in (f"{run}_sync", f"{run}_async"):
        client.sql(f"DROP MATERIALIZED VIEW {view}")
