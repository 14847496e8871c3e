"""Views in the third mode, ``refresh = 'cumulus'``: compiled to M3 and maintained by the
Cumulus runtime, fed the committed changes of our transactions, and read at the last committed
epoch. Every epoch's read must equal an independent engine's (duckdb) recomputation over the
base tables at the epoch's timestamp: random schemas and views, random concurrent multi-table
transactions (deletes, updates of join and group keys), random runtimes (1-3 DW nodes,
speculative or conservative, in the coordinating process or in processes of their own)."""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import own_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_views_differential import (
    Model,
    assert_same,
    create_tables,
    random_row,
    recompute,
    run_round,
    view_select,
    view_specs,
)

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.schema import TableSchema
from aggview.values import encode_entry
from coordinator.member_switch import DELAY_ENV
from cumulus.m3.compiler import compile_program
from cumulus.plan import ViewPlan

_runs = itertools.count()


@settings(
    max_examples=examples(4, 8),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    spec=view_specs(),
    nodes=st.integers(1, 3),
    mode=st.sampled_from(["speculative", "conservative"]),
    host=st.sampled_from(["local", "local", "grpc"]),
    feed=st.sampled_from(["", ", feed_ms = 20"]),
    depth=st.sampled_from(["", ", depth = 1", ", depth = 2"]),
)
def test_cumulus_views_equal_recomputation(
    cluster: LocalCluster, spec: dict, nodes: int, mode: str, host: str, feed: str, depth: str
) -> None:
    run = next(_runs)
    names = [f"c{run}_t{i}" for i in range(spec["tables"])]
    rng = random.Random(spec["seed"])
    model = Model(names)
    with Client(cluster.address) as client:
        create_tables(client, names, model, rng)
        select = view_select(spec, names)
        view = f"c{run}_cumulus"
        client.sql(
            f"CREATE MATERIALIZED VIEW {view} WITH (refresh = 'cumulus', nodes = {nodes}, "
            f"epoch_ms = 60000, mode = '{mode}', host = '{host}'{feed}{depth}) AS {select}"
        )
        assert_same(client.view(view), recompute(client, names, select), spec)
        for round_number in range(3):
            run_round(cluster.address, model, spec["seed"] + round_number, clients=3, per_client=3)
            epoch = client.refresh(view)  # an epoch now (the scheduled one is a minute away)
            rows = client.view(view)
            assert rows.timestamp == epoch
            with client.snapshot() as snapshot:  # no write since the epoch: same state
                expected = recompute(snapshot, names, select)
            assert_same(rows, expected, spec)
            tentative = client.view(view, consistency="tentative")  # at rest: the same
            assert tentative.tentative
            assert_same(tentative, expected, spec)
        client.sql(f"DROP MATERIALIZED VIEW {view}")


