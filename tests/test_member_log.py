"""A member's one log (``aggview.member_log``): each writer replays its own records, a
segment goes once no writer needs it, group commit spans writers, and a writer's own log is
taken in (or split back out) with its LSNs, exactly once even when redone after a crash."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from aggview import errors
from aggview.member_log import DECISIONS, NOTHING, SharedLog, partition_tag, split
from aggview.wal import WriteAheadLog
from coordinator.decision_log import DecisionLog

P0, P1 = partition_tag(0), partition_tag(1)


def kill(shared: SharedLog) -> None:
    """Like kill -9 once every flush asked for has returned: nothing more is written."""
    wal = shared.wal
    with wal._mutex:
        wal._pending.clear()
    os.close(wal._fd)


def records(shared: SharedLog, tag: str) -> list[tuple[str, int]]:
    writer = shared.writer(tag)
    return [(r["kind"], r["ts"]) for r in writer.replay()]


def own_log(directory: Path, entries: list[dict[str, Any]]) -> int:
    """A writer's log of its own with ``entries`` durable; returns its last LSN."""
    wal = WriteAheadLog(directory, fsync=False)
    for entry in entries:
        wal.write(entry, flush=False)
    wal.write_now()
    wal.close_now()
    return wal.lsn


def test_each_writer_replays_only_its_own_records_after_a_kill(tmp_path: Path) -> None:
    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        p0, p1, decisions = shared.writer(P0), shared.writer(P1), shared.writer(DECISIONS)
        await p0.append({"kind": "prepared", "ts": 10, "after": {}, "merges": {}})
        await p1.append({"kind": "prepared", "ts": 10, "after": {}, "merges": {}})
        await decisions.append({"kind": "commit", "ts": 10, "participants": [0, 1]})
        p0.write({"kind": "commit", "ts": 10})
        await p0.flush()
        p1.write({"kind": "commit", "ts": 10}, flush=False)  # queued, never flushed: lost
        kill(shared)

    asyncio.run(main())
    again = SharedLog(tmp_path, fsync=False)
    assert records(again, P0) == [("prepared", 10), ("commit", 10)]
    assert records(again, P1) == [("prepared", 10)]
    assert records(again, DECISIONS) == [("commit", 10)]


def test_a_decision_record_with_its_participants_is_their_commit_record(tmp_path: Path) -> None:
    """A decision whose participants all write to the member's log is logged once, for
    them too (``DecisionLog.log_decided``): after a kill each participant replays it as a
    commit record of its own at the decision's LSN, and the decision log has nothing left to
    deliver; a plain decision stays the decision log's. Split into the writers' own logs
    (the layout a member that copies its logs uses), each participant gets it the same way."""

    async def main() -> int:
        shared = SharedLog(tmp_path / "member", fsync=False)
        p0, p1 = shared.writer(P0), shared.writer(P1)
        decisions = DecisionLog(tmp_path, fsync=False, log=shared.writer(DECISIONS))
        for ts in (10, 11):
            p0.write({"kind": "prepared", "ts": ts, "after": {}, "merges": {}}, flush=False)
            p1.write({"kind": "prepared", "ts": ts, "after": {}, "merges": {}}, flush=False)
        lsn, durable = decisions.log_decided(10, [0, 1], [P0, P1])
        await durable
        await decisions.log_commit(11, [0, 1])
        assert decisions.committed == {11: [0, 1]}  # only the plain one waits for delivery
        kill(shared)
        return lsn

    lsn = asyncio.run(main())
    again = SharedLog(tmp_path / "member", fsync=False)
    for tag in (P0, P1):
        replayed = list(again.writer(tag).replay())
        assert [(r["kind"], r["ts"]) for r in replayed] == [
            ("prepared", 10),
            ("prepared", 11),
            ("commit", 10),
        ]
        assert replayed[-1]["lsn"] == lsn
    decisions = DecisionLog(tmp_path, fsync=False, log=again.writer(DECISIONS))
    assert decisions.committed == {11: [0, 1]}
    again.wal.close_now()

    own = {P0: tmp_path / P0, P1: tmp_path / P1, DECISIONS: tmp_path / DECISIONS}
    split(tmp_path / "member", own, fsync=False)
    for tag in (P0, P1):
        back = [r for r in WriteAheadLog(own[tag], fsync=False).replay() if r["kind"] != "mark"]
        assert [(r["kind"], r["ts"], r["lsn"]) for r in back][-1] == ("commit", 10, lsn)
    assert DecisionLog(own[DECISIONS], fsync=False).committed == {11: [0, 1]}


