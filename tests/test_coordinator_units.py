"""Coordinator pieces alone: batching, the in-flight set, the oracle, the decision log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aggclient.rows import Transaction as Writes
from aggview import errors
from aggview.member_log import DECISIONS
from aggview.partition_map import partition_of
from aggview.processes import free_port
from aggview.wal import WriteAheadLog
from aggview.wire import ltm_pb2 as lpb
from coordinator.catalog import Catalog
from coordinator.clock import Clock
from coordinator.decision_log import DecisionLog
from coordinator.ltm_channel import Batcher, LtmChannel
from coordinator.member_clock import InFlight, LeaderClock
from coordinator.member_wiring import CoordinatorConfig, build_manager
from coordinator.service import _start_manager, _stop_manager
from coordinator.sql import run_sql
from coordinator.timestamp_oracle import BLOCK, TimestampOracle
from coordinator.transactions import Transaction, TransactionManager
from ltm.store import open_store


def test_batcher_sends_one_call_per_loop_turn() -> None:
    calls: list[list[int]] = []

    async def send(items: list[int]) -> AsyncIterator[tuple[int, int]]:
        calls.append(items)
        await asyncio.sleep(0.01)
        for position, i in reversed(list(enumerate(items))):  # any order
            yield position, i * 10

    async def main() -> list[int]:
        batcher: Batcher[int, int] = Batcher(send)
        first = await asyncio.gather(*(batcher.submit(i) for i in range(50)))
        second = await asyncio.gather(*(batcher.submit(i) for i in range(3)))
        return first + second

    results = asyncio.run(main())
    assert results == [i * 10 for i in range(50)] + [0, 10, 20]
    assert calls == [list(range(50)), [0, 1, 2]]


def test_batcher_failure_reaches_every_caller() -> None:
    async def send(items: list[int]) -> AsyncIterator[tuple[int, int]]:
        raise ConnectionError("down")
        yield 0, 0  # an async generator that fails on its first step

    async def main() -> list[object]:
        batcher: Batcher[int, int] = Batcher(send)
        return await asyncio.gather(*(batcher.submit(i) for i in range(3)), return_exceptions=True)

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(main()))


def _leader(members: int = 1) -> LeaderClock:
    meta: dict[str, str] = {}
    return LeaderClock(Clock(TimestampOracle(meta.get, meta.__setitem__), members), InFlight())


def test_reads_wait_for_older_undecided_transactions_only() -> None:
    async def main() -> list[str]:
        clock = _leader()
        flight = clock.in_flight
        events: list[str] = []
        issued = [clock.take()[0] for _ in range(9)]  # 1..9; all but 5, 7 and 9 decided
        for ts in issued:
            if ts not in (5, 7, 9):
                flight.decided(ts)

        async def read(ts: int) -> None:
            await clock.wait_decided(ts)
            events.append(f"read {ts}")

        await clock.wait_decided(4)  # nothing older: no wait
        readers = [asyncio.create_task(read(t)) for t in (6, 8)]
        await asyncio.sleep(0)
        for ts in (7, 5, 9):
            events.append(f"decide {ts}")
            flight.decided(ts)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await asyncio.gather(*readers)
        return events

    # the read at 6 needs 5 decided; the read at 8 needs 5 and 7; neither waits for 9
    assert asyncio.run(main()) == ["decide 7", "decide 5", "read 6", "read 8", "decide 9"]


def test_low_watermark_is_the_oldest_active_read() -> None:
    async def main() -> None:
        clock = _leader()
        for _ in range(40):
            clock.in_flight.decided(clock.take()[0])
        first = await clock.read_timestamp()
        for _ in range(20):
            clock.in_flight.decided(clock.take()[0])
        second = await clock.read_timestamp()
        for _ in range(40):
            clock.in_flight.decided(clock.take()[0])
        await asyncio.sleep(0)
        assert (first, second, clock.marks.low) == (40, 60, 40)
        clock.in_flight.stop_reading(first)
        await asyncio.sleep(0)
        assert clock.marks.low == 60
        clock.in_flight.stop_reading(second)
        await asyncio.sleep(0)
        assert clock.marks.low == clock.marks.decided == 100

    asyncio.run(main())


def test_oracle_never_reissues_after_a_crash() -> None:
    meta: dict[str, str] = {}
    oracle = TimestampOracle(meta.get, meta.__setitem__)
    issued = [oracle.next() for _ in range(10)]
    assert issued == sorted(set(issued))
    restarted = TimestampOracle(meta.get, meta.__setitem__)  # the old one's block is lost
    assert restarted.next() > issued[-1]
    assert restarted.current() >= BLOCK


def test_decision_log_keeps_unacknowledged_commits(tmp_path: Path) -> None:
    async def main() -> None:
        log = DecisionLog(tmp_path)
        await log.commit(10, [0, 1])
        await log.commit(11, [2])
        log.done(10)
        await log.compact()
        await log.commit(12, [0])
        await log.wal.flush()

    asyncio.run(main())
    assert DecisionLog(tmp_path).committed == {11: [2], 12: [0]}


def test_a_compaction_while_a_commit_is_being_logged_keeps_it(tmp_path: Path) -> None:
    """The log's thread wrote commit 20 into the old segment, and the compaction starts before
    the loop hears it is durable: the compaction carries it, as it drops that segment."""

    async def main() -> None:
        log = DecisionLog(tmp_path, fsync=False)
        await log.commit(10, [0])
        logging = asyncio.ensure_future(log.commit(20, [0, 1]))
        await asyncio.sleep(0)  # its record is queued; the log's thread takes it
        time.sleep(0.05)  # the loop is busy meanwhile: it has not heard of the write yet
        await log.compact()
        await logging
        assert log.committed == {10: [0], 20: [0, 1]}
        await log.close()

    asyncio.run(main())
    assert DecisionLog(tmp_path).committed == {10: [0], 20: [0, 1]}


def test_decision_log_reconciles_with_the_copy_its_adopter_held(tmp_path: Path) -> None:
    """Commits 12 and 13 were logged here after the copy was adopted (the copy refused them):
    reconciling with the adopter's list forgets them, durably and once per adoption; a later
    compaction keeps the mark, so a restart does not forget commits made since."""

    async def main() -> None:
        log = DecisionLog(tmp_path)
        for ts in (10, 11, 12, 13):
            await log.commit(ts, [0, 1])
        log.done(10)
        assert await log.reconcile(3, {10, 11}) == [12, 13]
        assert log.committed == {11: [0, 1]} and log.reconciled == 3
        await log.commit(14, [2])  # after the take-back: not in the adopter's list
        assert await log.reconcile(3, {10, 11}) == []  # that adoption is reconciled already
        await log.compact()
        await log.close()

    asyncio.run(main())
    restarted = DecisionLog(tmp_path)
    assert restarted.committed == {11: [0, 1], 14: [2]}
    assert restarted.reconciled == 3


def test_a_commit_whose_decision_was_not_logged_is_never_answered_aborted(
    tmp_path: Path,
) -> None:
    """The decision record may be on disk even though its write failed (its copy refused it,
    the disk failed after writing): a restart would deliver it, so until then the member
    answers 'pending' for it, never 'aborted'."""

    async def main() -> None:
        store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
        decisions = DecisionLog(tmp_path / "decisions")
        manager = TransactionManager(Catalog(store), _leader(), decisions)
        ts = manager.clock.issued() + 1
        manager.in_flight.add(ts)
        await decisions.close()  # the next append fails
        with pytest.raises(Exception):  # noqa: B017 - whatever the write raises
            await manager._commit(Transaction(ts, participants={0, 1}))
        assert ts not in manager.in_flight  # reads above it go on
        assert manager.outcome(ts) == lpb.OutcomeReply.PENDING
        assert manager.outcome(ts + 1) == lpb.OutcomeReply.ABORTED
        store.close()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def member_alone(
    tmp_path: Path, checkpoint_interval: float = 2.0
) -> AsyncIterator[TransactionManager]:
    """A member hosting all three partitions in this process, on the embedded store; a test
    that crashes it (:func:`crash_member`) leaves it unstopped."""
    config = CoordinatorConfig(
        store_url=f"sqlite:///{tmp_path / 'store.db'}",
        log_dir=tmp_path / "log",
        partitions=3,
        fsync=False,
        checkpoint_interval=checkpoint_interval,
    )
    manager = build_manager(config)
    await _start_manager(manager)
    try:
        yield manager
    finally:
        if not getattr(manager, "crashed", False):
            await _stop_manager(manager)


def member_log_of(manager: TransactionManager) -> WriteAheadLog:
    return manager.local.hostings[0].participants[0].wal.shared.wal


def crash_member(manager: TransactionManager) -> None:
    """Like kill -9 of a member hosting every partition: what was only queued is lost, a
    group the log's thread took is written, nothing after (no checkpoint, no stop)."""
    for hosting in manager.local.hostings.values():
        for participant in hosting.participants.values():
            for task in participant._background:
                task.cancel()
    wal = member_log_of(manager)
    with wal._mutex:
        wal._pending.clear()
    while wal._draining:
        time.sleep(0.001)
    with wal._mutex:
        wal._closed = True
    os.close(wal._fd)
    manager.crashed = True  # type: ignore[attr-defined]