def test_tentative_reads_run_ahead_of_the_epochs_and_say_so(
    client: Client, table_name: str
) -> None:
    """With feed_ms, committed changes reach the runtime between epochs: a tentative read
    (``view``, SQL, the query layer) holds them before the next epoch does, and says it is
    tentative; committed reads stay at the last epoch. Every other view answers a tentative
    read with its exact one."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g INT, v INT)")
    view, exact = f"{table_name}_v", f"{table_name}_sync"
    select = f"SELECT g, SUM(v) AS s, COUNT(*) AS n FROM {table_name} GROUP BY g"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} WITH (refresh = 'cumulus', epoch_ms = 60000, "
        f"feed_ms = 20) AS {select}"
    )
    client.sql(f"CREATE MATERIALIZED VIEW {exact} AS {select}")
    epoch = client.view(view).timestamp
    with client.transaction() as tx:
        for i in range(12):
            tx.insert(table_name, {"id": i, "g": i % 3, "v": i})
    want = sorted(client.sql(select), key=lambda r: r["g"])
    deadline = time.monotonic() + 10
    while sorted(ahead := client.view(view, consistency="tentative"), key=lambda r: r["g"]) != want:
        assert time.monotonic() < deadline, f"no feed within 10 s: {list(ahead)}"
        time.sleep(0.02)
    assert ahead.tentative and ahead.timestamp > epoch
    committed = client.view(view)
    assert list(committed) == [] and committed.timestamp == epoch and not committed.tentative
    total = client.query(view, rollup=[], consistency="tentative")
    assert total.tentative and list(total) == [{"s": 66, "n": 12}]
    assert client.sql(f"SELECT SUM(s) AS s FROM {view}", consistency="tentative").tentative
    synced = client.view(exact, consistency="tentative")
    assert not synced.tentative and sorted(synced, key=lambda r: r["g"]) == want
    # a subscription to tentative changes reaches the same rows before any epoch; one to
    # committed ones still holds the last epoch's
    tentative_watch = client.watch(view, consistency="tentative")
    committed_watch = client.watch(view)
    try:
        by_group = {(r["g"],): r for r in want}
        deadline = time.monotonic() + 10
        while tentative_watch.copy.rows != by_group:
            assert time.monotonic() < deadline, f"tentative copy: {tentative_watch.copy.rows}"
            time.sleep(0.02)
        assert tentative_watch.copy.tentative
        while not committed_watch.copy.timestamp:  # its first message
            assert time.monotonic() < deadline, "no first message of the committed watch"
            time.sleep(0.02)
        assert committed_watch.copy.rows == {} and committed_watch.copy.timestamp == epoch
        assert not committed_watch.copy.tentative
        client.refresh(view)
        assert sorted(client.view(view), key=lambda r: r["g"]) == want
        deadline = time.monotonic() + 10
        while committed_watch.copy.rows != by_group:
            assert time.monotonic() < deadline, f"committed copy: {committed_watch.copy.rows}"
            time.sleep(0.02)
    finally:
        tentative_watch.stop()
        committed_watch.stop()
    with pytest.raises(errors.InvalidArgument, match="consistency must be 'committed' or"):
        client.view(view, consistency="newest")
    with pytest.raises(errors.InvalidArgument, match="feed_ms must be between 0 and epoch_ms"):
        client.sql(f"ALTER MATERIALIZED VIEW {view} SET (epoch_ms = 10)")
    with pytest.raises(errors.InvalidArgument, match="feed_ms applies only"):
        client.sql(f"ALTER MATERIALIZED VIEW {exact} SET (feed_ms = 10)")
    for name in (view, exact):
        client.sql(f"DROP MATERIALIZED VIEW {name}")


def test_cumulus_view_epochs_run_on_their_own_and_survive_a_restart(tmp_path: Path) -> None:
    """Epochs come every epoch_ms without anyone asking. After a restart each runtime loads a
    new snapshot: the changes captured before it (never drained: the slow view's epoch is a
    minute) are in that snapshot and must not count again, those after it count once."""
    rng = random.Random(3)
    select = "SELECT g, SUM(v) AS s, COUNT(*) AS n, MIN(x) AS low FROM ev GROUP BY g"
    with own_cluster(tmp_path, ltms=2, processes=1) as cluster:
        with Client(cluster.address) as client:
            client.sql("CREATE TABLE ev (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)")
            for name, epoch_ms in (("fast", 50), ("slow", 60000)):
                client.sql(
                    f"CREATE MATERIALIZED VIEW {name} WITH (refresh = 'cumulus', "
                    f"epoch_ms = {epoch_ms}) AS {select}"
                )
            ids = _write(client, rng, range(0, 60))
            _wait_for_epoch_after(client, "fast", client.view("fast").timestamp)
        cluster.stop()
        cluster.start()
        with Client(cluster.address) as client:
            _write(client, rng, range(60, 120), ids)
            for name in ("fast", "slow"):
                epoch = client.refresh(name)
                rows = client.view(name)
                # the fast view's own next epoch (50 ms) may come between the two calls
                assert rows.timestamp == epoch or (name == "fast" and rows.timestamp > epoch)
                with client.snapshot() as snapshot:
                    expected = snapshot.sql(select)
                key = lambda r: repr(r["g"])  # noqa: E731
                assert sorted(rows, key=key) == sorted(expected, key=key), name


def test_a_view_at_depth_1_reads_its_relations_after_a_restart(tmp_path: Path) -> None:
    """At depth 1 the program reads the joined table's rows: the runtime a restart loads
    again must hold them (from the new snapshot), or a product moved after the restart would
    move the wrong events."""
    select = (
        "SELECT p.cat, SUM(e.cost) AS cost, COUNT(*) AS n FROM sales e "
        "JOIN items p ON e.item = p.id GROUP BY p.cat"
    )
    with own_cluster(tmp_path, ltms=2, processes=1) as cluster:
        with Client(cluster.address) as client:
            client.sql("CREATE TABLE items (id INT PRIMARY KEY, cat INT NOT NULL)")
            client.sql(
                "CREATE TABLE sales (id INT PRIMARY KEY, item INT NOT NULL, "
                "cost DECIMAL(8,2) NOT NULL)"
            )
            with client.transaction() as tx:
                for i in range(10):
                    tx.insert("items", {"id": i, "cat": i % 3})
                for i in range(40):
                    tx.insert("sales", {"id": i, "item": i % 10, "cost": Decimal(i) / 4})
            client.sql(
                "CREATE MATERIALIZED VIEW by_cat WITH (refresh = 'cumulus', epoch_ms = 60000, "
                f"depth = 1) AS {select}"
            )
            with client.transaction() as tx:
                tx.update("items", {"id": 1}, {"cat": 2})
        cluster.stop()
        cluster.start()
        with Client(cluster.address) as client:
            with client.transaction() as tx:
                tx.update("items", {"id": 2}, {"cat": 0})
                tx.insert("sales", {"id": 100, "item": 2, "cost": Decimal("9.75")})
            client.refresh("by_cat")
            rows = client.view("by_cat")
            with client.snapshot() as snapshot:
                expected = snapshot.sql(select)
            assert sorted(rows, key=lambda r: r["cat"]) == sorted(expected, key=lambda r: r["cat"])


def test_a_view_on_node_processes_recovers_from_a_killed_node_and_drop_stops_them(
    tmp_path: Path,
) -> None:
    """``host = 'grpc'``: each DW node a process of its own. A node killed with -9 fails the
    next epoch with an error naming it; the view then loads a new runtime (new nodes) from a
    snapshot, and the changes captured since count once. DROP stops the nodes."""
    rng = random.Random(5)
    select = "SELECT g, SUM(v) AS s, COUNT(*) AS n, MIN(x) AS low FROM ev GROUP BY g"
    with own_cluster(tmp_path, ltms=2, processes=1) as cluster, Client(cluster.address) as client:
        client.sql("CREATE TABLE ev (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)")
        ids = _write(client, rng, range(0, 30))
        client.sql(
            "CREATE MATERIALIZED VIEW hosted WITH (refresh = 'cumulus', nodes = 2, "
            f"host = 'grpc', epoch_ms = 60000) AS {select}"
        )
        _write(client, rng, range(30, 60), ids)
        _assert_epoch_exact(client, "hosted", select)
        nodes = _node_processes(tmp_path)
        assert len(nodes) == 2
        os.kill(nodes[0], signal.SIGKILL)
        _write(client, rng, range(60, 90), ids)
        with pytest.raises(errors.AggviewError, match="DW node"):
            client.refresh("hosted")
        _until_epoch_exact(client, "hosted", select, errors.FailedPrecondition)
        _wait_for_nodes(tmp_path, lambda found: len(found) == 2 and not set(nodes) & set(found))
        client.sql("DROP MATERIALIZED VIEW hosted")
        _wait_for_nodes(tmp_path, lambda found: not found)


def _wait_for_nodes(under: Path, wanted: Callable[[list[int]], bool]) -> None:
    """The old runtime's nodes are stopped in the background."""
    deadline = time.monotonic() + 30
    while not wanted(found := _node_processes(under)):
        assert time.monotonic() < deadline, f"node processes: {found}"
        time.sleep(0.1)