def test_concurrent_writers_share_one_flush(tmp_path: Path) -> None:
    """Appends of several writers queued while the log's thread is busy go out in one
    group: a partition's prepare and another's, and a decision, cost one sync."""

    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        writers = [shared.writer(t) for t in (P0, P1, DECISIONS)]
        await writers[0].append({"kind": "mark", "ts": 0})  # starts the log's thread
        while shared.wal._draining:  # it looks for more before it waits for jobs
            await asyncio.sleep(0.001)
        busy = threading.Event()
        shared.wal._on_thread(busy.wait)
        before = shared.wal.flushes
        appends = [asyncio.ensure_future(w.append({"kind": "prepared", "ts": 5})) for w in writers]
        await asyncio.sleep(0.02)
        assert not any(a.done() for a in appends)  # none acknowledged before its write
        busy.set()
        await asyncio.gather(*appends)
        assert shared.wal.flushes - before == 1
        for writer in writers:
            await writer.close()

    asyncio.run(main())


def test_a_segment_goes_once_no_writer_needs_it(tmp_path: Path) -> None:
    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        p0, p1 = shared.writer(P0), shared.writer(P1)
        decisions = DecisionLog(tmp_path, fsync=False, log=shared.writer(DECISIONS))
        await p0.append({"kind": "prepared", "ts": 7})
        await decisions.commit(7, [0, 2])  # not done: its segment is still needed
        p0.drop_before(p0.switch([]))
        p1.drop_before(p1.switch([]))
        assert shared.wal.segments()[0] == 1
        decisions.done(7)
        p1.drop_before(p1.switch([]))  # any writer's release drops what nobody needs now
        assert shared.wal.segments()[0] == 2  # p0 released only segment 1
        p0.drop_before(p0.switch([]))  # partition 1 still needs segment 4
        assert shared.wal.segments() == [4, 5]
        await p0.close()
        await p1.close()
        await decisions.close()

    asyncio.run(main())


def test_a_writer_that_does_not_come_back_keeps_its_records(tmp_path: Path) -> None:
    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        p0, p1 = shared.writer(P0), shared.writer(P1)
        await p1.append({"kind": "prepared", "ts": 3})
        await p0.close()
        await p1.close()
        again = SharedLog(tmp_path, fsync=False)  # partition 1 is not hosted this time
        p0 = again.writer(P0)
        p0.drop_before(p0.switch([]))
        p0.drop_before(p0.switch([]))
        assert again.wal.segments()[0] == 1
        await p0.close()
        third = SharedLog(tmp_path, fsync=False)
        assert records(third, P1) == [("prepared", 3)]

    asyncio.run(main())


def test_own_logs_are_taken_in_with_their_lsns_once(tmp_path: Path) -> None:
    """A partition's own log (the layout before) joins the member's log: its records replay
    to it with the LSNs the store's rows carry, its later records are numbered above them,
    and its files go. Taken in again after a crash left the files, nothing is doubled."""
    own = tmp_path / "partitions" / P0
    own_lsn = own_log(own, [{"kind": "prepared", "ts": i, "lsn": 0} for i in range(1, 50)])
    saved = {p.name: p.read_bytes() for p in own.glob("*.wal")}
    shared = SharedLog(tmp_path / "member", fsync=False, own={P0: own})
    assert not any(own.glob("*.wal"))
    p0 = shared.writer(P0)
    taken = list(p0.replay())
    assert [r["ts"] for r in taken] == list(range(1, 50))
    assert [r["lsn"] for r in taken] == list(range(1, 50))
    assert p0.write({"kind": "commit", "ts": 49}, flush=False) > own_lsn
    shared.wal.write_now()
    shared.wal.close_now()
    for name, data in saved.items():  # a crash before the old files went
        (own / name).write_bytes(data)
    again = SharedLog(tmp_path / "member", fsync=False, own={P0: own})
    kinds = records(again, P0)
    assert kinds == [("prepared", i) for i in range(1, 50)] + [("commit", 49)]


