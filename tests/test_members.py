"""Several processes that each coordinate (``aggview start --processes P``, P >= 2).

The cluster clock alone: a property test drives the pure ``Clock`` with members whose grants
and reports travel late and interleave, and checks that the watermarks never pass an
undecided transaction or an active read. Then the real thing: members in real processes,
clients spread over them by the rows they write, and the guarantees of the other layouts
again: the serializability and view differential tests, a clean restart, kill -9 of any
member under load with nothing acknowledged lost and nothing half applied."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import grpc
import pytest
from concurrent_inserts import insert_each
from conftest import own_cluster
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lookup_check import lookup_mismatches
from polling import wait_for
from starting import StartingThread
from test_crash import ACCOUNTS, acknowledged_inserts_survive_a_kill, kill_twice_under_load
from test_crash import test_clean_restart_keeps_everything as test_clean_restart  # noqa: F401
from test_cumulus_views import (  # noqa: F401
    test_cumulus_views_equal_recomputation as test_members_cumulus_views_equal_recomputation,
)
from test_serializability import (  # noqa: F401
    test_concurrent_transfers_keep_every_invariant as test_transfers_keep_every_invariant,
)
from test_views_differential import (  # noqa: F401
    test_views_equal_recomputation as test_members_views_equal_recomputation,
)

from aggclient import AsyncClient, Client
from aggclient.routing import UNREACHABLE_FOR, Router
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.frames import FramedCall
from aggview.partition_map import standby_of
from aggview.schema import Column, ColumnType, TableSchema
from aggview.values import to_row
from aggview.wire import client_pb2 as cpb
from aggview.wire import client_pb2_grpc as cpb_grpc
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc
from coordinator.clock import Clock
from coordinator.timestamp_oracle import TimestampOracle
from loadgen import transfers

# ---------------------------------------------------------------------------- the clock alone


class _Follower:
    """A member as the clock sees it: grants reach it late, its reports reach the clock late."""

    def __init__(self) -> None:
        self.undecided: set[int] = set()
        self.reads: list[int] = []
        self.seen = 0
        self.to_member: deque[tuple[int, int, int, int]] = deque()  # (seq, first, count, read)
        self.to_clock: deque[tuple[int, int | None, int | None]] = deque()


_ONE_WRITE = [(0, 1, 1), (1, 1, 0), (2, 1, 0), (4, 1, 0), (5, 1, 0)]  # granted, done, said


@settings(max_examples=150, deadline=None)
@example(members=2, steps=[*_ONE_WRITE, (0, 0, 0), *_ONE_WRITE])  # a read granted, in transit
@given(
    members=st.integers(2, 4),
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 1000)), max_size=80
    ),
)
def test_clock_watermarks_never_pass_what_a_member_holds(
    members: int, steps: list[tuple[int, int, int]]
) -> None:
    meta: dict[str, str] = {}
    clock = Clock(TimestampOracle(meta.get, meta.__setitem__), members)
    held = [_Follower() for _ in range(members)]
    granted = 0  # the youngest timestamp granted so far
    for action, member, pick in steps:
        m = member % members
        f = held[m]
        if action == 0:  # asks for timestamps (and a read): the grant travels
            count, read = pick % 3, pick % 2 == 0
            grant = clock.grant(m, count, read)
            if count:
                assert grant.first == granted + 1  # above every earlier grant: strictness
                granted += count
            if read:
                assert grant.read_ts == granted - count
            f.to_member.append((grant.seq, grant.first, count, grant.read_ts if read else -1))
        elif action == 1 and f.to_member:  # a grant arrives
            seq, first, count, read = f.to_member.popleft()
            f.undecided.update(range(first, first + count))
            if read >= 0:
                f.reads.append(read)
            f.seen = seq
        elif action == 2 and f.undecided:  # a transaction is decided
            f.undecided.discard(sorted(f.undecided)[pick % len(f.undecided)])
        elif action == 3 and f.reads:  # a read ends
            f.reads.pop(pick % len(f.reads))
        elif action == 4:  # the member reports what it holds: the report travels
            f.to_clock.append((f.seen, min(f.undecided, default=None), min(f.reads, default=None)))
        elif action == 5 and f.to_clock:  # a report arrives
            clock.report(m, *f.to_clock.popleft())
        marks = clock.marks()
        for g in held:
            pending = [t for _, first, count, _ in g.to_member for t in range(first, first + count)]
            pending_reads = [r for *_, r in g.to_member if r >= 0]
            for ts in [*g.undecided, *pending]:
                assert marks.decided < ts
            for ts in [*g.reads, *pending_reads]:
                assert marks.low <= ts
        assert marks.low <= marks.decided <= marks.issued


def test_clock_holds_reads_until_every_follower_reported() -> None:
    """A leader that restarted does not know what its followers hold until they say."""
    meta: dict[str, str] = {}
    clock = Clock(TimestampOracle(meta.get, meta.__setitem__), 3)
    assert clock.marks().decided == 0
    clock.report(1, 0, None, None)
    assert clock.marks().decided == 0
    clock.report(2, 0, None, None)
    grant = clock.grant(2, 2)
    assert clock.marks().decided == grant.first - 1
    clock.report(2, grant.seq, grant.first + 1, None)
    assert clock.marks().decided == grant.first
    clock.connected(2)  # a new stream: what it had not acknowledged is dropped
    clock.report(2, 0, None, None)
    assert clock.marks().decided == clock.marks().issued


def test_a_forgotten_member_holds_nothing_until_its_next_stream() -> None:
    """A dead member whose decision log another adopted: its grants, undecided or not yet
    acknowledged, stop holding the watermarks; its next stream counts again."""
    meta: dict[str, str] = {}
    clock = Clock(TimestampOracle(meta.get, meta.__setitem__), 3)
    for member in (1, 2):
        clock.report(member, 0, None, None)
    held = clock.grant(1, 2)  # never acknowledged: the member died with them
    read = clock.grant(1, 0, read=True)
    assert clock.marks().decided == held.first - 1
    assert clock.marks().low <= read.read_ts
    clock.forget(1)
    assert clock.marks().decided == clock.marks().issued
    clock.connected(1)  # it is back: what it reports holds again
    again = clock.grant(1, 1)
    assert clock.marks().decided == again.first - 1
    clock.report(1, again.seq, None, None)
    assert clock.marks().decided == clock.marks().issued


@given(st.integers(2, 9), st.integers(2, 9))
def test_each_log_is_copied_to_another_process(partitions: int, members: int) -> None:
    members = min(members, partitions)
    for p in range(partitions):
        standby = standby_of(p, partitions, members)
        assert standby != p and standby % members != p % members
    if members == partitions:  # one LTM per process: the next one, as it always was
        assert [standby_of(p, partitions, members) for p in range(partitions)] == [
            (p + 1) % partitions for p in range(partitions)
        ]


def test_a_member_that_does_not_answer_gets_no_routed_transaction_for_a_while() -> None:
    """Any member coordinates any transaction: one that did not answer (dead, its partitions
    moving) is skipped for UNREACHABLE_FOR seconds, then tried again. Its transactions go to
    the leader, or, when the leader did not answer either (it died; another takes the lead),
    to a member that did; with none answering, to the leader."""
    schema = TableSchema("t", "t_1", (Column("k", ColumnType("INT"), nullable=False),), ("k",))
    router = Router(["a", "b", "c"], 3)
    router.learn(
        "t",
        cpb.DescribeReply(kind=cpb.DescribeReply.TABLE, schema_json=json.dumps(schema.to_json())),
    )

    def insert(k: int) -> list[cpb.Operation]:
        return [cpb.Operation(kind=cpb.Operation.INSERT, table="t", values=to_row({"k": k}))]

    at_two = next(k for k in range(100) if router.member_for(insert(k)) == 2)
    at_zero = next(k for k in range(100) if router.member_for(insert(k)) == 0)
    router.unreachable(2, now=100.0)
    assert router.member_for(insert(at_two), now=100.0 + UNREACHABLE_FOR - 0.1) == 0
    assert router.member_for(insert(at_zero), now=101.0) == 0
    assert router.member_for(insert(at_two), now=100.0 + UNREACHABLE_FOR) == 2
    router.unreachable(0, now=200.0)
    assert router.member_for(insert(at_zero), now=200.0) == 1
    router.leader = 2  # member 2 took the lead
    assert router.member_for(insert(at_zero), now=200.0) == 2
    router.unreachable(1, now=200.0)
    router.unreachable(2, now=200.0)
    assert router.member_for(insert(at_zero), now=200.0) == 2


# ---------------------------------------------------------------------------- members


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("members"), ltms=4, processes=2) as running:
        assert [s.role for s in running.servers] == ["member-0", "member-1"]
        yield running


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with own_cluster(tmp_path, ltms=4, processes=2) as running:
        yield running


def test_members_share_the_partitions_and_clients_spread_over_them(cluster: LocalCluster) -> None:
    follower = cluster.member(1).address
    with Client(follower) as client:  # DDL given to a follower goes to member 0
        client.sql("CREATE TABLE spread (id INT PRIMARY KEY, n INT NOT NULL)")
        client.sql(
            "CREATE MATERIALIZED VIEW spread_n AS SELECT n, COUNT(*) AS c FROM spread GROUP BY n"
        )
        for i in range(60):
            with client.transaction() as tx:
                tx.insert("spread", {"id": i, "n": i % 4})
        assert sorted(client._members) == [0, 1]  # both members coordinated some
        assert {r["n"]: r["c"] for r in client.view("spread_n")} == {0: 15, 1: 15, 2: 15, 3: 15}
    with grpc.insecure_channel(follower) as channel:
        stub = cpb_grpc.AggviewStub(channel)
        members = stub.Members(cpb.MembersRequest())
        assert list(members.addresses) == [cluster.member(0).address, follower]
        assert members.partitions == 4
        with pytest.raises(grpc.RpcError) as refused:  # a follower asked directly says where
            stub.Sql(cpb.SqlRequest(sql="CREATE TABLE elsewhere (id INT PRIMARY KEY)"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert cluster.member(0).address in (refused.value.details() or "")
        # a table created at member 0 is known at once at the follower (it catches up)
        with Client(cluster.member(0).address) as client:
            client.sql("CREATE TABLE fresh (id INT PRIMARY KEY)")
        rows = stub.Scan(cpb.ScanRequest(table="fresh"))
        assert list(rows.rows) == []


@pytest.mark.parametrize("seed", [5, 6])
def test_kill_of_any_member_under_load_loses_nothing(
    fresh_cluster: LocalCluster, seed: int
) -> None:
    cluster = fresh_cluster
    outcomes = kill_twice_under_load(cluster, lambda rng: rng.choice(cluster.servers), seed)
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)


def test_one_row_inserts_acknowledged_before_a_kill_survive_it(fresh_cluster: LocalCluster) -> None:
    """Writers on both members; one member is killed (which one: a seeded draw)."""
    cluster = fresh_cluster
    victim = cluster.member(random.Random(17).randrange(2))
    acknowledged_inserts_survive_a_kill(cluster, victim, lambda w: cluster.member(w % 2).address)


def test_a_bad_clock_stream_is_refused_and_the_cluster_serves_on(cluster: LocalCluster) -> None:
    """The member-only clock service names what is wrong with a stream and ends only it."""
    with grpc.insecure_channel(cluster.member(0).address) as channel:
        stub = lpb_grpc.ClockStub(channel)
        for member, problem in ((7, "not a follower"), (0, "not a follower")):
            replies = stub.Tick(iter([lpb.ClockRequest(member=member, read=True)]), timeout=10)
            with pytest.raises(grpc.RpcError) as refused:
                list(replies)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert problem in (refused.value.details() or "")

    async def framed(stream: str, frame: bytes) -> str:
        """The same on the leader's framed-TCP port: the connection is closed without a
        grant (or refused at its hello, saying why)."""
        hello = lpb.ExchangeHello(stream=stream).SerializeToString()
        call = FramedCall(cluster.exchange_addresses[0], hello, lpb.ClockReply.FromString)
        try:
            await call.write(_Raw(frame))
            return "; ".join([str(reply) async for reply in call]) or "closed"
        except errors.AggviewError as exc:
            return str(exc)
        finally:
            call.cancel()

    for member in (7, 0):
        request = lpb.ClockRequest(member=member, read=True).SerializeToString()
        assert asyncio.run(framed("clock", request)) == "closed"
    assert asyncio.run(framed("clock", b"\xff\xff")) == "closed"  # does not parse
    assert "no stream 'tock'" in asyncio.run(framed("tock", b""))
    with Client(cluster.member(1).address) as client:  # the follower's own stream is intact
        client.sql("CREATE TABLE after_bad_clock (id INT PRIMARY KEY)")
        with client.transaction() as tx:
            tx.insert("after_bad_clock", {"id": 1})
        assert client.scan("after_bad_clock") == [{"id": 1}]


def test_async_clients_transact_on_the_members_framed_ports(cluster: LocalCluster) -> None:
    """An insecure cluster's members offer clients' transactions on their framed-TCP ports
    (``MembersReply.transact_addresses``); ``AsyncClient`` sends them there, each answered on
    its own (a failed one does not end the stream). A frame that does not parse ends only its
    connection; a connection takes at most ``max_client_transactions`` at once, as a gRPC one."""
    with grpc.insecure_channel(cluster.member(1).address) as channel:
        members = cpb_grpc.AggviewStub(channel).Members(cpb.MembersRequest())
    assert list(members.transact_addresses) == cluster.exchange_addresses

    async def main() -> list[Any]:
        async with AsyncClient(cluster.address) as client:
            await client.sql("CREATE TABLE on_frames (id INT PRIMARY KEY, n INT NOT NULL)")

            outcomes = await insert_each(client, "on_frames", 40, 30)
            streams = [stream for _, _, stream in client._members.values()]
            assert streams and all(isinstance(s._call, FramedCall) for s in streams)
            rows = await client.scan("on_frames")
            return [outcomes, rows]

    outcomes, rows = asyncio.run(main())
    committed = [o for o in outcomes if isinstance(o, int)]
    refused = [o for o in outcomes if isinstance(o, str)]
    assert len(committed) == 30 and len(refused) == 10
    assert all("already exists" in reason for reason in refused)
    assert {r["id"]: r["n"] for r in rows} == {i % 30: i for i in committed}

    async def garbage() -> str:
        hello = lpb.ExchangeHello(stream="transact").SerializeToString()
        call = FramedCall(cluster.exchange_addresses[1], hello, cpb.TransactReplies.FromString)
        try:
            await call.write(_Raw(b"\xff\xff\xff"))
            return "; ".join([str(reply) async for reply in call]) or "closed"
        finally:
            call.cancel()

    assert asyncio.run(garbage()) == "closed"
    with Client(cluster.member(1).address) as client:  # the member serves on, rows intact
        assert len(client.scan("on_frames")) == 30
        with client.transaction() as tx:
            tx.insert("on_frames", {"id": 100, "n": 0})
        assert len(client.scan("on_frames")) == 31


class _Raw:
    """Bytes sent as they are, where a message is expected."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # noqa: N802 - a protobuf message's name
        return self.data