def test_a_view_on_spark_tasks_is_exact_at_every_epoch(tmp_path: Path) -> None:
    """``host = 'spark'``: the DW nodes are the tasks of a barrier stage of process 0's Spark
    session; preloaded from a snapshot, then fed changes (deletes and group moves), each epoch
    equals the base tables at its timestamp."""
    pytest.importorskip("pyspark")
    from aggclient.bulk_client import BulkClient

    rng = random.Random(9)
    select = "SELECT g, SUM(v) AS s, COUNT(*) AS n, MIN(x) AS low FROM ev GROUP BY g"
    with (
        own_cluster(tmp_path, ltms=2, processes=1) as cluster,
        Client(cluster.address, timeout=240) as client,
    ):
        client.sql("CREATE TABLE ev (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)")
        ids = _write(client, rng, range(0, 30))
        client.sql(
            "CREATE MATERIALIZED VIEW on_spark WITH (refresh = 'cumulus', nodes = 2, "
            f"host = 'spark', epoch_ms = 60000) AS {select}"
        )
        for batch in (range(30, 60), range(60, 90)):
            _write(client, rng, batch, ids)
            _assert_epoch_exact(client, "on_spark", select)
        counts = BulkClient(client).describe("on_spark").runtime
        assert counts is not None and counts["updates"] > 0 and counts["epochs"] == 2
        assert counts["messages"]["Dispatch"] > 0
        client.sql("DROP MATERIALIZED VIEW on_spark")