def test_split_gives_each_writer_its_records_back_above_every_lsn(tmp_path: Path) -> None:
    async def main() -> int:
        shared = SharedLog(tmp_path / "member", fsync=False)
        p0, decisions = shared.writer(P0), shared.writer(DECISIONS)
        for ts in range(1, 20):
            await decisions.append({"kind": "commit", "ts": ts, "participants": [0]})
        await p0.append({"kind": "prepared", "ts": 20, "after": {}, "merges": {}})
        await p0.close()
        await decisions.close()
        return shared.wal.lsn

    top = asyncio.run(main())

    own = {P0: tmp_path / P0, P1: tmp_path / P1, DECISIONS: tmp_path / DECISIONS}
    split(tmp_path / "member", own, fsync=False)
    split(tmp_path / "member", own, fsync=False)  # nothing left to split
    assert not any((tmp_path / "member").glob("*.wal"))
    back = WriteAheadLog(own[P0], fsync=False)
    assert [(r["kind"], r["ts"]) for r in back.replay() if r["kind"] != "mark"] == [
        ("prepared", 20)
    ]
    assert back.write({"kind": "commit", "ts": 20}, flush=False) > top  # decisions' LSNs too
    decisions_back = DecisionLog(own[DECISIONS], fsync=False)
    assert sorted(decisions_back.committed) == list(range(1, 20))
    idle = WriteAheadLog(own[P1], fsync=False)  # no record of its own was left: LSNs go on
    assert [r["kind"] for r in idle.replay()] == ["mark", "mark"]
    assert idle.write({"kind": "commit", "ts": 30}, flush=False) > top


def test_a_decision_log_with_nothing_pending_needs_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        decisions = DecisionLog(tmp_path, fsync=False, log=shared.writer(DECISIONS))
        writer = decisions.wal
        assert writer.needs is not None and writer.needs() == NOTHING
        await decisions.commit(4, [0, 1])
        assert writer.needs() == shared.wal.segment
        decisions.done(4)
        assert writer.needs() == NOTHING

    asyncio.run(main())


def on_disk(directory: Path) -> list[tuple[str | None, str, int]]:
    """(writer, kind, ts) of every record in the log's files now."""
    found = []
    for segment in sorted(directory.glob("*.wal")):
        copy = directory.parent / "copy"
        copy.mkdir(exist_ok=True)
        for old in copy.glob("*.wal"):
            old.unlink()
        (copy / segment.name).write_bytes(segment.read_bytes())
        reader = WriteAheadLog(copy, fsync=False)
        found += [(r.get("log"), r["kind"], r["ts"]) for r in reader.replay()]
        reader.close_now()
    return [f for f in found if f[1] != "mark"]


def test_a_flush_returns_only_once_its_records_are_on_disk(tmp_path: Path) -> None:
    """What a kill -9 under load depends on: a partition's one-phase commit and a decision
    wait for the group that writes them, and none of it is acknowledged before."""

    async def main() -> None:
        directory = tmp_path / "member"
        shared = SharedLog(directory, fsync=False)
        p0, decisions = shared.writer(P0), shared.writer(DECISIONS)
        await p0.append({"kind": "mark", "ts": 0})  # starts the log's thread
        while shared.wal._draining:
            await asyncio.sleep(0.001)
        busy = threading.Event()
        shared.wal._on_thread(busy.wait)  # the log's thread is writing an earlier group
        p0.write({"kind": "commit", "ts": 5}, flush=False)
        flushing = asyncio.ensure_future(p0.flush())
        appending = asyncio.ensure_future(
            decisions.append({"kind": "commit", "ts": 6, "participants": [0, 1]})
        )
        await asyncio.sleep(0.02)
        assert not flushing.done() and not appending.done()
        assert on_disk(directory) == []
        busy.set()
        await asyncio.gather(flushing, appending)
        assert on_disk(directory) == [(P0, "commit", 5), (DECISIONS, "commit", 6)]
        await p0.close()
        await decisions.close()

    asyncio.run(main())