def test_log_copies_and_takeovers_are_refused_without_replication(cluster: LocalCluster) -> None:
    """A member started without --replicate keeps no copy and takes nothing over: it says so,
    and serves on with its partitions intact."""
    with grpc.insecure_channel(cluster.member(1).address) as channel:
        stub = lpb_grpc.LtmStub(channel)
        copy = lpb.ReplicateRequest(partition=0, epoch=1, reset=True)
        calls = (
            (stub.Replicate, copy),
            (stub.TakeOver, lpb.TakeOverRequest(partition=0, epoch=1)),
            (lambda request, timeout: list(stub.ReplicateStream(iter([request]))), copy),
        )
        for call, request in calls:
            with pytest.raises(grpc.RpcError) as refused:
                call(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "does not replicate (no --replicate)" in (refused.value.details() or "")
        assert sorted(stub.Status(lpb.StatusRequest(), timeout=10).serving) == [1, 3]
    with Client(cluster.address) as client:
        client.sql("CREATE TABLE after_refused_copy (id INT PRIMARY KEY)")
        with client.transaction() as tx:
            for i in range(8):
                tx.insert("after_refused_copy", {"id": i})
        assert len(client.scan("after_refused_copy")) == 8


def test_a_cumulus_view_is_read_at_any_member(cluster: LocalCluster) -> None:
    """Its runtime runs at the leader; another member forwards its clients' reads there, so
    the view, a slice, a roll-up, SQL and tentative reads answer the same at every member.
    A bad read is refused there with the leader's reason, and the member serves on."""
    with Client(cluster.address) as client:
        client.sql("CREATE TABLE cu_events (id INT PRIMARY KEY, g INT, h INT, v INT)")
        client.sql(
            "CREATE MATERIALIZED VIEW cu_totals WITH (refresh = 'cumulus') AS "
            "SELECT g, h, SUM(v) AS s FROM cu_events GROUP BY g, h"
        )
        for i in range(12):  # routed to both members
            with client.transaction() as tx:
                tx.insert("cu_events", {"id": i, "g": i % 2, "h": i % 3, "v": i})
        client.refresh("cu_totals")
        whole = list(client.view("cu_totals"))
        assert len(whole) == 6 and sum(r["s"] for r in whole) == sum(range(12))
    with Client(cluster.member(1).address) as follower:
        before = client_view_ts(cluster)
        read = follower.view("cu_totals")
        assert list(read) == whole and not read.tentative
        # epochs keep closing (empty ones too), so the leader's stamp may move on meanwhile
        assert before <= read.timestamp <= client_view_ts(cluster)
        assert list(follower.view("cu_totals", {"g": 1})) == [r for r in whole if r["g"] == 1]
        rolled = follower.query("cu_totals", {"h": [0, 2]}, rollup=["g"])
        assert list(rolled) == [
            {"g": g, "s": sum(i for i in range(12) if i % 2 == g and i % 3 in (0, 2))}
            for g in (0, 1)
        ]
        tentative = follower.view("cu_totals", consistency="tentative")
        assert tentative.tentative and list(tentative) == whole  # quiescent: the same
        selected = follower.sql("SELECT g, h, s FROM cu_totals WHERE g = 0")
        assert sorted(selected, key=lambda r: r["h"]) == [r for r in whole if r["g"] == 0]
        with pytest.raises(errors.AggviewError, match="nope"):
            follower.view("cu_totals", {"nope": 1})
        assert list(follower.view("cu_totals")) == whole


def client_view_ts(cluster: LocalCluster) -> int:
    with Client(cluster.address) as client:
        return client.view("cu_totals").timestamp


def test_every_member_caches_dimension_rows_that_others_rewrite(cluster: LocalCluster) -> None:
    """Each member caches the product rows its sync-view maintenance looks up, while writers
    on both members rewrite products (by key, and by a WHERE that is not the key) and insert
    and delete sales. Every snapshot taken meanwhile finds the view equal to duckdb's
    recomputation over the tables, and no cached answer differs from the LTMs' (check mode)."""
    cluster_address = cluster.member(0).address
    with Client(cluster_address) as client:
        client.sql("CREATE TABLE dim_p (id INT PRIMARY KEY, cat INT NOT NULL)")
        client.sql("CREATE TABLE dim_s (id INT PRIMARY KEY, prod INT NOT NULL, amount INT)")
        client.sql("INSERT INTO dim_p VALUES " + ", ".join(f"({p}, {p % 3})" for p in range(12)))
        client.sql(
            "CREATE MATERIALIZED VIEW dim_v AS SELECT p.cat, SUM(s.amount) AS total, "
            "COUNT(*) AS n FROM dim_s s JOIN dim_p p ON s.prod = p.id GROUP BY p.cat"
        )
    recompute = (
        "SELECT p.cat, SUM(s.amount), COUNT(*) FROM dim_s s JOIN dim_p p ON s.prod = p.id "
        "GROUP BY p.cat"
    )
    stop = threading.Event()
    failures: list[BaseException] = []

    def write(worker: int) -> None:
        rng = random.Random(worker)
        try:
            with Client(cluster_address) as own:
                for i in range(120):
                    roll = rng.random()
                    try:
                        if roll < 0.6:
                            with own.transaction() as tx:
                                sale = {"id": worker * 1000 + i, "prod": rng.randrange(12)}
                                tx.insert("dim_s", {**sale, "amount": rng.randrange(1, 9)})
                        elif roll < 0.8:
                            with own.transaction() as tx:
                                product = {"id": rng.randrange(12)}
                                tx.update("dim_p", product, {"cat": rng.randrange(4)})
                        elif roll < 0.9:
                            old, new = rng.randrange(4), rng.randrange(4)
                            own.sql(f"UPDATE dim_p SET cat = {new} WHERE cat = {old}")
                        else:
                            own.sql(f"DELETE FROM dim_s WHERE id = {worker * 1000 + i // 2}")
                    except errors.TooLate:
                        pass  # a timestamp-order abort the client gave up retrying
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    def check() -> list[int]:
        seen = []
        with Client(cluster_address) as own:
            while not stop.is_set():
                with own.snapshot() as snap:
                    view, expected = _view_and_recomputation(snap, recompute)
                    assert view == expected, (snap.timestamp, view, expected)
                    seen.append(snap.timestamp)
        return seen

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in writers:
        thread.start()

    def join() -> None:
        for thread in writers:
            thread.join()
        stop.set()

    joiner = threading.Thread(target=join)
    joiner.start()
    try:
        snapshots = check()
    finally:
        joiner.join()
    assert not failures, failures
    assert len(snapshots) >= 3
    with Client(cluster_address) as client:
        view, expected = _view_and_recomputation(client, recompute)
        assert view == expected
    assert lookup_mismatches(cluster.data) == []
    logs = "".join(p.read_text() for p in (cluster.data / "logs").glob("member-*.log"))
    assert "lookup cache mismatch" not in logs


def _view_and_recomputation(
    reader: Any, recompute: str
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``dim_v`` as ``reader`` (a client, or a snapshot) reads it, and duckdb's answer over
    the tables it reads with it."""
    db = duckdb.connect()
    db.execute("CREATE TABLE dim_p (id INT, cat INT)")
    db.execute("CREATE TABLE dim_s (id INT, prod INT, amount INT)")
    for r in reader.scan("dim_p"):
        db.execute("INSERT INTO dim_p VALUES (?, ?)", [r["id"], r["cat"]])
    for r in reader.scan("dim_s"):
        db.execute("INSERT INTO dim_s VALUES (?, ?, ?)", [r["id"], r["prod"], r["amount"]])
    view = sorted((r["cat"], r["total"], r["n"]) for r in reader.view("dim_v"))
    return view, sorted(db.execute(recompute).fetchall())


def _refreshes(cluster: LocalCluster, member: int) -> int:
    with grpc.insecure_channel(cluster.member(member).address) as channel:
        return lpb_grpc.LtmStub(channel).Status(lpb.StatusRequest(), timeout=10).refreshes


def test_async_views_refresh_on_every_member(cluster: LocalCluster) -> None:
    """Async views' refreshers are spread over the members (view n at member n % 2): both
    members refresh, each view catches up with its base table (rows from before it, rows
    written while it initialized, rows after), and refreshes asked of member 0 beside a
    follower's scheduled ones count nothing twice."""
    address = cluster.member(0).address
    with Client(address) as client:
        client.sql("CREATE TABLE spread_a (id INT PRIMARY KEY, g INT NOT NULL, v INT NOT NULL)")
        client.sql(
            "INSERT INTO spread_a VALUES " + ", ".join(f"({i}, {i % 5}, {i})" for i in range(40))
        )
        stop = threading.Event()

        def write(worker: int) -> None:
            with Client(cluster.member(worker % 2).address) as own:
                i = 1000 * (worker + 1)
                while not stop.is_set():
                    with own.transaction() as tx:
                        tx.insert("spread_a", {"id": i, "g": i % 5, "v": 1})
                    i += 1

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        for writer in writers:
            writer.start()
        try:
            for name in ("spread_a1", "spread_a2", "spread_a3"):
                client.sql(
                    f"CREATE MATERIALIZED VIEW {name} WITH (refresh = 'async', interval_ms = 30)"
                    " AS SELECT g, SUM(v) AS s, COUNT(*) AS n FROM spread_a GROUP BY g"
                )
            before = [_refreshes(cluster, m) for m in range(2)]
            time.sleep(0.3)
            for _ in range(4):
                client.refresh("spread_a2")  # at member 0, beside the scheduled ones
                time.sleep(0.1)
        finally:
            stop.set()
            for writer in writers:
                writer.join()
        expected: dict[int, list[int]] = {}
        for row in client.scan("spread_a"):
            expected.setdefault(row["g"], [0, 0])
            expected[row["g"]][0] += row["v"]
            expected[row["g"]][1] += 1
        want = sorted((g, s, n) for g, (s, n) in expected.items())

        def caught_up() -> bool:
            return all(
                sorted((r["g"], r["s"], r["n"]) for r in client.view(name)) == want
                for name in ("spread_a1", "spread_a2", "spread_a3")
            )

        wait_for("every async view to catch up", caught_up, timeout=30)
        after = [_refreshes(cluster, m) for m in range(2)]
        assert after[0] > before[0] and after[1] > before[1], (before, after)


def test_an_idle_member_hears_of_new_views_at_once(fresh_cluster: LocalCluster) -> None:
    """Member 1 runs no transaction of its own, so it asks the leader's clock for nothing;
    async views created at member 0 still reach it at once (a new catalog epoch is pushed
    on every follower's clock stream), and it refreshes its share of them (view n at member
    n % 2). It used to learn of them only with its next grant: an idle member never did, and
    its views never refreshed (found as a flaky ``test_view_ddl_rules``)."""
    cluster = fresh_cluster
    with Client(cluster.member(0).address) as client:
        client.sql("CREATE TABLE idle_t (id INT PRIMARY KEY, g INT NOT NULL)")
        before = _refreshes(cluster, 1)
        for name in ("idle_v1", "idle_v2"):
            client.sql(
                f"CREATE MATERIALIZED VIEW {name} WITH (refresh = 'async', interval_ms = 30)"
                " AS SELECT g, COUNT(*) AS n FROM idle_t GROUP BY g"
            )
        wait_for("member 1 to refresh its view", lambda: _refreshes(cluster, 1) > before, 10)


def test_a_follower_that_outlives_the_leaders_restart_maintains_views_it_learned_since(
    fresh_cluster: LocalCluster,
) -> None:
    """Every leader's catalog epochs start above its predecessor's. A restarted leader once
    counted from 0 again, so its epoch n named another configuration than the old leader's n
    that a follower still remembered: member 1 kept ``events`` unwatched (as it was when
    only ``a`` existed) and committed inserts without their sync view deltas (found as view
    drift in the failpoint tests, the leader crashing). And a follower's requests for
    timestamps while its clock stream is down fail at once as unavailable: they used to go
    on the dead stream and wait for their deadline (the first read below hung)."""
    cluster = fresh_cluster
    follower = cluster.member(1).address
    with Client(cluster.member(0).address) as client:
        client.sql("CREATE TABLE a (id INT PRIMARY KEY, v INT NOT NULL)")
    with Client(follower, route=False) as client:  # member 1 coordinates it
        client.sql("INSERT INTO a VALUES (1, 1)")
    with Client(cluster.member(0).address) as client:
        client.sql("CREATE TABLE events (id INT PRIMARY KEY, g INT NOT NULL, n INT NOT NULL)")
        client.sql(
            "CREATE MATERIALIZED VIEW ev AS SELECT g, SUM(n) AS total FROM events GROUP BY g"
        )
    cluster.member(0).stop()
    cluster.member(0).start()
    with Client(follower, route=False) as client:
        wait_for("member 1 to read again", lambda: _reads(client), 30)
        client.sql("INSERT INTO events VALUES (1, 7, 5)")
        client.sql("INSERT INTO events VALUES (2, 7, 6)")
        assert client.view("ev") == [{"g": 7, "total": 11}]


def _reads(client: Client) -> bool:
    """Whether a read gets through (it needs a timestamp from the leader's clock)."""
    try:
        client.scan("a")
    except errors.Unavailable:
        return False
    return True


def test_a_member_started_while_the_leader_is_down_waits_for_it(
    fresh_cluster: LocalCluster,
) -> None:
    """A follower restarted while the leader cannot be reached (down, cut off, restarting)
    waits for it with backoff instead of exiting, and serves once the leader is back."""
    cluster = fresh_cluster
    follower, leader = cluster.member(1), cluster.member(0)
    follower.kill()
    leader.kill()
    starting = StartingThread(follower)
    started = starting.outcome
    starting.start()
    try:
        wait_for(
            "the follower to wait for the leader",
            lambda: "waiting for the cluster's leader" in follower.tail(),
            30,
        )
        assert follower.running()
        leader.start()
        wait_for("the follower to start", lambda: bool(started), 60)
        assert started == [None], started
        check_both_members_serve(cluster)
    finally:
        starting.release()


def check_both_members_serve(cluster: LocalCluster) -> None:
    with Client(cluster.address) as client:
        client.sql("CREATE TABLE waited (id INT PRIMARY KEY)")

        def inserted() -> bool:
            try:
                with client.transaction() as tx:
                    for i in range(8):  # rows on both members' partitions
                        tx.insert("waited", {"id": i})
            except errors.Unavailable:
                return False  # a connection made while the other was starting: once more
            return True

        wait_for("a transaction on both members", inserted, 30)
        assert len(list(client.scan("waited"))) == 8