def _assert_epoch_exact(client: Client, view: str, select: str) -> None:
    epoch = client.refresh(view)
    rows = client.view(view)
    assert rows.timestamp == epoch
    with client.snapshot() as snapshot:
        expected = snapshot.sql(select)
    key = lambda r: repr(r["g"])  # noqa: E731
    assert sorted(rows, key=key) == sorted(expected, key=key)


def _until_epoch_exact(
    client: Client, view: str, select: str, loading: type[Exception], seconds: float = 60
) -> None:
    """``_assert_epoch_exact`` once the view's runtime is loaded again in the background
    after a failed epoch (``loading``: what its reads raise until then)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _assert_epoch_exact(client, view, select)
            return
        except loading:
            assert time.monotonic() < deadline, f"{view} was not loaded again in {seconds} s"
            time.sleep(0.2)


def _node_processes(under: Path) -> list[int]:
    """The DW node processes whose program lies under ``under`` (this test's cluster)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"node" in command and any(str(under).encode() in part for part in command):
            if any(part.endswith(b"program.m3") for part in command):
                found.append(int(entry.name))
    return sorted(found)


def _write(
    client: Client, rng: random.Random, numbers: range, ids: list[int] | None = None
) -> list[int]:
    ids = [] if ids is None else ids
    for n in numbers:
        with client.transaction() as tx:
            if ids and rng.random() < 0.3:
                tx.delete("ev", {"id": ids.pop(rng.randrange(len(ids)))})
            elif ids and rng.random() < 0.3:
                tx.update("ev", {"id": rng.choice(ids)}, {"g": rng.choice("abc")})
            else:
                row = {
                    "id": n,
                    "g": rng.choice("abc"),
                    "v": rng.randrange(100),
                    "x": rng.randrange(9),
                }
                tx.insert("ev", row)
                ids.append(n)
    return ids


def _wait_for_epoch_after(client: Client, view: str, ts: int) -> None:
    deadline = time.monotonic() + 10
    while client.view(view).timestamp <= ts:
        assert time.monotonic() < deadline, "no epoch committed on its own within 10 s"
        time.sleep(0.05)


def test_cumulus_view_options_and_reads_are_checked(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g INT, v INT)")
    bad = {
        "nodes = 0": "nodes must be a whole number from 1 to 64",
        "mode = 'eager'": "mode must be 'speculative' or 'conservative'",
        "interval_ms = 100": "interval_ms applies only to refresh = 'async'",
        "epoch_ms = 2": "epoch_ms must be between 10 and",
        "depth = 0": "depth must be a whole number from 1 to 16",
        "depth = 'full'": "depth must be a whole number from 1 to 16",
    }
    for option, message in bad.items():
        with pytest.raises(errors.InvalidArgument, match=message):
            client.sql(
                f"CREATE MATERIALIZED VIEW {table_name}_bad WITH (refresh = 'cumulus', {option}) "
                f"AS SELECT g, SUM(v) AS s FROM {table_name} GROUP BY g"
            )
    with pytest.raises(errors.InvalidArgument, match="nodes applies only to refresh = 'cumulus'"):
        client.sql(
            f"CREATE MATERIALIZED VIEW {table_name}_bad WITH (refresh = 'async', nodes = 2) "
            f"AS SELECT g, SUM(v) AS s FROM {table_name} GROUP BY g"
        )
    with pytest.raises(errors.InvalidArgument, match="depth applies only to refresh = 'cumulus'"):
        client.sql(
            f"CREATE MATERIALIZED VIEW {table_name}_bad WITH (refresh = 'sync', depth = 1) "
            f"AS SELECT g, SUM(v) AS s FROM {table_name} GROUP BY g"
        )
    client.sql(
        f"CREATE MATERIALIZED VIEW {table_name}_v WITH (refresh = 'cumulus') "
        f"AS SELECT g, SUM(v) AS s, AVG(v) AS a FROM {table_name} GROUP BY g"
    )
    with client.transaction() as tx:
        tx.insert(table_name, {"id": 1, "g": 1, "v": 3})
    client.refresh(f"{table_name}_v")
    with pytest.raises(errors.InvalidArgument, match="AVG"):
        client.query(f"{table_name}_v", rollup=[])
    with (
        client.snapshot() as snapshot,
        pytest.raises(errors.FailedPrecondition, match="last committed epoch"),
    ):
        snapshot.view(f"{table_name}_v")
    with pytest.raises(errors.InvalidArgument, match="interval_ms applies only"):
        client.sql(f"ALTER MATERIALIZED VIEW {table_name}_v SET (interval_ms = 500)")
    assert list(client.view(f"{table_name}_v")) == [{"g": 1, "s": 3, "a": 3}]
    client.sql(f"DROP MATERIALIZED VIEW {table_name}_v")  # its epochs cost the shared cluster


def test_map_entries_sent_for_a_cumulus_view_are_checked_and_lose_nothing(
    client: Client, table_name: str
) -> None:
    """A job initializing a cumulus view sends its program's map entries: a map the program
    does not have, a key of the wrong width or bytes that are not an entry are refused,
    naming the problem. The job given up, the new view is forgotten and the table's rows
    stay; the view created again loads itself and equals the table."""
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g INT, v INT)")
    with client.transaction() as tx:
        for i in range(6):
            tx.insert(table_name, {"id": i, "g": i % 2, "v": i})
    view = f"{table_name}_v"
    ddl = (
        f"CREATE MATERIALIZED VIEW {view} WITH (refresh = 'cumulus') "
        f"AS SELECT g, SUM(v) AS s FROM {table_name} GROUP BY g"
    )
    bulk = BulkClient(client)
    begun = bulk.begin_view(sql=ddl)
    name = _program_maps(client, view)[0]
    bulk.abort_view(begun.view)
    cases = [
        ([encode_entry("no_such_map", (1,), 5)], "no map 'no_such_map'"),
        ([(b"whatever", b"\xff\x00 not a row")], "not a Row"),
        ([encode_entry(name, (1, 2, 3), 5)], "key columns, not 3"),
    ]
    for entries, message in cases:
        begun = bulk.begin_view(sql=ddl)
        with pytest.raises(errors.InvalidArgument, match=message):
            bulk.finish_view(begun.view, begun.snapshot, entries)
        bulk.abort_view(begun.view)
        with pytest.raises(errors.UnknownTable):
            client.view(view)
    assert len(client.scan(table_name)) == 6
    client.sql(ddl)
    client.refresh(view)
    assert list(client.view(view)) == [{"g": 0, "s": 6}, {"g": 1, "s": 9}]
    client.sql(f"DROP MATERIALIZED VIEW {view}")  # its epochs cost the shared cluster