def test_an_undelivered_commit_is_carried_forward_not_holding_the_log_back(tmp_path: Path) -> None:
    """A commit whose participant's member is down stays undelivered: the decision log
    carries its record forward, so the partitions' checkpoints still drop old segments,
    and a restart still finds the commit."""

    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        p0 = shared.writer(P0)
        decisions = DecisionLog(tmp_path, fsync=False, log=shared.writer(DECISIONS))
        await decisions.commit(9, [0, 1])  # member of partition 1 down: never done
        for _ in range(8):  # carried more than once
            await p0.append({"kind": "prepared", "ts": 10})
            p0.drop_before(p0.switch([]))
            await asyncio.sleep(0.01)  # the compaction it started
        p0.drop_before(p0.switch([]))
        assert shared.wal.segments()[0] >= shared.wal.segment - 2
        kill(shared)

    asyncio.run(main())
    again = SharedLog(tmp_path, fsync=False)
    assert DecisionLog(tmp_path, fsync=False, log=again.writer(DECISIONS)).committed == {9: [0, 1]}


def test_records_of_a_writer_not_hosted_refuse_the_start(tmp_path: Path) -> None:
    """A member started in another layout (its partitions moved to other members) would not
    replay another partition's records: it refuses to start, naming them."""

    async def main() -> None:
        shared = SharedLog(tmp_path / "member", fsync=False)
        p1 = shared.writer(P1)
        await p1.append({"kind": "prepared", "ts": 3})
        await p1.close()

    asyncio.run(main())
    with pytest.raises(
        errors.FailedPrecondition, match="partition-1, which this member does not host"
    ):
        SharedLog(tmp_path / "member", fsync=False, own={P0: tmp_path / P0, DECISIONS: tmp_path})
    assert records(SharedLog(tmp_path / "member", fsync=False), P1) == [("prepared", 3)]


def test_a_writer_closed_clean_neither_refuses_the_start_nor_holds_the_log(tmp_path: Path) -> None:
    """After a clean stop (every change stored, nothing undecided) a partition's records are
    needed by nobody: a member that no longer hosts it starts, and drops them in time."""

    async def main() -> None:
        shared = SharedLog(tmp_path / "member", fsync=False)
        p1 = shared.writer(P1)
        await p1.append({"kind": "prepared", "ts": 3})
        await p1.close(clean=True)
        again = SharedLog(tmp_path / "member", fsync=False, own={P0: tmp_path / P0})
        p0 = again.writer(P0)
        p0.drop_before(p0.switch([]))
        assert again.wal.segments() == [again.wal.segment]
        await p0.close()

    asyncio.run(main())


def test_the_segment_written_to_stays_when_nobody_needs_anything(tmp_path: Path) -> None:
    """A member hosting no partition (more members than partitions): its decision log alone,
    with nothing pending, still keeps the segment its next records go to."""

    async def main() -> None:
        shared = SharedLog(tmp_path, fsync=False)
        decisions = DecisionLog(tmp_path, fsync=False, log=shared.writer(DECISIONS))
        await decisions.commit(5, [0, 1])
        decisions.done(5)
        await decisions.compact()
        assert shared.wal.segments() == [shared.wal.segment]
        await decisions.commit(6, [0, 1])
        kill(shared)

    asyncio.run(main())
    again = SharedLog(tmp_path, fsync=False)
    assert DecisionLog(tmp_path, fsync=False, log=again.writer(DECISIONS)).committed == {6: [0, 1]}
