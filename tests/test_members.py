"""Several processes that each coordinate (``aggview start --processes P``, P >= 2).

The cluster clock alone: a property test drives the pure ``Clock`` with members whose grants
and reports travel late and interleave, and checks that the watermarks never pass an
undecided transaction or an active read. Then the real thing: members in real processes,
clients spread over them by the rows they write, and the guarantees of the other layouts
again: the serializability and view differential tests, a clean restart, kill -9 of any
member under load with nothing acknowledged lost and nothing half applied."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import own_cluster
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_crash import ACCOUNTS, acknowledged_inserts_survive_a_kill, kill_twice_under_load
from test_crash import test_clean_restart_keeps_everything as test_clean_restart  # noqa: F401
from test_serializability import (  # noqa: F401
    test_concurrent_transfers_keep_every_invariant as test_transfers_keep_every_invariant,
)
from test_views_differential import (  # noqa: F401
    test_views_equal_recomputation as test_members_views_equal_recomputation,
)

from aggview.cluster import LocalCluster
from aggview.wire import client_pb2 as cpb
from aggview.wire import client_pb2_grpc as cpb_grpc
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc
from coordinator import Client
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
    with Client(cluster.member(1).address) as client:  # the follower's own stream is intact
        client.sql("CREATE TABLE after_bad_clock (id INT PRIMARY KEY)")
        with client.transaction() as tx:
            tx.insert("after_bad_clock", {"id": 1})
        assert client.scan("after_bad_clock") == [{"id": 1}]