def _program_maps(client: Client, view: str) -> list[str]:
    """The names of the maps the view's M3 program keeps (compiled as the cluster does)."""
    described = BulkClient(client).describe(view)
    schemas = {s["name"]: TableSchema.from_json(s) for s in described.base_schemas}
    plan = ViewPlan.from_json(described.plan)  # type: ignore[arg-type]
    return [m.name for m in compile_program([plan], schemas.__getitem__).maps]


@pytest.mark.parametrize("joined", ["a1.k", "a1.id"], ids=["no dimension", "a dimension"])
def test_a_members_switch_held_back_makes_corrective_updates_and_the_view_stays_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, joined: str
) -> None:
    """Issue #42: each member dispatches its own commits through its own switch. Member 1's
    batches held 40 ms (``AGGVIEW_SWITCH_DELAY``) reach the DW nodes after member 0's later
    commits were read there: the nodes correct (a corrective update counted), and every epoch
    still equals duckdb over the tables at its timestamp, tentative reads at rest too. Joined
    on ``a1.id``, sw_t1 is a dimension: the maps its writes keep are on both nodes, and the
    late writes that correct are to those copies."""
    monkeypatch.setenv(DELAY_ENV, "1:0.04")
    names = ["sw_t0", "sw_t1"]
    select = (
        "SELECT a0.g AS g0, SUM(a1.v) AS agg0, COUNT(*) AS agg1 FROM sw_t0 a0 "
        f"JOIN sw_t1 a1 ON a0.k = {joined} GROUP BY a0.g"
    )
    spec = {"group": ["g0"], "aggregates": ["exact", "exact"]}
    model = Model(names)
    with own_cluster(tmp_path, ltms=2, processes=2) as cluster, Client(cluster.address) as client:
        rng = random.Random(1)
        create_tables(client, names, model, rng)
        with client.transaction() as tx:  # rows before the view: its maps are preloaded
            for name in names:
                for _ in range(5):
                    row_id = next(model.next_id[name])
                    tx.insert(name, random_row(rng, row_id))
                    model.ids[name].add(row_id)
        client.sql(
            "CREATE MATERIALIZED VIEW sw WITH (refresh = 'cumulus', nodes = 2, "
            f"epoch_ms = 60000) AS {select}"
        )
        corrective = 0
        for round_number in range(6):
            run_round(cluster.address, model, 40 + round_number, clients=4, per_client=6)
            epoch = client.refresh("sw")
            rows = client.view("sw")
            assert rows.timestamp == epoch
            with client.snapshot() as snapshot:
                expected = recompute(snapshot, names, select)
            assert_same(rows, expected, spec)
            assert_same(client.view("sw", consistency="tentative"), expected, spec)
            corrective = BulkClient(client).describe("sw").runtime["corrective"]
            if corrective > 0 and round_number >= 1:
                break
        assert corrective > 0


