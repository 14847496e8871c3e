"""The write-ahead log: round trip, group commit, torn tails, rotation and reopening."""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggview import errors
from aggview import wal as wal_module
from aggview.wal import _HEADER, WriteAheadLog

T = TypeVar("T")


def run(make: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await make()

    return asyncio.run(main())


def record(i: int, **extra: Any) -> dict[str, Any]:
    return {"kind": "prepared", "ts": i, "after": {("t1", b"k%d" % i): {"v": i}}, **extra}


def replayed(directory: Path) -> list[dict[str, Any]]:
    return list(WriteAheadLog(directory, fsync=False).replay())


def stamped(records: list[dict[str, Any]], first: int = 1) -> list[dict[str, Any]]:
    """The records as the log stores them: each with its log sequence number."""
    return [{**r, "lsn": lsn} for lsn, r in enumerate(records, start=first)]


def mark(lsn: int) -> dict[str, Any]:
    return {"kind": "mark", "ts": 0, "lsn": lsn}


def segment_records(path: Path) -> list[dict[str, Any]]:
    """The intact records of one segment file, read without opening a log."""
    data, offset, out = path.read_bytes(), 0, []
    while offset + _HEADER.size <= len(data):
        length, _ = _HEADER.unpack_from(data, offset)
        out.append(pickle.loads(data[offset + _HEADER.size : offset + _HEADER.size + length]))
        offset += _HEADER.size + length
    return out


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


def test_append_replay_round_trip(tmp_path: Path) -> None:
    records = [
        record(1),
        {"kind": "commit", "ts": 1},
        {"kind": "abort", "ts": 2},
        {"kind": "prepared", "ts": 3, "after": {("t1", b"\x00\xff"): None}},
        {"kind": "drop", "ts": 0, "table": "t9"},
        {"kind": "prepared", "ts": 4, "after": {("t1", b"x"): {"s": "é" * 1000, "n": 2**70}}},
    ]

    async def main() -> None:
        log = WriteAheadLog(tmp_path)  # real fsync once, to exercise that path
        for lsn, r in enumerate(records, start=1):
            assert await log.append(r) == lsn
        assert log.lsn == len(records)
        assert log.bytes_written == sum(f.stat().st_size for f in segment_files(tmp_path))
        await log.close()

    run(main)
    assert replayed(tmp_path) == stamped(records)
    assert all("lsn" not in r for r in records)  # the caller's dicts are not modified


def test_replay_of_an_empty_directory(tmp_path: Path) -> None:
    assert replayed(tmp_path / "fresh") == []
    assert (tmp_path / "fresh").is_dir()


def test_group_commit_shares_flushes(tmp_path: Path) -> None:
    n = 300

    async def main() -> WriteAheadLog:
        log = WriteAheadLog(tmp_path, fsync=True)
        await asyncio.gather(*(log.append(record(i)) for i in range(n)))
        # and a second burst while the first flush may still be running
        first = asyncio.gather(*(log.append(record(n + i)) for i in range(n)))
        await asyncio.sleep(0)
        second = asyncio.gather(*(log.append(record(2 * n + i)) for i in range(n)))
        await asyncio.gather(first, second)
        await log.close()
        return log

    log = run(main)
    assert 1 <= log.flushes <= 10, log.flushes
    assert [r["ts"] for r in replayed(tmp_path)] == list(range(3 * n))


def test_every_append_is_durable_when_it_returns(tmp_path: Path) -> None:
    """An append returns only after a flush that covers it (checked from a second reader)."""

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        for i in range(5):
            await log.append(record(i))
            assert [r["ts"] for r in replayed(tmp_path)] == list(range(i + 1))
        await log.close()

    run(main)


def test_write_without_waiting_then_flush(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        for i in range(10):
            log.write(record(i))
        await log.flush()
        assert [r["ts"] for r in replayed(tmp_path)] == list(range(10))
        # a write queued before an append is durable no later than the append
        log.write({"kind": "abort", "ts": 10})
        await log.append({"kind": "commit", "ts": 11})
        assert [r["ts"] for r in replayed(tmp_path)][-2:] == [10, 11]
        # a flush with nothing queued still completes
        await log.flush()
        await log.close()

    run(main)


def test_write_alone_is_eventually_written(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        log.write(record(1))
        for _ in range(100):
            if replayed(tmp_path):
                break
            await asyncio.sleep(0.01)
        assert [r["ts"] for r in replayed(tmp_path)] == [1]
        await log.close()

    run(main)


def _write_records(directory: Path, records: list[dict[str, Any]]) -> None:
    async def main() -> None:
        log = WriteAheadLog(directory, fsync=False)
        for _ in log.replay():  # as every user does before appending: numbering continues
            pass
        for r in records:
            await log.append(r)
        await log.close()

    run(main)


def test_torn_tail_ends_replay_cleanly(tmp_path: Path) -> None:
    records = [record(i) for i in range(5)]
    _write_records(tmp_path, records)
    (path,) = segment_files(tmp_path)
    data = path.read_bytes()
    # offsets where each record ends
    ends, offset = [], 0
    while offset < len(data):
        length, _ = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size + length
        ends.append(offset)
    assert offset == len(data) and len(ends) == 5

    records = stamped(records)
    # cut in the middle of the 4th record's body
    path.write_bytes(data[: ends[2] + _HEADER.size + 3])
    assert replayed(tmp_path) == records[:3]
    # cut in the middle of the 4th record's header
    path.write_bytes(data[: ends[2] + 3])
    assert replayed(tmp_path) == records[:3]
    # cut exactly at a record boundary
    path.write_bytes(data[: ends[3]])
    assert replayed(tmp_path) == records[:4]
    # a flipped byte in the last record's body (a torn sector) fails its checksum
    garbled = bytearray(data)
    garbled[-2] ^= 0xFF
    path.write_bytes(bytes(garbled))
    assert replayed(tmp_path) == records[:4]


def test_reopen_after_a_torn_tail_continues_in_a_new_segment(tmp_path: Path) -> None:
    _write_records(tmp_path, [record(i) for i in range(3)])
    (first,) = segment_files(tmp_path)
    first.write_bytes(first.read_bytes()[:-5])  # crash mid-write of record 2

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        assert [r["ts"] for r in log.replay()] == [0, 1]
        # the torn record's number was never acknowledged: it may be given out again
        assert log.lsn == 2
        assert await log.append(record(7)) == 3
        await log.close()

    run(main)
    files = segment_files(tmp_path)
    assert [f.name for f in files] == ["000000000001.wal", "000000000002.wal"]
    # the torn bytes were not appended to: the new record is readable after them
    assert [r["ts"] for r in replayed(tmp_path)] == [0, 1, 7]
    assert [r["lsn"] for r in replayed(tmp_path)] == [1, 2, 3]


def test_reopen_never_appends_to_an_existing_segment(tmp_path: Path) -> None:
    _write_records(tmp_path, [record(1)])
    _write_records(tmp_path, [record(2)])
    _write_records(tmp_path, [])
    assert [f.name for f in segment_files(tmp_path)] == [
        "000000000001.wal",
        "000000000002.wal",
        "000000000003.wal",
    ]
    assert replayed(tmp_path) == stamped([record(1), record(2)])


def test_rotate_with_carry_and_drop_before(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        await log.append(record(1))  # lsn 1
        await log.append({"kind": "commit", "ts": 1})  # 2
        await log.append(record(2))  # 3: still undecided at the checkpoint
        log.write({"kind": "abort", "ts": 3})  # 4: queued, not yet flushed, before the rotation
        segment = await log.rotate([record(2, carried=True)])
        assert segment == 2
        assert log.segments() == [1, 2]
        assert await log.append({"kind": "commit", "ts": 2}) == 7
        # before drop_before both segments replay, oldest first, in LSN order
        assert [r["ts"] for r in log.replay()] == [1, 1, 2, 3, 0, 2, 2]
        assert [r["lsn"] for r in log.replay()] == list(range(1, 8))
        log.drop_before(segment)
        assert log.segments() == [2]
        # what was still queued at the switch went to the old segment or the new one (the
        # log's thread may have taken it first; the checkpoint's snapshot, taken in the
        # switch's step, holds its effect either way); then the mark, and the carried record
        # before the decision about its transaction
        kept = list(log.replay())
        assert kept[:-3] in ([], [{"kind": "abort", "ts": 3, "lsn": 4}])
        assert kept[-3:] == [
            mark(5),
            {**record(2, carried=True), "lsn": 6},
            {"kind": "commit", "ts": 2, "lsn": 7},
        ]
        assert not (tmp_path / "000000000001.wal").exists()
        assert log.size() == (tmp_path / "000000000002.wal").stat().st_size
        segment = await log.rotate([])
        assert segment == 3
        await log.append({"kind": "commit", "ts": 4})
        log.drop_before(segment)
        await log.close()

    run(main)
    assert [f.name for f in segment_files(tmp_path)] == ["000000000003.wal"]
    assert replayed(tmp_path) == [mark(8), {"kind": "commit", "ts": 4, "lsn": 9}]


def test_rotate_while_a_flush_is_running(tmp_path: Path) -> None:
    """Records appended concurrently with a rotation all survive, none twice."""

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        appends = [asyncio.ensure_future(log.append(record(i))) for i in range(50)]
        await asyncio.sleep(0)
        segment = await log.rotate([])
        appends += [asyncio.ensure_future(log.append(record(50 + i))) for i in range(50)]
        await asyncio.gather(*appends)
        await log.close()
        assert segment == 2

    run(main)
    records = replayed(tmp_path)
    assert sorted(r["ts"] for r in records if r["kind"] != "mark") == list(range(100))
    assert [r["kind"] for r in records].count("mark") == 1
    # file order is LSN order, across the two segments too
    assert [r["lsn"] for r in records] == list(range(1, 102))


def test_short_writes_do_not_tear_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write may write fewer bytes than asked; the log must write the rest."""
    real_write = os.write

    def short_write(fd: int, data: bytes) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            return real_write(fd, data)  # only the log's own files write short
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(wal_module.os, "write", short_write)
    records = [record(i) for i in range(20)]

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        await asyncio.gather(*(log.append(r) for r in records))
        await log.append({"kind": "commit", "ts": 99})
        await log.close()

    run(main)
    monkeypatch.undo()
    assert replayed(tmp_path) == stamped([*records, {"kind": "commit", "ts": 99}])


def test_failed_flush_reports_the_error_to_the_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_sync(fd: int) -> None:
        raise OSError(5, "I/O error")

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=True)
        monkeypatch.setattr(wal_module.os, "fdatasync", failing_sync)
        with pytest.raises(OSError):
            await log.append(record(1))
        monkeypatch.undo()
        await log.close()

    run(main)


@pytest.mark.parametrize("here", [False, True])
def test_a_flush_on_the_loops_thread_is_as_durable_and_fails_as_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, here: bool
) -> None:
    """``flush_here`` (a member's lone transaction): its groups are written and synced on the
    loop's thread and the log's thread never starts; an append is durable when it returns
    and a failed sync reaches its appender, as on the thread; busy again, the thread takes
    the next group."""

    def failing_sync(fd: int) -> None:
        raise OSError(5, "I/O error")

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=True)
        log.flush_here = lambda: here
        for i in range(3):
            await log.append(record(i))
            assert [r["ts"] for r in replayed(tmp_path)] == list(range(i + 1))
        for i in (3, 4, 5):  # records of one step share a group (a commit's participants)
            log.write(record(i))
        await log.flush()
        assert [r["ts"] for r in replayed(tmp_path)] == list(range(6))
        assert log.flushes == 4 and (log._syncer is None) == here
        monkeypatch.setattr(wal_module.os, "fdatasync", failing_sync)
        with pytest.raises(OSError):
            await log.append(record(6))
        monkeypatch.undo()
        log.flush_here = lambda: False
        await log.append(record(7))
        assert log._syncer is not None
        await log.close()
        log.flush_here = lambda: here
        with pytest.raises(errors.Unavailable, match="closed"):  # written nowhere
            await log.append(record(8))
        assert 8 not in [r["ts"] for r in replayed(tmp_path)]
        # the log's thread, still draining when the log closed, finds a record written
        # after the close: written nowhere (the descriptor may be another file's by now)
        log.write(record(9), flush=False)
        waiter = asyncio.get_running_loop().create_future()
        log._waiters.append((log._queued, waiter))
        await asyncio.to_thread(log._drain, asyncio.get_running_loop())
        with pytest.raises(errors.Unavailable, match="closed"):
            await waiter
        assert 9 not in [r["ts"] for r in replayed(tmp_path)]

    run(main)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=8),
    cut=st.floats(min_value=0.0, max_value=1.0),
)
def test_any_truncation_replays_a_prefix(
    tmp_path_factory: Any, sizes: list[int], cut: float
) -> None:
    directory = tmp_path_factory.mktemp("wal")
    records = [{"kind": "x", "ts": i, "pad": "p" * n} for i, n in enumerate(sizes)]
    _write_records(directory, records)
    (path,) = segment_files(directory)
    data = path.read_bytes()
    keep = int(len(data) * cut)
    path.write_bytes(data[:keep])
    got = replayed(directory)
    assert got == stamped(records)[: len(got)]
    # exactly the records that end at or before the cut survive
    ends, offset = 0, 0
    for _ in records:
        length, _crc = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size + length
        if offset <= keep:
            ends += 1
    assert len(got) == ends
    shutil.rmtree(directory)


# ----------------------------------------------------------------------------- sequence numbers


def _open_fds(directory: Path) -> list[str]:
    """Paths of this process's open descriptors into ``directory``."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + "/"):
            out.append(target)
    return out


def test_lsns_are_strictly_increasing_across_writes_appends_and_switches(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        got = [log.write(record(0))]
        got += await asyncio.gather(*(log.append(record(i)) for i in range(1, 20)))
        got.append(log.write({"kind": "abort", "ts": 20}))
        log.switch([record(21, carried=True)])  # the mark and the carried record: 2 numbers
        got.append(await log.append({"kind": "commit", "ts": 21}))
        assert got == [*range(1, 22), 24]
        assert log.lsn == 24
        await log.close()

    run(main)
    records = replayed(tmp_path)
    assert [r["lsn"] for r in records] == list(range(1, 25))
    assert records[21] == mark(22)
    assert records[22] == {**record(21, carried=True), "lsn": 23}


def test_lsns_survive_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        assert [r["lsn"] for r in log.replay()] == [1, 2, 3]
        assert log.lsn == 3
        assert await log.append(record(9)) == 4
        await log.close()

    _write_records(tmp_path, [record(i) for i in range(3)])
    run(main)
    # reopened with nothing written: the empty segment it left changes nothing
    _write_records(tmp_path, [])
    _write_records(tmp_path, [record(10)])
    assert [r["lsn"] for r in replayed(tmp_path)] == [1, 2, 3, 4, 5]


def test_lsns_survive_reopen_when_every_old_segment_was_dropped(tmp_path: Path) -> None:
    """A checkpoint drops every segment holding records: the mark its switch writes is then the
    only trace of the numbering, and a reopened log must continue above it (a stored row's
    LSN may be that high; a lower number would make recovery skip a change)."""

    async def checkpoint_like(expect_lsn: int) -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        for _ in log.replay():
            pass
        assert log.lsn == expect_lsn
        segment = await log.rotate([])
        log.drop_before(segment)
        await log.close()

    _write_records(tmp_path, [record(i) for i in range(5)])
    run(lambda: checkpoint_like(5))
    assert replayed(tmp_path) == [mark(6)]
    run(lambda: checkpoint_like(6))  # again: the only record was the previous mark
    assert replayed(tmp_path) == [mark(7)]
    _write_records(tmp_path, [])  # an empty segment after it
    _write_records(tmp_path, [record(8)])
    assert replayed(tmp_path) == [mark(7), {**record(8), "lsn": 8}]


def test_switch_is_synchronous_and_keeps_file_order_in_lsn_order(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        for i in range(3):
            log.write(record(i))
        await asyncio.sleep(0)  # the log's thread may take some of these for segment 1
        for i in range(3, 5):
            log.write(record(i))  # maybe still queued at the switch: then in segment 2
        assert log.switch([record(9, carried=True)]) == 2  # no await needed
        assert log.segments() == [1, 2]
        await log.flush()
        # the old descriptor was closed once its writes were done
        assert _open_fds(tmp_path) == [str(tmp_path / "000000000002.wal")]
        await log.close()
        assert _open_fds(tmp_path) == []

    run(main)
    first, second = segment_files(tmp_path)
    # records 0-4 split between the segments where the thread's takes fell, in LSN order
    assert segment_records(second)[-2:] == [mark(6), {**record(9, carried=True), "lsn": 7}]
    assert [*segment_records(first), *segment_records(second)] == [
        *stamped([record(i) for i in range(5)]),
        mark(6),
        {**record(9, carried=True), "lsn": 7},
    ]


def test_switch_syncs_the_old_segment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records written to the old segment before the switch are durable by the next flush."""
    synced: list[str] = []
    real_sync = os.fdatasync

    def recording_sync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_sync(fd)

    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=True)
        monkeypatch.setattr(wal_module.os, "fdatasync", recording_sync)
        await log.append(record(1))
        synced.clear()
        log.switch([])
        await log.flush()
        await log.close()

    run(main)
    monkeypatch.undo()
    assert str(tmp_path / "000000000001.wal") in synced
    assert str(tmp_path / "000000000002.wal") in synced


def test_a_write_without_flush_waits_for_the_next_flush(tmp_path: Path) -> None:
    async def main() -> None:
        log = WriteAheadLog(tmp_path, fsync=False)
        assert log.write({"kind": "abort", "ts": 1}, flush=False) == 1
        await asyncio.sleep(0.05)
        assert replayed(tmp_path) == []  # nothing started a flush
        assert await log.append({"kind": "commit", "ts": 2}) == 2
        assert replayed(tmp_path) == [
            {"kind": "abort", "ts": 1, "lsn": 1},
            {"kind": "commit", "ts": 2, "lsn": 2},
        ]
        log.write({"kind": "abort", "ts": 3}, flush=False)
        await log.close()  # closing flushes it too

    run(main)
    assert [r["ts"] for r in replayed(tmp_path)] == [1, 2, 3]


class _Copy:
    """A backup's files as the log ships them (what ``ltm.replication`` keeps remotely)."""

    def __init__(self) -> None:
        self.files: dict[int, bytes] = {}

    async def ship(self, segment: int, data: bytes, drop_before: int) -> None:
        await asyncio.sleep(0)  # a real shipper awaits its stream
        self.files[segment] = self.files.get(segment, b"") + data


def test_a_log_gets_a_backup_and_loses_it_while_its_thread_flushes(tmp_path: Path) -> None:
    """Unreplicated, the log's thread takes group after group itself; once a shipper is set,
    the loop drives the flushes (each shipped), and a resync's copy under ``held()`` misses
    no group the thread wrote. Every append returns, across both changes."""

    async def appends(log: WriteAheadLog, first: int, count: int) -> None:
        async def one(i: int) -> None:
            await asyncio.sleep(0.0001 * (i % 7))
            await log.append(record(i))

        await asyncio.wait_for(asyncio.gather(*(one(first + i) for i in range(count))), 10)

    async def main() -> dict[int, bytes]:
        log = WriteAheadLog(tmp_path, fsync=True)
        running = asyncio.ensure_future(appends(log, 0, 300))
        await asyncio.sleep(0.002)  # the thread is taking groups
        copy = _Copy()
        log.shipper = copy
        async with log.held():  # what a resync copies before it counts the backup in sync
            copy.files = {s: log.read_segment(s) for s in log.segments()}
        await running
        await appends(log, 300, 200)
        log.switch([])
        await appends(log, 500, 100)
        log.shipper = None  # the backup goes: the thread takes the groups again
        await appends(log, 600, 200)
        await log.close()
        return copy.files

    copied = run(main)
    files = {int(path.stem): path.read_bytes() for path in segment_files(tmp_path)}
    assert files[1] == copied[1] and files[2].startswith(copied[2])
    records = replayed(tmp_path)
    assert [r["lsn"] for r in records] == list(range(1, len(records) + 1))
    assert sorted(r["ts"] for r in records if r["kind"] != "mark") == list(range(800))


def test_a_backup_set_mid_group_waits_for_it_and_takes_what_was_queued_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread is writing a group (a slow disk) when a shipper is set: the resync's copy
    under ``held()`` waits for that group, and the record queued behind it, whose append
    kicked nobody (the thread was busy), is flushed and shipped by the loop."""
    real_write = os.write

    def slow_write(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            time.sleep(0.05)
        return real_write(fd, data)

    monkeypatch.setattr(wal_module.os, "write", slow_write)

    async def main() -> bytes:
        log = WriteAheadLog(tmp_path, fsync=False)
        first = asyncio.ensure_future(log.append(record(0)))
        await asyncio.sleep(0.01)  # the thread took it and is writing
        second = asyncio.ensure_future(log.append(record(1)))
        await asyncio.sleep(0)
        copy = _Copy()
        log.shipper = copy
        async with log.held():
            copy.files = {s: log.read_segment(s) for s in log.segments()}
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        await log.append(record(2))
        log.shipper = None
        await log.append(record(3))
        await log.close()
        return copy.files[1]

    copied = run(main)
    monkeypatch.undo()
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "000000000001.wal").write_bytes(copied)
    assert replayed(tmp_path / "copy") == stamped([record(i) for i in range(3)])
    assert replayed(tmp_path) == stamped([record(i) for i in range(4)])