def keys_in_partitions(
    manager: TransactionManager, table: str, count: int, start: int = 0
) -> list[int]:
    """Integer keys of ``table`` from ``start`` on whose rows fall into ``count`` distinct
    partitions."""
    by_partition: dict[int, int] = {}
    for key in range(start, start + 100):
        writes = Writes()
        writes.insert(table, {"id": key, "v": 1})
        (op,) = manager._row_ops(writes.operations)
        by_partition.setdefault(partition_of(op.table, op.key, 3), key)
    return sorted(by_partition.values())[:count]


def test_concurrent_commits_that_all_wait_for_one_flush_sync_it_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight commits arriving together at a member hosting every partition reach their
    decisions in one loop pass; with nothing else left to run, their one group is written and
    synced on the loop's thread (no wake-up of the log's thread, nor of the loop after it),
    and every one commits."""
    flushed_on: list[str] = []
    write_timed = WriteAheadLog._write_timed

    def recorded(self: WriteAheadLog, *args: Any) -> Any:
        flushed_on.append(threading.current_thread().name)
        return write_timed(self, *args)

    monkeypatch.setattr(WriteAheadLog, "_write_timed", recorded)

    async def main() -> None:
        async with member_alone(tmp_path, checkpoint_interval=600) as manager:
            await run_sql("CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)", manager, 0)
            flushed_on.clear()
            commits = []
            for key in range(8):
                writes = Writes()
                writes.insert("t", {"id": key, "v": key})
                commits.append(manager.commit(writes.operations))
            stamps = await asyncio.gather(*commits)
            assert len(set(stamps)) == 8
            assert flushed_on == [threading.current_thread().name]  # one group, here
            rows = (await run_sql("SELECT id, v FROM t", manager)).rows
            got = {r.columns["id"].int_value: r.columns["v"].int_value for r in rows}
            assert got == {key: key for key in range(8)}

    asyncio.run(main())


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_commit_whose_caller_goes_away_at_its_decision_commits_all_the_same(
    tmp_path: Path, partitions: int
) -> None:
    """Past the decision point a transaction commits even if its caller is cancelled: one
    member hosting every partition queues the decision record (several partitions) or the
    one-phase commit record (one) in the caller's step and goes on with callbacks. Cancelled
    right then, the rows are written all the same, reads at its timestamp go on and the
    decision is delivered (the decision log forgets it)."""

    async def main() -> None:
        async with member_alone(tmp_path) as manager:
            await run_sql("CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)", manager, 0)
            keys = keys_in_partitions(manager, "t", partitions)
            writes = Writes()
            for key in keys:
                writes.insert("t", {"id": key, "v": 1})
            decide = manager._decide_at_once
            seen: list[Transaction] = []

            def caller_gone(tx: Transaction, outcome: asyncio.Future[int]) -> bool:
                queued = decide(tx, outcome)
                seen.append(tx)
                task = asyncio.current_task()
                assert queued and task is not None
                task.cancel()  # the caller goes away once its decision is queued
                return queued

            # a member hosting every partition flushes a lone transaction's log on its loop
            flush_here = manager.local.hostings[0].participants[0].wal.shared.wal.flush_here
            assert flush_here()
            manager.in_flight.add(1)
            manager.in_flight.add(2)
            assert not flush_here()  # two undecided: the log's thread, so the loop goes on
            manager.in_flight.deciding(1)
            assert not flush_here()  # one of them has more to do here than its decision
            manager.in_flight.deciding(2)
            assert flush_here()  # both wait for this flush: nothing else would run meanwhile
            manager.in_flight.deciding(9)  # not undecided here: nothing to count
            manager.in_flight.add(4)
            assert not flush_here()
            manager.in_flight.decided(4)
            manager.in_flight.decided(1)
            assert flush_here()
            with manager.in_flight.reading(3):
                assert not flush_here()
            manager.in_flight.decided(2)
            manager._decide_at_once = caller_gone  # type: ignore[method-assign]
            with pytest.raises(asyncio.CancelledError):
                await manager.commit(writes.operations)
            manager._decide_at_once = decide  # type: ignore[method-assign]
            (tx,) = seen
            assert len(tx.participants) == partitions
            for _ in range(200):
                if tx.ts not in manager.in_flight and not manager.decisions.committed:
                    break
                await asyncio.sleep(0.01)
            assert tx.ts not in manager.in_flight  # decided: reads at its timestamp go on
            assert not manager.in_flight._deciding  # nor counted as waiting for a flush
            assert not manager.decisions.committed  # delivered to every participant
            update = Writes()
            for key in keys:  # fails with RowNotFound unless the inserts committed
                update.update("t", {"id": key}, {"v": 2})
            assert await manager.commit(update.operations) > 0

    asyncio.run(main())


@pytest.mark.parametrize(
    "fenced", [("decision_logged",), ("commit_with_decision", "logged_with_decision")]
)
def test_a_durable_commit_is_answered_and_delivered_whatever_its_bookkeeping_raises(
    tmp_path: Path, fenced: tuple[str, ...]
) -> None:
    """Past its durable decision, a participant that cannot take it from the decision's
    record or hear it was logged along (it was fenced meanwhile, say) does not keep the
    caller waiting nor the others held: the commit is answered and delivered to every
    participant, the ordinary way. (One that cannot take part in a decision record at all
    makes the decision an ordinary one.)"""

    async def main() -> None:
        async with member_alone(tmp_path) as manager:
            await run_sql("CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)", manager, 0)
            writes = Writes()
            for key in keys_in_partitions(manager, "t", 3):
                writes.insert("t", {"id": key, "v": 1})

            def refuse(ts: int, *more: object) -> None:
                raise errors.NotServed("partition 1 moved on")

            for name in fenced:  # the participant's own step, or the channel's
                owner = manager.channels[1]
                if name == "commit_with_decision":
                    owner = owner.participant  # type: ignore[assignment]
                setattr(owner, name, refuse)
            ts = await asyncio.wait_for(manager.commit(writes.operations), 10)
            for _ in range(200):
                if not manager.decisions.committed:
                    break
                await asyncio.sleep(0.01)
            assert not manager.decisions.committed  # every participant has it
            assert ts not in manager.in_flight
            update = Writes()
            for op in writes.operations:  # RowNotFound unless every insert committed
                update.update("t", {"id": op.values.columns["id"].int_value}, {"v": 2})
            assert await manager.commit(update.operations) > ts

    asyncio.run(main())


@pytest.mark.parametrize("applied", [True, False])
def test_a_decision_record_is_its_participants_commit_record_across_a_crash(
    tmp_path: Path, applied: bool
) -> None:
    """Where every participant of a transaction is in the coordinating member and writes to
    its one log, the decision record is their commit record too: a commit writes a prepare
    record a participant and one record more, and nothing is delivered or remembered. After
    a crash (the rows only in the log: no checkpoint ran) each participant replays it as its
    own commit, the view's deltas once; also when the crash came between the record's flush
    and the participants applying it (``applied`` False)."""
    sql = "SELECT cat, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY cat"
    expected: dict[int, int] = {}

    async def before() -> list[dict]:
        async with member_alone(tmp_path, checkpoint_interval=1000.0) as manager:
            await run_sql("CREATE TABLE t (id INT PRIMARY KEY, cat INT, v INT)", manager)
            await run_sql(f"CREATE MATERIALIZED VIEW by_cat AS {sql}", manager)
            for round_ in range(4):
                writes = Writes()
                for key in keys_in_partitions(manager, "t", 3, start=100 * round_):
                    writes.insert("t", {"id": key, "cat": key % 2, "v": round_})
                    expected[key] = round_
                if round_ == 3 and not applied:
                    manager._decision_logged = lambda ts, participants, lsn: []  # type: ignore[method-assign]
                await manager.commit(writes.operations)
            assert not manager.decisions.committed  # nothing to deliver, nothing remembered
            wal = member_log_of(manager)
            await wal.flush()
            records = [r for r in wal.replay() if r["kind"] in ("commit", "done")]
            crash_member(manager)
            return records

    records = asyncio.run(before())
    # (a DDL's decision has no participants, and is done at once)
    decisions = [r for r in records if r["log"] == DECISIONS and r.get("participants")]
    assert len(decisions) >= 4 and all(r["kind"] == "commit" and r["with"] for r in decisions)
    decided = {r["ts"] for r in decisions}
    assert not [r for r in records if r["ts"] in decided and r not in decisions]  # nor done

    async def after() -> None:
        async with member_alone(tmp_path, checkpoint_interval=1000.0) as manager:
            rows = (await run_sql("SELECT id, v FROM t", manager)).rows
            got = {r.columns["id"].int_value: r.columns["v"].int_value for r in rows}
            assert got == expected
            await manager.views.start()  # as a member's role does once it leads
            view = (await run_sql("SELECT cat, s, n FROM by_cat", manager)).rows
            sums = {
                r.columns["cat"].int_value: (r.columns["s"].int_value, r.columns["n"].int_value)
                for r in view
            }
            want: dict[int, tuple[int, int]] = {}
            for key, v in expected.items():
                s_, n = want.get(key % 2, (0, 0))
                want[key % 2] = (s_ + v, n + 1)
            assert sums == want

    asyncio.run(after())


def test_a_decision_record_whose_flush_failed_keeps_its_view_rows_held_back(
    tmp_path: Path,
) -> None:
    """A decision record that is its participants' commit record, whose flush reported a
    failure after its bytes were written (a failed fdatasync, say), may be on disk: its
    transaction stays prepared, in doubt, and a checkpoint may not store a view row it adds
    to at a later commit's number, or replay after a crash (which finds the record, and
    commits it) would skip its delta as stored. (Found by a review: the view lost the
    transaction's delta while its rows came back.)"""
    sql = "SELECT cat, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY cat"

    async def before() -> None:
        async with member_alone(tmp_path, checkpoint_interval=1000.0) as manager:
            await run_sql("CREATE TABLE t (id INT PRIMARY KEY, cat INT, v INT)", manager)
            await run_sql(f"CREATE MATERIALIZED VIEW by_cat AS {sql}", manager)
            first = Writes()
            for key in keys_in_partitions(manager, "t", 3):
                first.insert("t", {"id": key, "cat": 0, "v": 1})
            await manager.commit(first.operations)
            wal = member_log_of(manager)
            write_and_sync = wal._write_and_sync
            failing = True

            def written_then_failed(fd: int, chunk: bytes, retired: list[int]) -> None:
                write_and_sync(fd, chunk, retired)  # the bytes are in the file
                if failing:
                    raise OSError(5, "fdatasync failed")

            wal._write_and_sync = written_then_failed  # type: ignore[method-assign]
            in_doubt = Writes()
            for key in keys_in_partitions(manager, "t", 3, start=100):
                in_doubt.insert("t", {"id": key, "cat": 0, "v": 10})
            with pytest.raises(OSError, match="fdatasync failed"):
                await manager.commit(in_doubt.operations)
            failing = False
            parts = [p for h in manager.local.hostings.values() for p in h.participants.values()]
            assert all(len(p.prepared) == 1 for p in parts)  # in doubt, rows held
            for key in range(200, 300):  # later commits add to the same view row
                later = Writes()
                later.insert("t", {"id": key, "cat": 0, "v": 100})
                await manager.commit(later.operations)
            for part in parts:
                await part.checkpoint()
            crash_member(manager)

    asyncio.run(before())

    async def after() -> None:
        async with member_alone(tmp_path, checkpoint_interval=1000.0) as manager:
            rows = (await run_sql("SELECT v FROM t", manager)).rows
            values = [r.columns["v"].int_value for r in rows]
            await manager.views.start()
            (view,) = (await run_sql("SELECT cat, s, n FROM by_cat", manager)).rows
            assert (view.columns["s"].int_value, view.columns["n"].int_value) == (
                sum(values),
                len(values),
            )
            assert values.count(10) == 3  # the record was on disk: it committed

    asyncio.run(after())


def test_concurrent_commits_of_a_member_share_their_log_flushes(tmp_path: Path) -> None:
    """Eight clients of a member hosting every partition, in step: each round's commit
    records go to disk in one group. A record queued in the caller's own step let the log's
    thread take a group whenever another transaction's prepare let go of the GIL (a store
    read), and rounds split for good into groups of two to four."""

    async def main() -> tuple[int, int]:
        async with member_alone(tmp_path) as manager:
            await run_sql("CREATE TABLE e (id INT PRIMARY KEY, cat INT NOT NULL)", manager, 0)
            await run_sql(
                "CREATE MATERIALIZED VIEW v AS SELECT cat, COUNT(*) AS n FROM e GROUP BY cat",
                manager,
                0,
            )
            wal = manager.local.hostings[0].participants[0].wal.shared.wal
            ids = iter(range(1_000_000))

            async def client(commits: int) -> None:
                for _ in range(commits):
                    writes = Writes()
                    key = next(ids)
                    writes.insert("e", {"id": key, "cat": key % 5})
                    await manager.commit(writes.operations)

            await asyncio.gather(*(client(5) for _ in range(8)))  # warm
            before = wal.flushes
            await asyncio.gather(*(client(40) for _ in range(8)))
            return wal.flushes - before, 8 * 40

    flushes, commits = asyncio.run(main())
    assert flushes <= commits * 0.2, f"{flushes} flushes for {commits} commits"


def test_a_request_waiting_for_a_moved_partition_fails_as_unavailable() -> None:
    """A prepare waits for the owner's channel to connect when a failover moves the partition
    (``retarget`` closes that channel): it goes on to the new owner and, nobody answering
    there either, votes unavailable (the transaction aborts and is retried), instead of
    failing with an internal error."""

    async def main() -> lpb.Vote:
        channel = LtmChannel(1, f"127.0.0.1:{free_port()}", lambda: (0, 0))
        waiting = asyncio.ensure_future(channel.prepare(lpb.SubTransaction(ts=5)))
        await asyncio.sleep(0.2)  # waiting for the owner's channel to connect
        await channel.retarget(f"127.0.0.1:{free_port()}", 2, 1)
        try:
            return await asyncio.wait_for(waiting, 10)
        finally:
            await channel.close()

    vote = asyncio.run(main())
    assert vote.outcome == lpb.Vote.UNAVAILABLE and vote.ts == 5, vote