def test_a_member_killed_before_sending_its_commits_comes_back_and_the_view_is_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Member 1 holds its batches 500 ms and is killed right after its commits: what it
    never sent is lost with it. Its new process says so on its first stream, and the leader
    loads the view again from a snapshot: every epoch that commits is exact."""
    monkeypatch.setenv(DELAY_ENV, "1:0.5")
    select = "SELECT g, SUM(v) AS s, COUNT(*) AS n FROM kv GROUP BY g"
    with own_cluster(tmp_path, ltms=2, processes=2) as cluster, Client(cluster.address) as client:
        client.sql("CREATE TABLE kv (id INT PRIMARY KEY, g TEXT, v INT)")
        client.sql(
            f"CREATE MATERIALIZED VIEW kvs WITH (refresh = 'cumulus', epoch_ms = 60000) AS {select}"
        )
        with Client(cluster.member(1).address) as writer:
            for i in range(40):
                with writer.transaction() as tx:
                    tx.insert("kv", {"id": i, "g": "ab"[i % 2], "v": i})
        cluster.member(1).kill()
        cluster.member(1).start()
        deadline, epochs = time.monotonic() + 90, 0
        while epochs < 2 and time.monotonic() < deadline:
            try:
                epoch = client.refresh("kvs")
                rows = client.view("kvs")
            except errors.AggviewError:  # reloading, or waiting for member 1's END
                time.sleep(0.5)
                continue
            with client.snapshot() as snapshot:
                expected = snapshot.sql(select)
            key = lambda r: repr(r["g"])  # noqa: E731
            assert rows.timestamp == epoch
            assert sorted(rows, key=key) == sorted(expected, key=key)
            assert sum(r["n"] for r in rows) == 40
            epochs += 1
        assert epochs == 2
