"""The local transaction manager's logic (ltm.participant and ltm.rows), driven directly."""

from __future__ import annotations

import asyncio
import os
import pickle
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples

from aggview import errors
from aggview.member_log import DECISIONS, NOTHING, LogWriter, SharedLog, partition_tag
from aggview.partition_map import index_table, partition_of
from aggview.rowcodec import (
    decode_json,
    decode_row,
    decode_stored,
    encode_json,
    encode_row,
    encode_stored,
)
from aggview.wal import _HEADER, WriteAheadLog
from aggview.wire import ltm_pb2 as pb
from ltm.participant import Participant, Settings
from ltm.rows import RowCache, RowState
from ltm.store import Store, open_store

T = TypeVar("T")
TABLE = "t1"
YES = pb.Vote.YES
TOO_LATE = pb.Vote.TOO_LATE
CONDITION_FAILED = pb.Vote.CONDITION_FAILED
NOT_FOUND = pb.Vote.NOT_FOUND
ALREADY_EXISTS = pb.Vote.ALREADY_EXISTS
INVALID = pb.Vote.INVALID


def run(make: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await make()

    return asyncio.run(main())


# ----------------------------------------------------------------------------- helpers


def insert(key: bytes, values: dict[str, Any], **kw: Any) -> pb.RowOp:
    return _op(pb.RowOp.INSERT, key, values, **kw)


def update(key: bytes, values: dict[str, Any], **kw: Any) -> pb.RowOp:
    return _op(pb.RowOp.UPDATE, key, values, **kw)


def add(key: bytes, values: dict[str, Any], **kw: Any) -> pb.RowOp:
    return _op(pb.RowOp.ADD, key, values, **kw)


def delete(key: bytes, **kw: Any) -> pb.RowOp:
    return _op(pb.RowOp.DELETE, key, None, **kw)


def put(key: bytes, values: dict[str, Any] | None, **kw: Any) -> pb.RowOp:
    return _op(pb.RowOp.PUT, key, values, **kw)


def merge(key: bytes, delta: dict[str, Any], **kw: Any) -> pb.RowOp:
    return _op(pb.RowOp.MERGE, key, delta, **kw)


def _op(
    kind: int,
    key: bytes,
    values: dict[str, Any] | None,
    *,
    require: list[list[Any]] | None = None,
    limits: dict[str, int] | None = None,
    table: str = TABLE,
    changes: list[str] | None = None,
) -> pb.RowOp:
    op = pb.RowOp(kind=kind, table=table, key=key, values=encode_row(values))
    op.changes_tables.extend(changes or [])
    if require is not None:
        op.require = encode_json(require)
    if limits is not None:
        op.limits = encode_json(limits)
    return op


def sub(ts: int, *ops: pb.RowOp, want_images: bool = False) -> pb.SubTransaction:
    return pb.SubTransaction(ts=ts, ops=list(ops), want_images=want_images)


async def commit(p: Participant, ts: int, *ops: pb.RowOp) -> int:
    """Prepares and commits; returns the LSN of the commit record."""
    vote = await p.prepare(sub(ts, *ops))
    assert vote.outcome == YES, vote
    await p.decide(ts, True)
    return p.wal.lsn  # nothing else was logged since (these tests run one at a time)


async def outcome(p: Participant, ts: int, *ops: pb.RowOp) -> int:
    """Prepares and aborts; returns the vote's outcome."""
    vote = await p.prepare(sub(ts, *ops))
    await p.decide(ts, False)
    return vote.outcome


async def get(
    p: Participant, ts: int, key: bytes, register: bool = False, table: str = TABLE
) -> Any:
    rows = await p.read(pb.ReadRequest(ts=ts, table=table, keys=[key], register_read=register))
    assert len(rows) <= 1
    return decode_row(rows[0][1]) if rows else None


async def scan(p: Participant, ts: int, table: str = TABLE, **kw: Any) -> list[tuple[bytes, Any]]:
    rows = await p.read(pb.ReadRequest(ts=ts, table=table, scan=True, **kw))
    return [(key, decode_row(data)) for key, data in rows]


def stored(store: Store, key: bytes, table: str = TABLE) -> tuple[int, Any, int] | None:
    """(commit ts, row or None for a tombstone, LSN of the last change) as the store has it."""
    data = store.get(table, key)
    return decode_stored(data) if data is not None else None


def segment_records(path: Path) -> list[dict[str, Any]]:
    """The records of one log segment file."""
    data, offset, out = path.read_bytes(), 0, []
    while offset + _HEADER.size <= len(data):
        length, _ = _HEADER.unpack_from(data, offset)
        out.append(pickle.loads(data[offset + _HEADER.size : offset + _HEADER.size + length]))
        offset += _HEADER.size + length
    return out


def member_wal(p: Participant) -> WriteAheadLog:
    """The log a participant's records go to: its own, or the member's one log."""
    return p.wal.shared.wal if isinstance(p.wal, LogWriter) else p.wal


def crash(p: Participant) -> None:
    """Like kill -9: no checkpoint, no flush of what was only queued, background tasks gone."""
    for task in p._background:
        task.cancel()
    wal = member_wal(p)
    with wal._mutex:
        wal._pending.clear()
    while wal._draining:  # a group the log's thread took is written, as before a kill
        time.sleep(0.001)
    os.close(wal._fd)


def reads_of(store: Store) -> list[tuple[str, list[bytes]]]:
    """The (table, keys) of every read ``store`` is asked from now on, in order."""
    asked: list[tuple[str, list[bytes]]] = []
    get_many = store.get_many

    def spy(table: str, keys: list[bytes]) -> dict[bytes, bytes]:
        asked.append((table, list(keys)))
        return get_many(table, keys)

    store.get_many = spy  # type: ignore[method-assign]
    return asked


def slow_disk(p: Participant) -> asyncio.Event:
    """A slow disk for ``p`` from now on: each flush it asks for ends once the event is set."""
    disk = asyncio.Event()
    flush = p.wal.flush

    async def slow_flush() -> None:
        await disk.wait()
        await flush()

    p.wal.flush = slow_flush  # type: ignore[method-assign]
    return disk


async def eventually(check: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.01)


async def pending(task: asyncio.Future[Any]) -> bool:
    """True when the task is still blocked after the loop had time to run it."""
    await asyncio.sleep(0.02)
    return not task.done()


class Env:
    """A participant's store and log; ``shared``: its log is a member's one log
    (``aggview.member_log``), which a decision log writes to as well."""

    def __init__(self, tmp_path: Path, shared: bool = False) -> None:
        self.tmp_path = tmp_path
        self.log_dir = tmp_path / "log"
        self.shared = shared
        self.store = open_store(f"sqlite:///{tmp_path}/store.db")
        self.store.create_table(TABLE)

    def participant(self, fsync: bool = False, **settings: Any) -> Participant:
        """A participant started anew over the store and the log (a restart, after a crash
        if the last one was not stopped)."""
        outcome_query = settings.pop("outcome_query", None)
        log = None
        if self.shared:
            member = SharedLog(self.log_dir, fsync=fsync)
            log = member.writer(partition_tag(settings.get("partition", 0)))
            # another writer of the member's log, which needs none of its segments: its
            # record would drop the table if it reached the participant
            other = member.writer(DECISIONS)
            other.write({"kind": "drop", "ts": 0, "table": TABLE}, flush=False)
            other.needs = lambda: NOTHING
        return Participant(
            self.store,
            self.log_dir,
            Settings(**settings),
            fsync=fsync,
            outcome_query=outcome_query,
            log=log,
        )


@pytest.fixture(params=["own log", "shared log"])
def env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Env]:
    e = Env(tmp_path, shared=request.param == "shared log")
    yield e
    e.store.close()


ROW_X = {"k": "x", "v": 1, "s": "a"}


# ----------------------------------------------------------------------------- operations


def test_insert_update_add_delete(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await p.recover()
        await commit(p, 10, insert(b"x", ROW_X))
        await commit(p, 20, update(b"x", {"v": 2, "n": None}))
        await commit(p, 30, add(b"x", {"v": 5}))
        await commit(p, 40, delete(b"x"))
        assert await get(p, 5, b"x") is None
        assert await get(p, 10, b"x") == ROW_X
        assert await get(p, 25, b"x") == {"k": "x", "v": 2, "s": "a", "n": None}
        assert await get(p, 30, b"x") == {"k": "x", "v": 7, "s": "a", "n": None}
        assert await get(p, 45, b"x") is None
        # inserting again after a delete is allowed
        await commit(p, 50, insert(b"x", {"k": "x", "v": 9}))
        assert await get(p, 50, b"x") == {"k": "x", "v": 9}
        assert not p.prepared and p.rows[(TABLE, b"x")].holder == 0

    run(main)


def test_already_exists_and_not_found(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", ROW_X))
        vote = await p.prepare(sub(20, insert(b"x", ROW_X)))
        assert vote.outcome == ALREADY_EXISTS
        assert (vote.table, vote.key) == (TABLE, b"x")
        for ts, op in [
            (30, update(b"y", {"v": 1})),
            (40, add(b"y", {"v": 1})),
            (50, delete(b"y")),
        ]:
            vote = await p.prepare(sub(ts, op))
            assert vote.outcome == NOT_FOUND, op
            assert (vote.table, vote.key) == (TABLE, b"y")
        # a no vote leaves nothing held or prepared, and the row unchanged
        assert not p.prepared
        assert p.rows[(TABLE, b"x")].holder == 0 and p.rows[(TABLE, b"y")].holder == 0
        assert await get(p, 60, b"x") == ROW_X
        # a failed op later in a sub releases the rows taken earlier in it
        vote = await p.prepare(sub(70, update(b"x", {"v": 2}), update(b"z", {"v": 3})))
        assert vote.outcome == NOT_FOUND and vote.key == b"z"
        assert p.rows[(TABLE, b"x")].holder == 0
        await commit(p, 80, update(b"x", {"v": 4}))
        assert (await get(p, 80, b"x"))["v"] == 4

    run(main)


def test_conditions_are_evaluated_on_the_before_image(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", ROW_X))
        # the second op's condition sees v == 1 (before the transaction), not the 5 the first
        # op wrote; the ops still chain: the final image has v == 6
        vote = await p.prepare(
            sub(
                20,
                update(b"x", {"v": 5}),
                update(b"x", {"v": 6}, require=[["v", "==", 1]]),
                want_images=True,
            )
        )
        assert vote.outcome == YES
        assert decode_row(vote.images[0].after)["v"] == 6
        await p.decide(20, True)
        vote = await p.prepare(
            sub(30, update(b"x", {"v": 7}), update(b"x", {"s": "b"}, require=[["v", "==", 7]]))
        )
        assert vote.outcome == CONDITION_FAILED
        assert decode_json(vote.message.encode()) == ["v", "==", 7, 6]
        assert (vote.table, vote.key) == (TABLE, b"x")
        assert p.rows[(TABLE, b"x")].holder == 0 and 30 not in p.prepared
        assert await get(p, 40, b"x") == {**ROW_X, "v": 6}

    run(main)


@pytest.mark.parametrize(
    ("op", "value", "holds"),
    [
        ("==", 6, True),
        ("==", 5, False),
        ("!=", 5, True),
        ("!=", 6, False),
        ("<", 7, True),
        ("<", 6, False),
        ("<=", 6, True),
        ("<=", 5, False),
        (">", 5, True),
        (">", 6, False),
        (">=", 6, True),
        (">=", 7, False),
        ("==", None, False),  # NULL never compares true
        ("!=", None, False),
    ],
)
def test_condition_operators(env: Env, op: str, value: Any, holds: bool) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 6, "n": None}))
        got = await outcome(p, 20, update(b"x", {"w": 1}, require=[["v", op, value]]))
        assert got == (YES if holds else CONDITION_FAILED)
        # a NULL column fails every comparison
        got = await outcome(p, 30, update(b"x", {"w": 1}, require=[["n", op, 6]]))
        assert got == CONDITION_FAILED

    run(main)


def test_conditions_on_a_missing_row_and_several_conditions(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        assert await outcome(p, 10, insert(b"x", ROW_X, require=[["v", "==", 1]])) == (
            CONDITION_FAILED
        )
        await commit(p, 20, insert(b"x", ROW_X))
        ok = [["v", ">=", 1], ["s", "==", "a"]]
        bad = [["v", ">=", 1], ["s", "==", "b"]]
        assert await outcome(p, 30, delete(b"x", require=ok)) == YES
        assert await outcome(p, 40, delete(b"x", require=bad)) == CONDITION_FAILED

    run(main)


def test_failed_condition_counts_as_a_read(env: Env) -> None:
    """The condition read the row at ts: an older writer arriving later is too late."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", ROW_X))
        assert await outcome(p, 50, update(b"x", {"v": 2}, require=[["v", "==", 9]])) == (
            CONDITION_FAILED
        )
        assert await outcome(p, 40, update(b"x", {"v": 3})) == TOO_LATE
        assert await outcome(p, 60, update(b"x", {"v": 3})) == YES

    run(main)


def test_several_ops_on_one_row_chain(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(
            p,
            10,
            insert(b"x", {"k": "x", "v": 1}),
            update(b"x", {"v": 10, "s": "b"}),
            add(b"x", {"v": 5}),
            add(b"x", {"v": -2}),
        )
        assert await get(p, 10, b"x") == {"k": "x", "v": 13, "s": "b"}
        # delete then insert again in one sub
        await commit(p, 20, delete(b"x"), insert(b"x", {"k": "x", "v": 0}))
        assert await get(p, 20, b"x") == {"k": "x", "v": 0}
        # insert then delete in one sub leaves no row
        await commit(p, 30, insert(b"y", {"k": "y"}), delete(b"y"))
        assert await get(p, 30, b"y") is None
        # an op on a row deleted earlier in the same sub fails
        assert await outcome(p, 40, delete(b"x"), update(b"x", {"v": 1})) == NOT_FOUND
        assert await outcome(p, 50, insert(b"x", {"k": "x"})) == ALREADY_EXISTS
        assert await outcome(p, 60, insert(b"z", {"k": "z"}), insert(b"z", {"k": "z"})) == (
            ALREADY_EXISTS
        )

    run(main)


def test_add_limits_and_nulls(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 5, "f": 1.5, "n": None}))
        # limits are exclusive bounds on the absolute value (the coordinator sends 2**63 for INT)
        assert await outcome(p, 20, add(b"x", {"v": 4}, limits={"v": 10})) == YES
        assert await outcome(p, 30, add(b"x", {"v": 5}, limits={"v": 10})) == INVALID
        assert await outcome(p, 40, add(b"x", {"v": -15}, limits={"v": 10})) == INVALID
        assert await outcome(p, 50, add(b"x", {"v": -14}, limits={"v": 10})) == YES
        await commit(p, 60, add(b"x", {"v": 2**62}, limits={"v": 2**63}))
        assert await outcome(p, 70, add(b"x", {"v": 2**62}, limits={"v": 2**63})) == INVALID
        # a limit on another column does not apply
        assert await outcome(p, 80, add(b"x", {"f": 100.0}, limits={"v": 10})) == YES
        # adding to NULL or to a missing column is invalid
        assert await outcome(p, 90, add(b"x", {"n": 1})) == INVALID
        assert await outcome(p, 100, add(b"x", {"missing": 1})) == INVALID
        # the overflowing op fails the whole sub: nothing applied
        vote = await p.prepare(
            sub(110, update(b"x", {"f": 0.0}), add(b"x", {"v": 2**62}, limits={"v": 2**63}))
        )
        assert vote.outcome == INVALID and "overflow" in vote.message
        assert await get(p, 120, b"x") == {"v": 5 + 2**62, "f": 1.5, "n": None}
        assert p.rows[(TABLE, b"x")].holder == 0

    run(main)


def test_vote_images(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"y", {"k": "y", "v": 1}), insert(b"z", {"k": "z"}))
        vote = await p.prepare(
            sub(
                20,
                insert(b"x", {"k": "x"}),
                update(b"y", {"v": 2}),
                add(b"y", {"v": 3}),
                delete(b"z"),
                want_images=True,
            )
        )
        assert vote.outcome == YES
        images = {
            (i.table, i.key): (decode_row(i.before), decode_row(i.after)) for i in vote.images
        }
        assert images == {
            (TABLE, b"x"): (None, {"k": "x"}),
            (TABLE, b"y"): ({"k": "y", "v": 1}, {"k": "y", "v": 5}),
            (TABLE, b"z"): ({"k": "z"}, None),
        }
        assert len(vote.images) == 3  # one image per row, not per op
        await p.decide(20, True)
        vote = await p.prepare(sub(30, update(b"y", {"v": 0})))
        assert vote.outcome == YES and not vote.images

    run(main)


def test_an_uncomparable_condition_or_add_votes_invalid_and_releases(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1, "s": "a"}), insert(b"y", {"v": 1}))
        cases = [
            update(b"y", {"v": 2}, require=[["v", "<", "text"]]),
            update(b"y", {"v": 2}, require=[["v", "~", 1]]),
            add(b"y", {"v": "text"}),
        ]
        for ts, bad in enumerate(cases, start=20):
            vote = await p.prepare(sub(ts, update(b"x", {"v": 2}), bad))
            assert vote.outcome == INVALID, vote
            assert p.rows[(TABLE, b"x")].holder == 0 and p.rows[(TABLE, b"y")].holder == 0
            assert ts not in p.prepared
        # both rows are usable afterwards
        await commit(p, 30, update(b"x", {"v": 3}), update(b"y", {"v": 3}))

    run(main)


def test_rows_of_other_partitions_are_refused(env: Env) -> None:
    key = next(k for k in (b"k%d" % i for i in range(100)) if partition_of(TABLE, k, 2) == 1)
    mine = next(k for k in (b"k%d" % i for i in range(100)) if partition_of(TABLE, k, 2) == 0)

    async def main() -> None:
        p = env.participant(partition=0, partitions=2)
        vote = await p.prepare(sub(10, insert(mine, {"v": 1}), insert(key, {"v": 1})))
        assert vote.outcome == INVALID and vote.key == key
        assert not p.prepared and all(s.holder == 0 for s in p.rows.values())
        await commit(p, 20, insert(mine, {"v": 1}))

    run(main)


# ----------------------------------------------------------------------------- timestamp order


def test_younger_holder_makes_older_too_late(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", ROW_X))
        assert (await p.prepare(sub(30, update(b"x", {"v": 3})))).outcome == YES
        vote = await p.prepare(sub(20, update(b"x", {"v": 2}), insert(b"y", {"k": "y"})))
        assert vote.outcome == TOO_LATE and (vote.table, vote.key) == (TABLE, b"x")
        assert p.rows[(TABLE, b"x")].holder == 30
        # the older one also let go of the row it had taken before failing
        assert p.rows[(TABLE, b"y")].holder == 0
        await p.decide(30, True)
        assert (await get(p, 40, b"x"))["v"] == 3

    run(main)


def test_older_holder_makes_younger_wait_until_decided(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", ROW_X))
        assert (await p.prepare(sub(20, add(b"x", {"v": 1})))).outcome == YES
        younger = asyncio.ensure_future(p.prepare(sub(30, add(b"x", {"v": 10}), want_images=True)))
        assert await pending(younger)
        await p.decide(20, True)
        vote = await asyncio.wait_for(younger, 1)
        assert vote.outcome == YES
        assert decode_row(vote.images[0].before)["v"] == 2  # it saw the older commit
        await p.decide(30, True)
        assert (await get(p, 30, b"x"))["v"] == 12

        # an abort of the older one hands the row over too, with the old value
        assert (await p.prepare(sub(40, add(b"x", {"v": 100})))).outcome == YES
        younger = asyncio.ensure_future(p.prepare(sub(50, add(b"x", {"v": 1}), want_images=True)))
        assert await pending(younger)
        await p.decide(40, False)
        vote = await asyncio.wait_for(younger, 1)
        assert vote.outcome == YES and decode_row(vote.images[0].before)["v"] == 12
        await p.decide(50, True)
        assert (await get(p, 60, b"x"))["v"] == 13

    run(main)


def test_waiters_are_granted_in_timestamp_order(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 0}))
        assert (await p.prepare(sub(20, add(b"x", {"v": 1})))).outcome == YES
        waiters = {
            ts: asyncio.ensure_future(p.prepare(sub(ts, update(b"x", {"v": ts}), want_images=True)))
            for ts in (50, 30, 60, 40)
        }
        await asyncio.sleep(0.02)
        order: list[int] = []
        holder = 20
        for _ in waiters:
            assert not any(t.done() for ts, t in waiters.items() if ts not in order)
            assert p.rows[(TABLE, b"x")].holder == holder
            await p.decide(holder, True)

            def granted() -> list[int]:
                return [ts for ts, t in waiters.items() if t.done() and ts not in order]

            await eventually(lambda: bool(granted()))
            await asyncio.sleep(0.01)  # a second grant would show up now
            assert len(granted()) == 1, granted()
            (holder,) = granted()
            vote = waiters[holder].result()
            assert vote.outcome == YES
            # each saw the value the previous holder committed
            previous = order[-1] if order else 1
            assert decode_row(vote.images[0].before)["v"] == previous
            order.append(holder)
        await p.decide(holder, True)
        assert order == [30, 40, 50, 60]
        assert (await get(p, 70, b"x"))["v"] == 60

    run(main)


def test_a_commit_makes_smaller_timestamps_too_late(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", ROW_X))
        await commit(p, 50, update(b"x", {"v": 5}))
        assert await outcome(p, 45, update(b"x", {"v": 4})) == TOO_LATE
        assert await outcome(p, 50, update(b"x", {"v": 4})) == TOO_LATE
        assert await outcome(p, 11, delete(b"x")) == TOO_LATE
        assert await outcome(p, 51, update(b"x", {"v": 6})) == YES
        # other rows are unaffected
        await commit(p, 12, insert(b"y", {"k": "y"}))

    run(main)


def test_a_waiter_is_too_late_if_a_younger_one_committed_meanwhile(env: Env) -> None:
    """Two waiters behind an old holder: 40 waits on 20 and... the grant still checks order."""

    async def main() -> None:
        p = env.participant(lock_wait_timeout=5.0)
        await commit(p, 10, insert(b"x", {"v": 0}))
        assert (await p.prepare(sub(20, add(b"x", {"v": 1})))).outcome == YES
        waiter = asyncio.ensure_future(p.prepare(sub(30, add(b"x", {"v": 1}))))
        assert await pending(waiter)
        # a read/write transaction younger than the waiter reads the row once 20 is decided
        reader = asyncio.ensure_future(get(p, 40, b"x", register=True))
        assert await pending(reader)
        await p.decide(20, True)
        # the waiter (30) got the row first; the reader (40) waits for it
        vote = await asyncio.wait_for(waiter, 1)
        assert vote.outcome == YES
        assert await pending(reader)
        await p.decide(30, True)
        assert (await asyncio.wait_for(reader, 1))["v"] == 2

    run(main)


def test_lock_wait_timeout_makes_a_stuck_wait_too_late(env: Env) -> None:
    async def main() -> None:
        p = env.participant(lock_wait_timeout=0.1)
        await commit(p, 10, insert(b"x", ROW_X), insert(b"y", ROW_X))
        assert (await p.prepare(sub(20, update(b"y", {"v": 2})))).outcome == YES
        loop = asyncio.get_running_loop()
        started = loop.time()
        vote = await p.prepare(sub(30, update(b"x", {"v": 3}), update(b"y", {"v": 3})))
        assert vote.outcome == TOO_LATE and vote.key == b"y"
        assert 0.09 <= loop.time() - started < 2
        # the row it had already taken (x) is free again; y still belongs to 20
        assert p.rows[(TABLE, b"x")].holder == 0
        assert p.rows[(TABLE, b"y")].holder == 20
        await p.decide(20, True)
        assert p.rows[(TABLE, b"y")].holder == 0
        await commit(p, 40, update(b"x", {"v": 4}), update(b"y", {"v": 4}))
        assert await get(p, 40, b"y") == {**ROW_X, "v": 4}

    run(main)


def test_a_read_that_waits_too_long_names_the_transaction_it_waited_for(env: Env) -> None:
    """A read in a writing transaction aborts like a lock wait (the client retries it); a
    snapshot read reports the row unavailable. Both name the undecided transaction."""

    async def main() -> None:
        p = env.participant(lock_wait_timeout=0.1)
        await commit(p, 10, insert(b"x", ROW_X))
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        with pytest.raises(errors.TooLate, match="undecided transaction 20; retry it"):
            await get(p, 30, b"x", register=True)
        with pytest.raises(errors.Unavailable, match="undecided transaction 20$"):
            await get(p, 30, b"x")
        await p.decide(20, True)
        assert (await get(p, 30, b"x"))["v"] == 2

    run(main)


def test_row_state_hand_off_survives_a_cancelled_waiter() -> None:
    """A waiter cancelled (timed out) just after being handed the row must not keep it."""

    async def main() -> None:
        state = RowState(versions=[(0, None)])
        assert await state.acquire(10)
        waiter = asyncio.ensure_future(state.acquire(20))
        other = asyncio.ensure_future(state.acquire(30))
        await asyncio.sleep(0)
        state.release()  # hands the row to 20 ...
        assert state.holder == 20
        waiter.cancel()  # ... whose wait is cancelled before it could run
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # the row went on to the next waiter instead of staying with 20 forever
        assert await asyncio.wait_for(other, 1)
        assert state.holder == 30
        state.release()
        assert state.holder == 0 and not state.busy()

    run(main)


def test_row_state_plain_cancel_of_a_waiter() -> None:
    async def main() -> None:
        state = RowState(versions=[(0, None)])
        assert await state.acquire(10)
        waiter = asyncio.ensure_future(state.acquire(20))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert state.holder == 10
        state.release()
        assert state.holder == 0

    run(main)


def test_row_state_abandon_fails_every_waiter_at_once() -> None:
    """A copy that stops (handed over) leaves no waiter hanging: a lock waiter hears "too
    late" (its transaction aborts and is retried), a reader gets the reason."""

    async def main() -> None:
        state = RowState(versions=[(0, None)])
        assert await state.acquire(10)
        waiter = asyncio.ensure_future(state.acquire(20))
        reader: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.read_waiters.append(reader)
        await asyncio.sleep(0)
        state.abandon(RuntimeError("partition 0 is handed over"))
        assert await asyncio.wait_for(waiter, 1) is False
        with pytest.raises(RuntimeError, match="handed over"):
            await reader
        assert not state.lock_waiters and not state.read_waiters

    run(main)


def test_row_state_versions_prune_by_low_watermark() -> None:
    state = RowState(versions=[(0, None)])
    state.commit(10, {"v": 1}, 0)
    state.commit(20, {"v": 2}, 0)
    state.commit(30, {"v": 3}, 15)
    assert [ts for ts, _ in state.versions] == [10, 20, 30]
    assert state.version_at(15) == (10, {"v": 1})
    state.prune(25)
    assert [ts for ts, _ in state.versions] == [20, 30]
    assert state.version_at(25) == (20, {"v": 2})
    assert state.version_at(99) == (30, {"v": 3})
    state.prune(1000)
    assert state.versions == [(30, {"v": 3})]


# ----------------------------------------------------------------------------- growing


def test_a_growing_transaction(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 5, insert(b"z", {"k": "z", "v": 1}))
        vote = await p.prepare(sub(10, insert(b"x", {"k": "x", "v": 1})))
        assert vote.outcome == YES
        vote = await p.prepare(
            sub(
                10,
                add(b"x", {"v": 1}),
                insert(b"y", {"k": "y"}),
                update(b"z", {"v": 2}, require=[["v", "==", 1]]),
                want_images=True,
            )
        )
        assert vote.outcome == YES
        images = {i.key: (decode_row(i.before), decode_row(i.after)) for i in vote.images}
        assert images == {
            b"x": (None, {"k": "x", "v": 2}),  # before the whole transaction
            b"y": (None, {"k": "y"}),
            b"z": ({"k": "z", "v": 1}, {"k": "z", "v": 2}),
        }
        assert set(p.prepared[10].after) == {(TABLE, b"x"), (TABLE, b"y"), (TABLE, b"z")}
        for key in (b"x", b"y", b"z"):
            assert p.rows[(TABLE, key)].holder == 10
        await p.decide(10, True)
        assert await get(p, 10, b"x") == {"k": "x", "v": 2}
        assert await get(p, 10, b"y") == {"k": "y"}
        assert await get(p, 10, b"z") == {"k": "z", "v": 2}
        assert all(s.holder == 0 for s in p.rows.values())

    run(main)


def test_a_growing_transaction_that_fails_later_is_aborted_whole(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        assert (await p.prepare(sub(10, insert(b"x", {"k": "x"})))).outcome == YES
        vote = await p.prepare(sub(10, insert(b"y", {"k": "y"}), update(b"nope", {"v": 1})))
        assert vote.outcome == NOT_FOUND
        assert p.rows[(TABLE, b"x")].holder == 10  # still prepared from the first part
        assert p.rows[(TABLE, b"y")].holder == 0
        await p.decide(10, False)
        assert all(s.holder == 0 for s in p.rows.values())
        assert await get(p, 20, b"x") is None

    run(main)


# ----------------------------------------------------------------------------- reads


def test_snapshot_reads_see_the_version_at_their_timestamp(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        await commit(p, 20, update(b"x", {"v": 2}))
        await commit(p, 30, delete(b"x"))
        await commit(p, 40, insert(b"x", {"v": 4}))
        expected = {5: None, 10: 1, 15: 1, 20: 2, 29: 2, 30: None, 35: None, 40: 4, 99: 4}
        for ts, v in expected.items():
            row = await get(p, ts, b"x")
            assert (row and row["v"]) == v, ts
        rows = await p.read(pb.ReadRequest(ts=25, table=TABLE, keys=[b"x", b"missing", b"x"]))
        assert [(k, decode_row(r)) for k, r in rows] == [(b"x", {"v": 2}), (b"x", {"v": 2})]
        # the low watermark prunes versions nobody can ask for any more
        p.observe(25, 0)
        await commit(p, 50, update(b"x", {"v": 5}))
        assert [ts for ts, _ in p.rows[(TABLE, b"x")].versions] == [20, 30, 40, 50]
        assert (await get(p, 25, b"x"))["v"] == 2

    run(main)


def test_reads_wait_only_for_holders_at_or_below_their_timestamp(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(30, update(b"x", {"v": 3})))).outcome == YES
        # below the holder: answered at once from the committed version
        assert (await asyncio.wait_for(get(p, 29, b"x"), 0.5))["v"] == 1
        # at or above the holder: waits for its decision
        at = asyncio.ensure_future(get(p, 30, b"x"))
        above = asyncio.ensure_future(get(p, 35, b"x"))
        assert await pending(at) and await pending(above)
        await p.decide(30, True)
        assert (await asyncio.wait_for(at, 1))["v"] == 3
        assert (await asyncio.wait_for(above, 1))["v"] == 3
        # an aborted holder: the waiting read gets the old version
        assert (await p.prepare(sub(40, update(b"x", {"v": 4})))).outcome == YES
        waiting = asyncio.ensure_future(get(p, 45, b"x"))
        assert await pending(waiting)
        await p.decide(40, False)
        assert (await asyncio.wait_for(waiting, 1))["v"] == 3
        # a snapshot read never aborts a writer: an older writer may still come after it
        assert (await p.prepare(sub(41, update(b"x", {"v": 41})))).outcome == YES
        await p.decide(41, True)

    run(main)


def test_a_new_rows_index_entries_are_not_read_from_the_store(env: Env) -> None:
    """An insert under a sync view writes its row and the entry of the view's index: only
    the row is asked of the store (an entry of a row never stored cannot be there). Once
    the row was stored, its entries are read as any row is."""
    index = index_table(1, 8, TABLE)
    env.store.create_table(index)
    asked = reads_of(env.store)

    def entry(value: int, key: bytes) -> bytes:
        return value.to_bytes(8, "big") + key

    async def main() -> None:
        p = env.participant()
        await p.start()
        await commit(p, 10, insert(b"x", {"v": 7}), put(entry(7, b"x"), {}, table=index))
        assert asked == [(TABLE, [b"x"])]
        await p.checkpoint()
        await p.stop()

        q = env.participant()
        await q.start()
        asked.clear()
        erase = put(entry(7, b"x"), None, table=index)
        await commit(q, 20, delete(b"x"), erase)
        assert asked == [(TABLE, [b"x"]), (index, [entry(7, b"x")])]  # x was stored
        assert await outcome(q, 15, put(entry(7, b"x"), {}, table=index)) == TOO_LATE
        asked.clear()
        await commit(q, 30, insert(b"a", {"v": 7}), put(entry(7, b"a"), {}, table=index))
        assert asked == [(TABLE, [b"a"])]
        asked.clear()  # above every key the store holds: new, and its entry too
        await commit(q, 35, insert(b"y", {"v": 7}), put(entry(7, b"y"), {}, table=index))
        assert asked == []
        assert [k for k, _ in await scan(q, 40, index)] == [entry(7, b"a"), entry(7, b"y")]
        assert [k for k, _ in await scan(q, 15, index)] == [entry(7, b"x")]
        await q.stop()

    run(main)


@pytest.mark.parametrize("inline", [True, False], ids=["read inline", "read in a thread"])
def test_a_key_above_every_stored_key_is_new_without_a_store_read(env: Env, inline: bool) -> None:
    """The first read of a table learns the greatest key its store table holds; a key above
    it that is not in memory is new, read from nowhere (inserts of ascending ids read the
    store once). A key that leaves memory raises it: evicted once stored, a row is read
    again and its insert refused. A restart learns it anew from the store. (A store whose
    reads are slow reads in a thread: a key known new costs no thread either.)"""
    asked = reads_of(env.store)
    env.store.fast_point_reads = inline  # type: ignore[misc]

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"m", {"v": 1}))
        assert asked == [(TABLE, [b"m"])]  # the table's first read
        asked.clear()
        await commit(p, 20, insert(b"n", {"v": 1}), insert(b"p", {"v": 1}))
        assert asked == []  # the store held nothing
        await p.checkpoint()
        p.observe(100, 0)
        p.settings.cache_rows = 0
        p._maybe_evict()
        assert not p.rows
        await commit(p, 25, insert(b"a", {"v": 1}))  # below what left memory: read
        assert asked == [(TABLE, [b"a"])]
        asked.clear()
        assert await outcome(p, 30, insert(b"p", {"v": 2})) == ALREADY_EXISTS
        assert asked == [(TABLE, [b"p"])]
        asked.clear()
        await commit(p, 40, insert(b"q", {"v": 1}))
        assert asked == []
        await p.checkpoint()
        await p.stop()

        q = env.participant()
        await q.start()
        asked.clear()
        assert await outcome(q, 50, insert(b"q", {"v": 2})) == ALREADY_EXISTS
        assert asked == [(TABLE, [b"q"])]  # learning again: read
        asked.clear()
        await commit(q, 60, insert(b"r", {"v": 1}))
        assert asked == []
        assert await get(q, 70, b"p") == {"v": 1}
        await q.stop()

    run(main)


def test_the_greatest_stored_key_learned_counts_keys_that_left_memory_meanwhile() -> None:
    """A table's greatest stored key is read in a thread while the loop goes on: a key
    evicted meanwhile (stored after that read, maybe) still counts, so it is read again."""
    cache = RowCache()
    cache[(TABLE, b"k")] = RowState(versions=[(1, {"v": 1})])
    assert not cache.new(TABLE, b"z")  # nothing learned yet: read
    del cache[(TABLE, b"k")]  # evicted while the store's greatest key was being read
    cache.learned(TABLE, b"c")
    assert not cache.new(TABLE, b"k") and cache.new(TABLE, b"l")
    cache[(TABLE, b"x")] = RowState(versions=[(2, None)])
    cache.clear()  # every key that leaves raises it, however it leaves
    assert not cache.new(TABLE, b"x") and cache.new(TABLE, b"y")


def test_a_one_phase_commit_is_read_only_once_it_is_on_disk(env: Env) -> None:
    """A transaction whose one participant is in its coordinator's process is prepared
    without waiting for the disk and commits with one flush: its commit record is its only
    decision record. Read before that flush, a crash could take it back after another
    member's transaction built on it (a lookup its cache kept: "lookup cache mismatch" after
    a kill -9). So its rows stay held until the flush. Prepares flushed before the decision
    (several participants, the decision logged by the coordinator) are seen at once."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        disk = slow_disk(p)  # a flush ends once this is set
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})), durable=False)).outcome == YES
        deciding = asyncio.ensure_future(p.decide(20, True))  # one-phase: no flush before
        lookup = asyncio.ensure_future(get(p, 30, b"x", register=True))
        assert await pending(lookup), "a commit was read before it was on disk"
        disk.set()
        await asyncio.wait_for(deciding, 1)
        assert (await asyncio.wait_for(lookup, 1))["v"] == 2

        assert (await p.prepare(sub(40, update(b"y", {"v": 4})), durable=False)).outcome == YES
        await p.flush_prepared()  # several participants: flushed before the decision
        disk.clear()
        deciding = asyncio.ensure_future(p.decide(40, True))
        assert (await asyncio.wait_for(get(p, 50, b"y", register=True), 1))["v"] == 4
        disk.set()
        await asyncio.wait_for(deciding, 1)

    run(main)


def test_a_read_waits_for_every_holder_up_to_its_timestamp(env: Env) -> None:
    """The row passes from 20 to 30 (a waiter); a read at 35 must wait for both."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        waiter = asyncio.ensure_future(p.prepare(sub(30, update(b"x", {"v": 3}))))
        read = asyncio.ensure_future(get(p, 35, b"x"))
        assert await pending(read)
        await p.decide(20, True)
        assert (await asyncio.wait_for(waiter, 1)).outcome == YES
        assert await pending(read)
        await p.decide(30, True)
        assert (await asyncio.wait_for(read, 1))["v"] == 3

    run(main)


def test_scans_merge_store_and_memory_in_key_order(env: Env) -> None:
    async def main() -> None:
        # a, c, e, g only in the store (as a checkpoint left them)
        env.store.write(
            [(TABLE, k, encode_stored(5, {"k": k.decode()})) for k in (b"a", b"c", b"e", b"g")]
        )
        p = env.participant()
        await commit(p, 10, insert(b"b", {"k": "b"}), insert(b"d", {"k": "d"}))
        await commit(p, 20, delete(b"c"), update(b"e", {"x": 1}))
        assert (await p.prepare(sub(30, insert(b"f", {"k": "f"})))).outcome == YES

        def keys(rows: list[tuple[bytes, Any]]) -> list[bytes]:
            return [k for k, _ in rows]

        everything = await scan(p, 25)
        assert keys(everything) == [b"a", b"b", b"d", b"e", b"g"]
        assert dict(everything)[b"e"] == {"k": "e", "x": 1}
        assert dict(everything)[b"a"] == {"k": "a"}
        # an older snapshot still sees c and the old e, and not b/d
        assert keys(await scan(p, 15)) == [b"a", b"b", b"c", b"d", b"e", b"g"]
        assert keys(await scan(p, 9)) == [b"a", b"c", b"e", b"g"]
        assert dict(await scan(p, 15))[b"e"] == {"k": "e"}
        assert keys(await scan(p, 25, start=b"b", stop=b"e")) == [b"b", b"d"]
        assert keys(await scan(p, 25, start=b"c")) == [b"d", b"e", b"g"]
        assert keys(await scan(p, 25, stop=b"b")) == [b"a"]
        assert keys(await scan(p, 25, limit=2)) == [b"a", b"b"]
        assert keys(await scan(p, 25, start=b"b", limit=3)) == [b"b", b"d", b"e"]
        assert keys(await scan(p, 25, start=b"h")) == []
        # the scan waits for the holder of f (30 <= 35), then includes it
        waiting = asyncio.ensure_future(scan(p, 35, start=b"f"))
        assert await pending(waiting)
        await p.decide(30, True)
        assert keys(await asyncio.wait_for(waiting, 1)) == [b"f", b"g"]

    run(main)


def test_a_scan_older_than_a_stored_row_fails_as_a_point_read_does(env: Env) -> None:
    """After a restart only the stored version of a row is left: a scan at an older snapshot
    (one held across the restart) must fail as too old, not return the newer row or miss a
    row deleted since, as a point read of the row already does."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 100, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        await commit(p, 110, delete(b"y"))
        await p.checkpoint()
        crash(p)
        q = env.participant()
        await q.recover()
        assert await scan(q, 120) == [(b"x", {"v": 1})]
        for ts, start in ((105, b"y"), (95, b"x")):  # y deleted at 110; x written at 100
            with pytest.raises(errors.Unavailable, match="snapshot too old"):
                await scan(q, ts, start=start)
        with pytest.raises(errors.Unavailable, match="snapshot too old"):
            await get(q, 95, b"x")
        page, _ = await q.read_page(pb.ReadRequest(ts=120, table=TABLE, limit=1))
        assert [key for key, _ in page] == [b"x"]
        with pytest.raises(errors.Unavailable, match="snapshot too old"):
            await q.read_page(pb.ReadRequest(ts=95, table=TABLE, limit=1))

    run(main)


def test_scans_only_return_owned_rows(env: Env) -> None:
    keys = [b"k%d" % i for i in range(20)]
    mine = sorted(k for k in keys if partition_of(TABLE, k, 2) == 0)
    env.store.write([(TABLE, k, encode_stored(1, {"k": k.decode()})) for k in keys])

    async def main() -> None:
        p = env.participant(partition=0, partitions=2)
        assert [k for k, _ in await scan(p, 10)] == mine

    run(main)


def test_register_read_makes_an_older_writer_too_late(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        # a snapshot read (no register) does not
        assert (await get(p, 50, b"x"))["v"] == 1
        assert await outcome(p, 20, update(b"x", {"v": 2})) == YES
        # a read/write transaction's read does
        assert (await get(p, 50, b"y", register=True))["v"] == 1
        assert await outcome(p, 40, update(b"y", {"v": 2})) == TOO_LATE
        assert await outcome(p, 50, update(b"y", {"v": 2})) == YES  # the reader itself
        assert await outcome(p, 60, update(b"y", {"v": 2})) == YES
        # also on a row that does not exist (a phantom insert by an older writer)
        assert await get(p, 50, b"z", register=True) is None
        assert await outcome(p, 40, insert(b"z", {"v": 2})) == TOO_LATE

    run(main)


@pytest.mark.parametrize("steps", range(4))
def test_a_registered_read_woken_by_a_decision_waits_for_an_older_writer_taking_the_row(
    env: Env, steps: int
) -> None:
    """A read of transaction 40 waits for holder 20; 20's abort wakes it, and an older
    writer (30) takes the row before the read has run again (``steps`` loop steps later).
    The read must then wait for 30 and see its commit, or 30 must be too late: never may
    30 commit below a read at 40 that missed it (a sync view's delta read a stale row)."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"x", {"v": 9})))).outcome == YES
        reader = asyncio.ensure_future(get(p, 40, b"x", register=True))
        assert await pending(reader)
        await p.decide(20, False)
        for _ in range(steps):
            await asyncio.sleep(0)
        vote = await p.prepare(sub(30, update(b"x", {"v": 2})))
        if vote.outcome == YES:
            await p.decide(30, True)
            assert (await reader)["v"] == 2
        else:
            assert vote.outcome == TOO_LATE
            assert (await reader)["v"] == 1

    run(main)


def test_register_read_scan_covers_rows_only_in_the_store(env: Env) -> None:
    env.store.write([(TABLE, k, encode_stored(5, {"v": 1})) for k in (b"a", b"b")])

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"c", {"v": 1}))
        rows = await scan(p, 50, register_read=True)
        assert [k for k, _ in rows] == [b"a", b"b", b"c"]
        for key in (b"a", b"b", b"c"):
            assert await outcome(p, 40, update(key, {"v": 2})) == TOO_LATE, key
        assert await outcome(p, 60, update(b"a", {"v": 2})) == YES

    run(main)


def test_register_read_scan_makes_an_older_insert_into_its_range_too_late(env: Env) -> None:
    """A LEFT JOIN's flips count a key's matching rows by a registered scan of the index
    range of that key: an older writer adding or erasing an entry in the range afterwards
    (its first or last match) is too late, so two writers never flip from one stale count."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"a", {"v": 1}), put(b"c2", {}))
        assert await scan(p, 50, register_read=True, start=b"b", stop=b"d") == [(b"c2", {})]
        assert await outcome(p, 40, put(b"c", {})) == TOO_LATE  # a first match, unseen
        assert await outcome(p, 40, put(b"c2", None)) == TOO_LATE  # the last one erased
        assert await outcome(p, 40, put(b"d", {})) == YES  # outside the range
        assert await outcome(p, 60, put(b"c", {})) == YES  # younger than the read

    run(main)


# ----------------------------------------------------------------------------- durability


def test_committed_rows_survive_a_crash(env: Env) -> None:
    async def main() -> None:
        p = env.participant(fsync=True)
        await p.start()
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        await commit(p, 20, update(b"x", {"v": 2}), delete(b"y"), insert(b"z", {"v": 3}))
        assert (await p.prepare(sub(30, update(b"x", {"v": 3})))).outcome == YES
        await p.decide(30, False)
        await p.wal.flush()  # the abort record is durable (see the unlogged abort test)
        crash(p)
        assert stored(env.store, b"x") is None  # nothing checkpointed yet

        q = env.participant()
        await q.recover()
        assert await get(q, 40, b"x") == {"v": 2}
        assert await get(q, 40, b"y") is None
        assert await get(q, 40, b"z") == {"v": 3}
        assert [k for k, _ in await scan(q, 40)] == [b"x", b"z"]
        assert not q.prepared
        # the recovered versions still order later writers
        assert await outcome(q, 15, update(b"x", {"v": 9})) == TOO_LATE
        await commit(q, 50, update(b"x", {"v": 5}))
        await q.stop()

    run(main)


def test_an_undecided_transaction_is_recovered_and_resolved_by_the_coordinator(
    env: Env,
) -> None:
    asked: list[list[int]] = []

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        assert (
            await p.prepare(sub(20, update(b"x", {"v": 2}), insert(b"n", {"v": 0})))
        ).outcome == YES
        assert (await p.prepare(sub(30, update(b"y", {"v": 3})))).outcome == YES
        crash(p)

        answers = {20: True, 30: False}
        release = asyncio.Event()

        async def outcome_query(stamps: list[int]) -> list[bool | None]:
            asked.append(list(stamps))
            if not release.is_set():
                return [None] * len(stamps)  # coordinator: still undecided
            return [answers.get(ts) for ts in stamps]  # 40 is live: none of its business

        q = env.participant(outcome_query=outcome_query, outcome_query_after=0.05)
        await q.start()
        assert set(q.prepared) == {20, 30}
        assert q.rows[(TABLE, b"x")].holder == 20
        assert q.rows[(TABLE, b"n")].holder == 20
        assert q.rows[(TABLE, b"y")].holder == 30
        # held: an older writer is too late, a younger one waits, a read above waits
        assert await outcome(q, 15, update(b"x", {"v": 9})) == TOO_LATE
        younger = asyncio.ensure_future(q.prepare(sub(40, add(b"x", {"v": 10}))))
        read_y = asyncio.ensure_future(get(q, 35, b"y"))
        assert (await get(q, 19, b"x"))["v"] == 1
        await asyncio.sleep(0.2)
        assert asked and not younger.done() and not read_y.done()
        assert set(q.prepared) == {20, 30}  # "None" answers keep it prepared
        release.set()
        await eventually(lambda: not {20, 30} & set(q.prepared))
        assert (await asyncio.wait_for(read_y, 1))["v"] == 1  # 30 aborted
        assert (await asyncio.wait_for(younger, 1)).outcome == YES
        await q.decide(40, True)
        assert (await get(q, 50, b"x"))["v"] == 12  # 20 committed, then 40 added
        assert await get(q, 50, b"n") == {"v": 0}
        await q.stop()

        # the outcome was logged: a third incarnation needs no question
        r = env.participant()
        await r.recover()
        assert not r.prepared
        assert (await get(r, 50, b"x"))["v"] == 12

    run(main)
    assert [20, 30] in asked


def test_a_failing_outcome_query_is_retried(env: Env) -> None:
    calls = 0

    async def outcome_query(stamps: list[int]) -> list[bool | None]:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("coordinator down")
        return [True] * len(stamps)

    async def main() -> None:
        p = env.participant()
        assert (await p.prepare(sub(20, insert(b"x", {"v": 2})))).outcome == YES
        crash(p)
        q = env.participant(outcome_query=outcome_query, outcome_query_after=0.02)
        await q.start()
        await eventually(lambda: not q.prepared)
        assert calls >= 3
        assert await get(q, 30, b"x") == {"v": 2}
        await q.stop()

    run(main)


def test_an_unlogged_abort_is_recovered_as_undecided(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        await p.decide(20, False)  # the abort record is only queued
        crash(p)  # ... and lost

        async def presumed_abort(stamps: list[int]) -> list[bool | None]:
            return [False] * len(stamps)

        q = env.participant(outcome_query=presumed_abort, outcome_query_after=0.02)
        await q.start()
        await eventually(lambda: not q.prepared)
        assert (await get(q, 30, b"x"))["v"] == 1
        await commit(q, 30, update(b"x", {"v": 3}))
        await q.stop()

    run(main)


def test_checkpoint_writes_rows_to_the_store_and_drops_old_segments(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        lsn10 = await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        lsn20 = await commit(p, 20, update(b"x", {"v": 2}))
        assert 0 < lsn10 < lsn20
        assert p.dirty_rows() == 2
        assert p.wal.segments() == [1]
        assert await p.checkpoint() == 2
        # each stored row carries the LSN of the last change in it
        assert stored(env.store, b"x") == (20, {"v": 2}, lsn20)
        assert stored(env.store, b"y") == (10, {"v": 1}, lsn10)
        assert p.wal.segments() == [2] and p.checkpoints == 1
        assert p.dirty_rows() == 0
        # a clean checkpoint writes nothing
        assert await p.checkpoint() == 0
        # a delete leaves a tombstone with the delete's LSN, which scans skip
        lsn30 = await commit(p, 30, delete(b"y"))
        assert await p.checkpoint() == 1
        assert stored(env.store, b"y") == (30, None, lsn30)
        assert stored(env.store, b"x") == (20, {"v": 2}, lsn20)
        assert len(p.wal.segments()) == 1
        assert await scan(p, 40) == [(b"x", {"v": 2})]
        p.rows.clear()  # forget the cache: the scan reads the store alone
        assert await scan(p, 40) == [(b"x", {"v": 2})]
        assert await get(p, 40, b"y") is None
        assert p.rows[(TABLE, b"y")].lsn == lsn30  # the reloaded tombstone knows its LSN

    run(main)


def test_checkpoint_keeps_the_log_of_undecided_transactions(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        lsn10 = await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        assert (await p.prepare(sub(20, insert(b"y", {"v": 2})))).outcome == YES  # grows
        await p.checkpoint()
        await p.checkpoint()
        assert p.wal.segments() == [1, 2, 3]  # transaction 20 logged in segment 1
        # the store has only the committed version
        assert stored(env.store, b"x") == (10, {"v": 1}, lsn10)
        assert stored(env.store, b"y") is None
        crash(p)

        q = env.participant()
        await q.recover()
        assert set(q.prepared) == {20}
        assert set(q.prepared[20].after) == {(TABLE, b"x"), (TABLE, b"y")}
        assert q.rows[(TABLE, b"x")].holder == 20 and q.rows[(TABLE, b"y")].holder == 20
        await q.decide(20, True)
        assert await get(q, 30, b"x") == {"v": 2}
        assert await get(q, 30, b"y") == {"v": 2}
        await q.checkpoint()  # decided: its segments can go
        assert len(q.wal.segments()) == 1
        crash(q)

        r = env.participant()
        await r.recover()
        assert not r.prepared
        assert await get(r, 30, b"y") == {"v": 2}

    run(main)


def test_recovery_after_a_checkpoint_and_more_commits(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"a", {"v": 1}), insert(b"b", {"v": 1}), insert(b"c", {"v": 1}))
        await p.checkpoint()
        lsn20 = await commit(p, 20, update(b"a", {"v": 2}), delete(b"b"), insert(b"d", {"v": 2}))
        lsn30 = await commit(p, 30, update(b"a", {"v": 3}))
        crash(p)

        q = env.participant()
        await q.recover()
        assert await get(q, 40, b"a") == {"v": 3}
        assert await get(q, 40, b"b") is None
        assert await get(q, 40, b"c") == {"v": 1}
        assert await get(q, 40, b"d") == {"v": 2}
        assert [k for k, _ in await scan(q, 40)] == [b"a", b"c", b"d"]
        # the replayed rows are dirty: the next checkpoint writes them
        await q.checkpoint()
        # with the LSNs of the original commits, not new ones
        assert stored(env.store, b"a") == (30, {"v": 3}, lsn30)
        assert stored(env.store, b"b") == (20, None, lsn20)
        assert stored(env.store, b"d") == (20, {"v": 2}, lsn20)
        crash(q)

        r = env.participant()
        await r.recover()
        assert [k for k, _ in await scan(r, 40)] == [b"a", b"c", b"d"]
        assert await get(r, 40, b"a") == {"v": 3}

    run(main)


def test_a_stale_log_record_does_not_overwrite_a_newer_stored_row(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        await p.wal.flush()
        saved = env.tmp_path / "saved.wal"
        (first,) = sorted(env.log_dir.glob("*.wal"))
        shutil.copy(first, saved)
        await p.checkpoint()
        lsn20 = await commit(p, 20, update(b"x", {"v": 2}))
        await p.checkpoint()
        assert stored(env.store, b"x") == (20, {"v": 2}, lsn20)
        crash(p)
        # the old segment comes back (a crash before its removal was durable)
        shutil.copy(saved, first)

        q = env.participant()
        await q.recover()
        assert await get(q, 30, b"x") == {"v": 2}
        assert await outcome(q, 15, update(b"x", {"v": 9})) == TOO_LATE
        await q.checkpoint()
        assert stored(env.store, b"x") == (20, {"v": 2}, lsn20)

    run(main)


def test_a_torn_last_record_loses_only_the_unacknowledged_prepare(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        crash(p)
        (segment,) = env.log_dir.glob("*.wal")
        segment.write_bytes(segment.read_bytes()[:-3])

        q = env.participant()
        await q.recover()
        assert not q.prepared
        assert await get(q, 30, b"x") == {"v": 1}

    run(main)


# ----------------------------------------------------------------------------- eviction


def test_clean_rows_are_evicted_and_reloaded(env: Env) -> None:
    async def main() -> None:
        p = env.participant(cache_rows=2)
        keys = [b"k%d" % i for i in range(6)]
        lsn10 = await commit(p, 10, *(insert(k, {"v": i}) for i, k in enumerate(keys)))
        p.observe(10, 0)
        # a row held by an undecided transaction and a row newer than the watermark stay
        assert (await p.prepare(sub(20, update(b"k0", {"v": 100})))).outcome == YES
        await commit(p, 30, update(b"k1", {"v": 101}))
        await p.checkpoint()
        assert len(p.rows) == 2
        assert {(TABLE, b"k0"), (TABLE, b"k1")} <= set(p.rows)
        for i, key in enumerate(keys[2:], start=2):
            assert stored(env.store, key) == (10, {"v": i}, lsn10)
        # lazily reloaded
        assert await get(p, 40, b"k3") == {"v": 3}
        assert (TABLE, b"k3") in p.rows
        assert [k for k, _ in await scan(p, 15)] == keys
        await commit(p, 50, update(b"k4", {"v": 44}))
        assert await get(p, 50, b"k4") == {"v": 44}
        await p.decide(20, True)
        assert await get(p, 50, b"k0") == {"v": 100}

    run(main)


def test_dirty_rows_are_not_evicted(env: Env) -> None:
    async def main() -> None:
        p = env.participant(cache_rows=1)
        await commit(p, 10, insert(b"a", {"v": 1}), insert(b"b", {"v": 1}))
        p.observe(100, 0)
        p._maybe_evict()  # the rows are dirty: nothing goes
        assert len(p.rows) == 2
        await p.checkpoint()
        assert len(p.rows) == 1

    run(main)


def test_an_evicted_rows_timestamps_still_order_writers(env: Env) -> None:
    async def main() -> None:
        p = env.participant(cache_rows=1)
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        assert (await get(p, 50, b"x", register=True))["v"] == 1
        p.observe(60, 0)
        await p.checkpoint()
        await commit(p, 70, insert(b"z", {"v": 1}))  # touches a third row
        await p.checkpoint()
        assert (TABLE, b"x") not in p.rows
        assert p.evicted_floor >= 50
        # reloaded x only has its stored version (ts 10); its reader at 50 is remembered
        assert await outcome(p, 40, update(b"x", {"v": 2})) == TOO_LATE
        assert await outcome(p, 80, update(b"x", {"v": 2})) == YES

    run(main)


def test_eviction_while_a_prepare_waits_does_not_lose_its_rows(env: Env) -> None:
    """A prepare loads all its rows, then waits for one of them; a checkpoint meanwhile may
    evict the others (clean, below the watermark). The prepare must still find them."""

    async def main() -> None:
        p = env.participant(cache_rows=1)
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        p.observe(10, 0)
        await p.checkpoint()
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        waiting = asyncio.ensure_future(
            p.prepare(sub(30, update(b"x", {"v": 3}), update(b"y", {"v": 3})))
        )
        assert await pending(waiting)
        for key in (b"a", b"b", b"c"):
            await p.read(pb.ReadRequest(ts=15, table=TABLE, keys=[key]))
        await p.checkpoint()
        await p.decide(20, True)
        vote = await asyncio.wait_for(waiting, 1)
        assert vote.outcome == YES
        await p.decide(30, True)
        assert await get(p, 30, b"y") == {"v": 3}
        assert await get(p, 30, b"x") == {"v": 3}

    run(main)


# ----------------------------------------------------------------------------- observe / restart


def test_after_a_restart_the_first_issued_timestamp_fences_older_transactions(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        # a read/write transaction read x at 90; this is forgotten by the crash
        assert (await get(p, 90, b"x", register=True))["v"] == 1
        crash(p)

        q = env.participant()
        await q.recover()
        assert (TABLE, b"x") in q.rows  # loaded by the recovery, before the first contact
        q.observe(5, 100)
        # everything issued before the first contact is too late, on rows in memory and not
        assert await outcome(q, 80, update(b"x", {"v": 2})) == TOO_LATE
        assert await outcome(q, 99, insert(b"fresh", {"v": 2})) == TOO_LATE
        assert await outcome(q, 101, update(b"x", {"v": 2})) == YES
        assert await outcome(q, 102, insert(b"fresh", {"v": 2})) == YES
        # only the first contact counts
        q.observe(5, 500)
        assert await outcome(q, 103, insert(b"other", {"v": 2})) == YES
        assert q.low_watermark == 5
        q.observe(3, 0)
        assert q.low_watermark == 5

    run(main)


def test_drop_table(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        await p.drop_table(TABLE)
        vote = await p.prepare(sub(20, insert(b"y", {"v": 1})))
        assert vote.outcome == INVALID
        assert await p.checkpoint() == 0
        assert stored(env.store, b"x") is None
        crash(p)
        q = env.participant()
        await q.recover()
        assert TABLE in q.dropped
        assert (await q.prepare(sub(30, insert(b"y", {"v": 1})))).outcome == INVALID

    run(main)


def test_a_drop_waits_for_the_checkpoint_writing_the_table(env: Env) -> None:
    """The caller of ``drop_table`` drops the store's table next: a checkpoint still writing
    the table's rows then would fail on a missing table (and log it as a failure)."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        writing, release = threading.Event(), threading.Event()
        store_write = env.store.write

        def slow_write(mutations: Any) -> None:
            writing.set()
            release.wait(5)
            store_write(mutations)

        env.store.write = slow_write  # type: ignore[method-assign]
        checkpoint = asyncio.ensure_future(p.checkpoint())
        await asyncio.to_thread(writing.wait, 5)
        drop = asyncio.ensure_future(p.drop_table(TABLE))
        assert await pending(drop)  # the checkpoint took the row before the drop
        release.set()
        await drop
        env.store.drop_table(TABLE)  # what the coordinator does next
        assert await checkpoint == 1
        env.store.write = store_write  # type: ignore[method-assign]
        assert await p.checkpoint() == 0

    run(main)


@pytest.mark.parametrize("cancels", [1, 3])
def test_a_checkpoint_cancelled_mid_write_is_not_overtaken_by_the_next(
    env: Env, cancels: int
) -> None:
    """Stopping a participant cancels its checkpoint loop, perhaps while a checkpoint's store
    write runs in its thread, which a cancel cannot stop. The stop's own checkpoint then must
    not write before that thread has: landing after it, the older write put back rows as they
    were (deleted rows came back after a clean stop and a restart on a slow HBase)."""

    async def main() -> None:
        p = env.participant()
        await p.start()
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        writing, release, written = threading.Event(), threading.Event(), threading.Event()
        store_write = env.store.write
        writes = 0

        def first_write_slow(mutations: Any) -> None:
            nonlocal writes
            writes += 1
            if writes > 1:
                store_write(mutations)
                return
            writing.set()
            release.wait(5)
            store_write(mutations)
            written.set()

        env.store.write = first_write_slow  # type: ignore[method-assign]
        checkpoint = asyncio.ensure_future(p.checkpoint())
        await asyncio.to_thread(writing.wait, 5)
        for _ in range(cancels):  # aggview.loops.stop cancels again while a task runs on
            checkpoint.cancel()
            await asyncio.sleep(0.01)
        await commit(p, 20, delete(b"x"), update(b"y", {"v": 2}))
        asyncio.get_running_loop().call_later(0.2, release.set)
        await p.stop()
        with pytest.raises(asyncio.CancelledError):
            await checkpoint
        await asyncio.to_thread(written.wait, 5)  # whatever the order, both writes are done
        env.store.write = store_write  # type: ignore[method-assign]
        assert stored(env.store, b"x")[1] is None  # type: ignore[index]
        q = env.participant()
        await q.start()
        assert await get(q, 30, b"x") is None
        assert await get(q, 30, b"y") == {"v": 2}
        await q.stop()

    run(main)


def test_a_cancelled_prepare_leaves_nothing_held(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"y", {"v": 2})))).outcome == YES
        waiting = asyncio.ensure_future(
            p.prepare(sub(30, update(b"x", {"v": 3}), update(b"y", {"v": 3})))
        )
        assert await pending(waiting)
        assert p.rows[(TABLE, b"x")].holder == 30
        waiting.cancel()  # e.g. the coordinator's call was cancelled
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert p.rows[(TABLE, b"x")].holder == 0
        assert all(s.pins == 0 for s in p.rows.values())
        await p.decide(20, True)
        assert p.rows[(TABLE, b"y")].holder == 0
        await commit(p, 40, update(b"x", {"v": 4}), update(b"y", {"v": 4}))
        assert not any(s.busy() for s in p.rows.values())

    run(main)


def test_a_one_phase_commit_that_fails_to_apply_tells_its_waiter(env: Env) -> None:
    """A one-phase commit is applied in a callback once its record is durable: an error
    there reaches whoever waits for the decision instead of leaving it waiting."""

    async def main() -> None:
        p = env.participant()
        assert (await p.prepare(sub(10, insert(b"x", {"v": 1})), durable=False)).outcome == YES

        def broken(*args: Any) -> None:
            raise RuntimeError("apply failed")

        p._apply_commit = broken  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="apply failed"):
            await asyncio.wait_for(p.decide(10, True), 5)

    run(main)


# ----------------------------------------------------------------------------- sequence numbers


def test_a_stale_log_record_does_not_resurrect_a_deleted_row(env: Env) -> None:
    """The store keeps a deleted row as a tombstone with the delete's LSN: an old segment that
    comes back (its removal was not durable) cannot insert the row again."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        await p.wal.flush()
        saved = env.tmp_path / "saved.wal"
        (first,) = sorted(env.log_dir.glob("*.wal"))
        shutil.copy(first, saved)
        await p.checkpoint()
        lsn20 = await commit(p, 20, delete(b"x"))
        await p.checkpoint()
        assert stored(env.store, b"x") == (20, None, lsn20)
        crash(p)
        shutil.copy(saved, first)

        q = env.participant()
        await q.recover()
        assert await get(q, 30, b"x") is None
        assert await scan(q, 30) == []

    run(main)


def test_lsns_keep_growing_across_restarts_that_checkpointed_the_whole_log(env: Env) -> None:
    """A clean stop leaves only the checkpoint's mark in the log; the next incarnation must
    number its changes above every stored row's LSN, or its replay would skip them."""

    async def main() -> None:
        p = env.participant()
        await p.start()
        await commit(p, 10, merge(b"g", {"_count": 1, "s": 1}), insert(b"x", {"v": 1}))
        await p.stop()
        highest = 0
        for i in range(3):
            q = env.participant()
            await q.start()
            (ts_stored, _, lsn) = stored(env.store, b"g")
            assert lsn > highest
            highest = lsn
            assert q.wal.lsn >= lsn
            ts = 20 + 10 * i
            assert await commit(q, ts, merge(b"g", {"_count": 1, "s": 10}), add(b"x", {"v": 1})) > (
                lsn
            )
            if i == 1:
                crash(q)  # the changes since the stop are only in the log
                r = env.participant()
                await r.recover()
                assert await get(r, ts, b"g") == {"_count": 2 + i, "s": 1 + 10 * (i + 1)}
                assert await get(r, ts, b"x") == {"v": 2 + i}
                await r.stop()
            else:
                await q.stop()
        r = env.participant()
        await r.recover()
        assert await get(r, 60, b"g") == {"_count": 4, "s": 31}
        assert await get(r, 60, b"x") == {"v": 4}

    run(main)


# ----------------------------------------------------------------------------- merge


G = b"g"


def view(count: int, s: int, **more: Any) -> dict[str, Any]:
    return {"_count": count, "s": s, **more}


@pytest.mark.parametrize("order", [(10, 20, 30), (30, 20, 10), (30, 10, 20), (20, 30, 10)])
def test_merges_commit_in_any_timestamp_order_with_exact_snapshots(
    env: Env, order: tuple[int, ...]
) -> None:
    deltas = {10: view(1, 1), 20: view(1, 10), 30: view(1, 100)}

    async def main() -> None:
        p = env.participant()
        await commit(p, 5, merge(G, view(1, 1000)))
        for ts, delta in deltas.items():  # all pending at once: none waits, none is too late
            vote = await asyncio.wait_for(p.prepare(sub(ts, merge(G, delta))), 1)
            assert vote.outcome == YES
        state = p.rows[(TABLE, G)]
        assert state.holder == 0 and set(state.merges) == {10, 20, 30}
        done: list[int] = []
        for ts in order:
            await p.decide(ts, True)
            done.append(ts)
            pending_ts = min(set(deltas) - set(done), default=99)
            for read_ts in (5, 9, 10, 15, 20, 25, 30, 35):
                if read_ts >= pending_ts:
                    continue  # would wait (tested elsewhere)
                want = [d for t, d in deltas.items() if t <= read_ts] + [view(1, 1000)]
                expected = view(len(want), sum(d["s"] for d in want))
                assert await get(p, read_ts, G) == expected, (order, done, read_ts)
        # every version is there, the ones committed late inserted between the others
        assert [ts for ts, _ in state.versions] == [0, 5, 10, 20, 30]
        assert [row["s"] for _, row in state.versions[1:]] == [1000, 1001, 1011, 1111]
        assert await scan(p, 40) == [(G, view(4, 1111))]
        assert not state.busy()

    run(main)


def test_a_guarded_merge_is_too_late_for_a_younger_read_while_it_waited_for_a_row(
    env: Env,
) -> None:
    """A view-over-view delta (guarded) goes with row writes (index entries) in one sub: it
    waits for an older holder of a row, and a younger transaction reads the view row
    meanwhile (nothing pending there yet). The guard is checked once the rows are taken, so
    the delta is too late instead of committing below that read."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 5, merge(G, view(1, 1000)), insert(b"i", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"i", {"v": 2})))).outcome == YES
        guarded = merge(G, view(1, 1))
        guarded.guarded = True
        writer = asyncio.ensure_future(p.prepare(sub(30, update(b"i", {"v": 3}), guarded)))
        assert await pending(writer)
        assert await get(p, 40, G, register=True) == view(1, 1000)
        await p.decide(20, True)
        vote = await writer
        assert vote.outcome == TOO_LATE, vote
        assert p.rows[(TABLE, b"i")].holder == 0 and not p.rows[(TABLE, G)].merges

    run(main)


def test_a_merge_never_waits_for_or_aborts_another_merge(env: Env) -> None:
    async def main() -> None:
        p = env.participant(lock_wait_timeout=0.5)
        await commit(p, 50, merge(G, view(1, 1)))
        state = p.rows[(TABLE, G)]
        # older than a committed merge, beside pending ones: all yes (nothing is decided
        # meanwhile, so a wait could only end by the lock wait timeout: too late)
        votes = [
            await p.prepare(sub(20, merge(G, view(1, 2)))),
            await p.prepare(sub(60, merge(G, view(1, 4)))),
            # two deltas to one row in one sub, then a growing transaction adds a third
            await p.prepare(sub(40, merge(G, view(1, 8)), merge(G, view(-1, 16)))),
            await p.prepare(sub(40, merge(G, view(2, 32, m={"a": 1})))),
            await p.prepare(sub(30, merge(G, view(1, 64)))),
        ]
        assert [v.outcome for v in votes] == [YES] * 5
        assert state.holder == 0 and not state.lock_waiters
        assert state.merges == {
            20: view(1, 2),
            30: view(1, 64),
            40: view(2, 56, m={"a": 1}),
            60: view(1, 4),
        }
        assert p.prepared[40].merges == {(TABLE, G): view(2, 56, m={"a": 1})}
        await p.decide(40, True)
        await p.decide(30, False)
        await p.decide(60, True)
        assert set(state.merges) == {20}
        await p.decide(20, True)
        assert await get(p, 70, G) == view(5, 63, m={"a": 1})
        assert await get(p, 45, G) == view(3, 58, m={"a": 1})  # 20 and 40: no 50 yet
        assert await get(p, 55, G) == view(4, 59, m={"a": 1})
        assert not state.busy()

    run(main)


def test_a_group_whose_count_reaches_zero_is_deleted_and_can_come_back(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(2, 5, m={"a": 2})))
        lsn20 = await commit(p, 20, merge(G, view(-2, -5, m={"a": -2})))
        assert await get(p, 15, G) == view(2, 5, m={"a": 2})
        assert await get(p, 20, G) is None
        assert await scan(p, 20) == []
        await p.checkpoint()
        assert stored(env.store, G) == (20, None, lsn20)  # a tombstone
        # a later merge re-creates it from its own delta alone
        await commit(p, 30, merge(G, view(1, 7)))
        assert await get(p, 30, G) == view(1, 7)
        # deltas that cancel out within one transaction create nothing
        await commit(p, 40, merge(b"h", view(1, 3)), merge(b"h", view(-1, -3)))
        assert await get(p, 40, b"h") is None
        crash(p)
        q = env.participant()
        await q.recover()
        assert await get(q, 40, G) == view(1, 7)
        assert await get(q, 40, b"h") is None
        await commit(q, 50, merge(G, view(-1, -7)))
        await commit(q, 60, merge(G, view(3, 1)))
        assert await get(q, 55, G) is None
        assert await get(q, 60, G) == view(3, 1)

    run(main)


def test_a_delta_committed_before_an_older_one_it_depends_on(env: Env) -> None:
    """20 inserts a second row into a group, 30 deletes it again; 30's commit reaches this LTM
    first (e.g. 20 is only resolved by an outcome query). The partial sum at 30 has _count 0
    but must not lose its other fields: 20 completes it."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1, m={"a": 1})))
        assert (await p.prepare(sub(20, merge(G, view(1, 2, m={"b": 1}))))).outcome == YES
        assert (await p.prepare(sub(30, merge(G, view(-1, -2, m={"b": -1}))))).outcome == YES
        await p.decide(30, True)
        waiting = asyncio.ensure_future(get(p, 30, G))
        assert await pending(waiting)  # the partial sum is never read
        await p.checkpoint()  # ... and may be stored meanwhile
        assert stored(env.store, G)[1] == view(0, -1, m={"a": 1, "b": -1})
        # another delta (an update within the group) lands on it and is replayed on it
        await commit(p, 25, merge(G, view(0, 5)))
        crash(p)

        q = env.participant()
        await q.recover()
        assert set(q.rows[(TABLE, G)].merges) == {20}
        await q.decide(20, True)
        assert await get(q, 30, G) == view(1, 6, m={"a": 1})
        await q.checkpoint()
        assert stored(env.store, G)[:2] == (30, view(1, 6, m={"a": 1}))

        # the same in memory, and with the whole group deleted at 50
        await commit(q, 35, merge(b"h", view(1, 5)))
        assert (await q.prepare(sub(40, merge(b"h", view(1, 7))))).outcome == YES
        assert (await q.prepare(sub(50, merge(b"h", view(-2, -12))))).outcome == YES
        await q.decide(50, True)
        await q.decide(40, True)
        assert await get(q, 45, b"h") == view(2, 12)
        assert await get(q, 50, b"h") is None
        assert q.rows[(TABLE, b"h")].versions[-1] == (50, None)
        await commit(q, 60, merge(b"h", view(1, 1)))
        assert await get(q, 60, b"h") == view(1, 1)

        # both commits only in the log: the replay meets the partial sum again
        assert (await q.prepare(sub(70, merge(b"i", view(1, 3))))).outcome == YES
        assert (await q.prepare(sub(80, merge(b"i", view(1, 4, m={"x": 1}))))).outcome == YES
        assert (await q.prepare(sub(90, merge(b"i", view(-1, -4, m={"x": -1}))))).outcome == YES
        await q.decide(90, True)
        await q.decide(70, True)  # the sum is now partial with _count 0: 80 is pending
        await q.decide(80, True)
        assert await get(q, 90, b"i") == view(1, 3, m={})
        crash(q)
        r = env.participant()
        await r.recover()
        assert await get(r, 90, b"i") == view(1, 3, m={})
        await commit(r, 100, merge(b"i", view(2, 2)))
        assert await get(r, 100, b"i") == view(3, 5, m={})
        crash(r)
        r = env.participant()
        await r.recover()
        assert await get(r, 100, b"i") == view(3, 5, m={})
        assert await get(r, 100, b"h") == view(1, 1)
        assert await get(r, 100, G) == view(1, 6, m={"a": 1})

    run(main)


def test_an_aborted_older_delta_settles_a_partial_sum(env: Env) -> None:
    """If the older delta aborts instead, a zero count with leftovers (float rounding) is a
    deleted group: in memory and after a restart that found the partial sum stored."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1, f=0.1)))
        for ts in (20, 21):
            assert (await p.prepare(sub(ts, merge(G, view(1, 1))))).outcome == YES
        assert (await p.prepare(sub(30, merge(G, view(-1, -1, f=-0.3))))).outcome == YES
        await p.decide(30, True)
        await p.checkpoint()  # stores the partial sum: 20 and 21 are pending
        assert stored(env.store, G)[1]["_count"] == 0
        await p.decide(20, False)
        assert p.rows[(TABLE, G)].versions[-1][1] is not None  # 21 still pending
        await p.decide(21, False)
        assert await get(p, 30, G) is None
        await p.wal.flush()
        crash(p)  # before a checkpoint wrote the settled row

        q = env.participant()
        await q.recover()
        assert await get(q, 30, G) is None
        assert await scan(q, 30) == []
        await q.checkpoint()
        assert stored(env.store, G)[1] is None
        assert await scan(q, 30) == []

    run(main)


def test_multiset_fields_add_and_drop_zero_entries(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, {"_count": 2, "n": 3, "f": 0.5, "m": {"a": 1, "b": 1}}))
        await commit(p, 20, merge(G, {"_count": 1, "n": -1, "f": 0.25, "m": {"a": -1, "c": 2}}))
        assert await get(p, 20, G) == {"_count": 3, "n": 2, "f": 0.75, "m": {"b": 1, "c": 2}}
        await commit(p, 30, merge(G, {"_count": -1, "n": 0, "m": {"b": -1, "c": -2}}))
        assert await get(p, 30, G) == {"_count": 2, "n": 2, "f": 0.75, "m": {}}
        # a field the row does not have yet starts from zero / an empty multiset
        await commit(p, 40, merge(G, {"_count": 0, "z": 4, "w": {"x": 1}}))
        # two deltas of one transaction combine entry by entry before they apply
        await commit(p, 50, merge(G, {"_count": 1, "m": {"x": 1}}), merge(G, {"m": {"x": -1}}))
        want = {"_count": 3, "n": 2, "f": 0.75, "m": {}, "z": 4, "w": {"x": 1}}
        assert await get(p, 50, G) == want
        assert await get(p, 40, G) == {**want, "_count": 2}
        crash(p)
        q = env.participant()
        await q.recover()
        assert await get(q, 50, G) == want

    run(main)


def test_snapshot_reads_wait_for_pending_merges_at_or_below_their_timestamp(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1)), insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, merge(G, view(1, 10))))).outcome == YES
        # below the pending merge: at once; other rows: at once
        assert await asyncio.wait_for(get(p, 19, G), 0.5) == view(1, 1)
        assert await asyncio.wait_for(get(p, 25, b"x"), 0.5) == {"v": 1}
        at = asyncio.ensure_future(get(p, 20, G))
        above = asyncio.ensure_future(get(p, 25, G))
        scanning = asyncio.ensure_future(scan(p, 25))
        for task in (at, above, scanning):
            assert await pending(task)
        await p.decide(20, True)
        assert await asyncio.wait_for(at, 1) == view(2, 11)
        assert await asyncio.wait_for(above, 1) == view(2, 11)
        assert await asyncio.wait_for(scanning, 1) == [(G, view(2, 11)), (b"x", {"v": 1})]

        # an aborted merge: the waiting read gets the value without it
        assert (await p.prepare(sub(30, merge(G, view(1, 100))))).outcome == YES
        waiting = asyncio.ensure_future(get(p, 35, G))
        assert await pending(waiting)
        await p.decide(30, False)
        assert await asyncio.wait_for(waiting, 1) == view(2, 11)
        assert not p.rows[(TABLE, G)].busy()

    run(main)


def test_an_abort_drops_the_pending_merge(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        assert (await p.prepare(sub(10, merge(G, view(1, 1)), insert(b"x", {"v": 1})))).outcome == (
            YES
        )
        assert (await p.prepare(sub(20, merge(G, view(5, 5))))).outcome == YES
        await p.decide(10, False)
        state = p.rows[(TABLE, G)]
        assert set(state.merges) == {20}
        assert await asyncio.wait_for(get(p, 15, G), 0.5) is None
        await p.decide(20, True)
        assert await get(p, 20, G) == view(5, 5)
        assert await get(p, 20, b"x") is None
        assert not state.merges and not state.busy()
        await p.wal.flush()  # the abort record is durable
        crash(p)
        q = env.participant()
        await q.recover()
        assert not q.prepared and not q.rows[(TABLE, G)].merges
        assert await get(q, 20, G) == view(5, 5)

    run(main)


def test_merges_before_and_after_checkpoints_recover_exactly(env: Env) -> None:
    """Kill (no stop) after merges on both sides of checkpoints, recover, kill again without a
    checkpoint, recover: every delta counts once."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1)))
        await commit(p, 20, merge(G, view(1, 2)), merge(b"h", view(1, 2)))
        await p.wal.flush()
        saved = env.tmp_path / "saved.wal"
        (first,) = sorted(env.log_dir.glob("*.wal"))
        shutil.copy(first, saved)
        await p.checkpoint()
        # after the checkpoint, two commits in reverse timestamp order
        for ts in (40, 30):
            assert (await p.prepare(sub(ts, merge(G, view(1, ts))))).outcome == YES
        await p.decide(40, True)
        await p.decide(30, True)
        await p.checkpoint()
        await commit(p, 50, merge(G, view(-1, -1)), merge(b"h", view(1, 50)))
        crash(p)
        # the segment of the first commits comes back too (its removal was not durable)
        shutil.copy(saved, first)

        want_g, want_h = view(3, 1 + 2 + 30 + 40 - 1), view(2, 52)
        for _ in range(3):  # replaying again must not apply anything twice
            q = env.participant()
            await q.recover()
            assert await get(q, 60, G) == want_g
            assert await get(q, 60, b"h") == want_h
            crash(q)
        q = env.participant()
        await q.recover()
        await q.checkpoint()
        crash(q)
        r = env.participant()
        await r.recover()
        assert await get(r, 60, G) == want_g
        assert await get(r, 60, b"h") == want_h
        await commit(r, 70, merge(G, view(1, 0)))
        crash(r)
        s = env.participant()
        await s.recover()
        assert await get(s, 70, G) == view(4, 72)

    run(main)


def test_a_fresh_log_numbers_its_records_above_what_the_store_holds(env: Env) -> None:
    """A partition started with a log of another layout (a log that starts afresh) numbers
    its records above the LSNs its checkpoints stored: a change logged after that and lost
    from memory by a kill is replayed, not skipped as already stored."""

    async def main() -> None:
        p = env.participant()
        await p.start()
        for ts in range(10, 60, 10):
            await commit(p, ts, put(b"x", {"k": "x", "v": ts}))
        await p.checkpoint()
        await p.stop()
        assert stored(env.store, b"x")[2] > 5
        env.log_dir = env.tmp_path / "another layout"
        q = env.participant()
        await q.start()
        await commit(q, 70, put(b"x", {"k": "x", "v": 70}))
        crash(q)
        r = env.participant()
        await r.recover()
        assert await get(r, 80, b"x") == {"k": "x", "v": 70}

    run(main)


@pytest.mark.parametrize("placement", ["new segment", "old segment"])
@pytest.mark.parametrize("after_switch", ["checkpoint completes", "store write lost", "log back"])
def test_a_commit_queued_before_the_checkpoints_switch_counts_once(
    env: Env, monkeypatch: pytest.MonkeyPatch, after_switch: str, placement: str
) -> None:
    """The commit record of 20 is queued before the checkpoint switches segments; its
    PREPARED record is in the old one. The log's thread writes the commit into the new
    segment (it was busy with an earlier group at the switch) or into the old one (it took
    the record first). Whatever of the checkpoint survives the kill, the delta counts once;
    "log back" is an old segment whose removal did not last, as it was when removed."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1)))
        await p.checkpoint()
        assert (await p.prepare(sub(20, merge(G, view(1, 10))))).outcome == YES
        await p.wal.flush()
        (old,) = env.log_dir.glob("*.wal")
        saved = env.tmp_path / "saved.wal"
        if after_switch == "store write lost":

            def lost(mutations: Any) -> None:
                raise OSError("killed before the store write")

            monkeypatch.setattr(env.store, "write", lost)
        if placement == "new segment":
            shutil.copy(old, saved)  # the commit will not be in it
            busy = threading.Event()  # an earlier group's write holds the log's thread
            member_wal(p)._on_thread(busy.wait)
            asyncio.get_running_loop().call_later(0.05, busy.set)
            deciding = asyncio.ensure_future(p.decide(20, True))
            checkpointing = asyncio.ensure_future(p.checkpoint())
            results = await asyncio.gather(deciding, checkpointing, return_exceptions=True)
        else:
            results = [await p.decide(20, True)]
            shutil.copy(old, saved)  # with the commit, as a removal that did not last leaves it
            results += await asyncio.gather(p.checkpoint(), return_exceptions=True)
        monkeypatch.undo()
        assert results[0] is None
        (new,) = [f for f in env.log_dir.glob("*.wal") if f.name > old.name]
        kinds = [(r["kind"], r["ts"]) for r in segment_records(new)]
        if placement == "new segment":
            assert kinds[:2] == [("commit", 20), ("mark", 0)]
        else:
            assert kinds[:1] == [("mark", 0)]
            assert ("commit", 20) in [(r["kind"], r["ts"]) for r in segment_records(saved)]
        commit_lsn = next(r["lsn"] for r in segment_records(new) if r["kind"] == "mark") - 1
        if after_switch == "store write lost":
            assert isinstance(results[1], OSError)
            assert old.exists() and stored(env.store, G)[1] == view(1, 1)
        else:
            assert results[1] == 1
            assert not old.exists()
            assert stored(env.store, G) == (20, view(2, 11), commit_lsn)
        crash(p)
        if after_switch == "log back":
            shutil.copy(saved, old)

        q = env.participant()
        await q.recover()
        assert await get(q, 20, G) == view(2, 11)
        await q.checkpoint()
        crash(q)
        r = env.participant()
        await r.recover()
        assert await get(r, 20, G) == view(2, 11)

    run(main)


def test_undecided_merges_are_recovered_pending_and_resolved_by_outcome_query(
    env: Env,
) -> None:
    answers = {20: True, 30: False, 40: True}
    release = asyncio.Event()

    async def outcome_query(stamps: list[int]) -> list[bool | None]:
        if not release.is_set():
            return [None] * len(stamps)
        return [answers.get(ts) for ts in stamps]

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1)))
        assert (
            await p.prepare(sub(20, merge(G, view(1, 10)), merge(b"h", view(1, 1))))
        ).outcome == (YES)
        assert (await p.prepare(sub(30, merge(G, view(1, 100))))).outcome == YES
        await p.checkpoint()  # 20 and 30 are carried into the new segment
        assert (await p.prepare(sub(40, merge(G, view(1, 1000))))).outcome == YES
        crash(p)

        q = env.participant(outcome_query=outcome_query, outcome_query_after=0.05)
        await q.start()
        assert set(q.prepared) == {20, 30, 40}
        state = q.rows[(TABLE, G)]
        assert state.merges == {20: view(1, 10), 30: view(1, 100), 40: view(1, 1000)}
        assert q.rows[(TABLE, b"h")].merges == {20: view(1, 1)}
        assert state.holder == 0
        assert await get(q, 15, G) == view(1, 1)
        waiting = asyncio.ensure_future(get(q, 45, G))
        # another merge is not held up by the recovered ones
        await asyncio.wait_for(commit(q, 50, merge(G, view(1, 10000))), 1)
        await asyncio.sleep(0.15)
        assert not waiting.done() and set(q.prepared) == {20, 30, 40}
        release.set()
        await eventually(lambda: not q.prepared)
        assert await asyncio.wait_for(waiting, 1) == view(3, 1011)
        assert await get(q, 50, G) == view(4, 11011)
        assert await get(q, 50, b"h") == view(1, 1)
        await q.stop()

        r = env.participant()
        await r.recover()
        assert not r.prepared
        assert await get(r, 50, G) == view(4, 11011)

    run(main)


# ----------------------------------------------------------------------------- change capture

C1, C2 = "c1_t1", "c2_t1"


def change_key(key: bytes, ts: int) -> bytes:
    return key + ts.to_bytes(8, "big")


def test_change_rows_are_written_with_the_change_and_only_on_commit(env: Env) -> None:
    env.store.create_table(C1)
    env.store.create_table(C2)

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        vote = await p.prepare(sub(20, update(b"x", {"v": 2}, changes=[C1, C2]), want_images=True))
        assert vote.outcome == YES
        assert [(i.table, i.key) for i in vote.images] == [(TABLE, b"x")]  # no image of it
        # held by the writer: a scan below its timestamp sees nothing, at it waits
        assert p.rows[(C1, change_key(b"x", 20))].holder == 20
        assert await scan(p, 19, table=C1) == []
        waiting = asyncio.ensure_future(scan(p, 20, table=C1))
        assert await pending(waiting)
        await p.decide(20, True)
        change20 = (change_key(b"x", 20), {"b": {"v": 1}, "a": {"v": 2}})
        assert await asyncio.wait_for(waiting, 1) == [change20]
        assert await scan(p, 20, table=C2) == [change20]
        assert await scan(p, 19, table=C1) == []
        assert await get(p, 25, change_key(b"x", 20), table=C1) == change20[1]

        # aborted: no change row; refused: none either, and nothing held
        assert await outcome(p, 30, update(b"x", {"v": 3}, changes=[C1])) == YES
        assert await outcome(p, 31, update(b"nope", {"v": 3}, changes=[C1])) == NOT_FOUND
        assert await scan(p, 35, table=C1) == [change20]
        assert all(s.holder == 0 for s in p.rows.values())

        # one change row per row and transaction, whatever the number of ops; inserts and
        # deletes have no before / after image; rows without changes_tables have none
        await commit(
            p,
            40,
            insert(b"y", {"v": 4}, changes=[C1]),
            add(b"y", {"v": 1}, changes=[C1]),
            insert(b"z", {"v": 0}),
        )
        await commit(p, 50, delete(b"x", changes=[C1]))
        want = [
            change20,
            (change_key(b"x", 50), {"b": {"v": 2}, "a": None}),
            (change_key(b"y", 40), {"b": None, "a": {"v": 5}}),
        ]
        assert await scan(p, 60, table=C1) == want
        assert await scan(p, 45, table=C1) == [want[0], want[2]]
        # a growing transaction's change row has the before image of the whole transaction
        assert (await p.prepare(sub(70, update(b"y", {"v": 6}, changes=[C1])))).outcome == YES
        assert (await p.prepare(sub(70, add(b"y", {"v": 1}, changes=[C1])))).outcome == YES
        await p.decide(70, True)
        change70 = (change_key(b"y", 70), {"b": {"v": 5}, "a": {"v": 7}})
        assert await scan(p, 70, table=C1) == [*want, change70]

        # durable like any row: through the log, then through the store
        crash(p)
        q = env.participant()
        await q.recover()
        assert await scan(q, 80, table=C1) == [*want, change70]
        await q.checkpoint()
        assert stored(env.store, change_key(b"x", 20), table=C1)[:2] == (20, change20[1])
        q.rows.clear()
        assert await scan(q, 80, table=C1) == [*want, change70]
        assert await scan(q, 80, table=C2) == [change20]

    run(main)


def test_change_rows_live_on_the_partition_of_their_base_row(env: Env) -> None:
    env.store.create_table(C1)
    keys = [b"k%d" % i for i in range(40)]
    mine = [k for k in keys if partition_of(TABLE, k, 2) == 0]
    # with its own hash, some change row would belong to the other partition
    assert any(partition_of(TABLE, change_key(k, 10), 2) == 1 for k in mine)

    async def main() -> None:
        p = env.participant(partition=0, partitions=2)
        await commit(p, 10, *(insert(k, {"v": 1}, changes=[C1]) for k in mine))
        rows = await scan(p, 10, table=C1)
        assert [k for k, _ in rows] == sorted(change_key(k, 10) for k in mine)

    run(main)


# ----------------------------------------------------------------------------- put


def test_put_writes_and_erases(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, put(b"x", {"v": 1, "s": "a"}))  # no row yet: created
        assert await get(p, 10, b"x") == {"v": 1, "s": "a"}
        await commit(p, 20, put(b"x", {"v": 2}))  # replaces the whole row
        assert await get(p, 20, b"x") == {"v": 2}
        lsn30 = await commit(p, 30, put(b"x", None))  # empty values: erase
        assert await get(p, 30, b"x") is None
        assert await get(p, 25, b"x") == {"v": 2}
        await commit(p, 40, put(b"nothing", None))  # erasing no row is fine
        assert await get(p, 40, b"nothing") is None
        await commit(p, 50, put(b"y", {"v": 5}), put(b"y", {"v": 6}), add(b"y", {"v": 1}))
        assert await get(p, 50, b"y") == {"v": 7}
        # a blind write still takes its row in timestamp order
        assert await outcome(p, 25, put(b"x", {"v": 9})) == TOO_LATE
        assert await outcome(p, 35, put(b"y", {"v": 9})) == TOO_LATE
        vote = await p.prepare(sub(60, put(b"y", None), want_images=True))
        assert decode_row(vote.images[0].before) == {"v": 7}
        assert vote.images[0].after == b""
        await p.decide(60, True)
        await p.checkpoint()
        assert stored(env.store, b"x") == (30, None, lsn30)
        assert stored(env.store, b"y")[:2] == (60, None)
        assert await scan(p, 70) == []

    run(main)


# ----------------------------------------------------------------------------- register_read


def test_register_read_sees_the_state_before_its_own_timestamp(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        await commit(p, 20, update(b"x", {"v": 2}))
        assert await get(p, 20, b"x", register=True) == {"v": 1}
        assert await get(p, 20, b"x") == {"v": 2}  # a snapshot read at 20 includes 20
        assert await get(p, 21, b"x", register=True) == {"v": 2}
        assert await get(p, 10, b"x", register=True) is None

        # a transaction reads rows it holds without waiting for itself, then goes on
        assert (
            await p.prepare(sub(30, update(b"x", {"v": 3}), insert(b"y", {"v": 0})))
        ).outcome == (YES)
        assert await asyncio.wait_for(get(p, 30, b"x", register=True), 0.5) == {"v": 2}
        assert await asyncio.wait_for(get(p, 30, b"y", register=True), 0.5) is None
        rows = await asyncio.wait_for(scan(p, 30, register_read=True), 0.5)
        assert rows == [(b"x", {"v": 2})]
        assert (await p.prepare(sub(30, add(b"x", {"v": 10})))).outcome == YES
        await p.decide(30, True)
        assert await get(p, 30, b"x") == {"v": 13}

        # an older holder is still waited for
        assert (await p.prepare(sub(40, update(b"x", {"v": 40})))).outcome == YES
        reader = asyncio.ensure_future(get(p, 50, b"x", register=True))
        assert await pending(reader)
        await p.decide(40, True)
        assert await asyncio.wait_for(reader, 1) == {"v": 40}
        # and the read is remembered: an older writer is now too late
        assert await outcome(p, 45, update(b"x", {"v": 45})) == TOO_LATE

        # its own pending merge is not waited for, an older one is
        assert (await p.prepare(sub(60, merge(G, view(1, 1))))).outcome == YES
        assert await asyncio.wait_for(get(p, 60, G, register=True), 0.5) is None
        reader = asyncio.ensure_future(get(p, 61, G, register=True))
        assert await pending(reader)
        await p.decide(60, True)
        assert await asyncio.wait_for(reader, 1) == view(1, 1)

    run(main)


# ----------------------------------------------------------------------------- model check

KEYS = [b"a", b"b", b"c", b"d"]
VIEW_KEYS = [b"m", b"n"]  # view rows: only MERGE touches them
_op_strategy = st.one_of(
    st.tuples(
        st.sampled_from(["insert", "update", "add", "delete"]),
        st.sampled_from(KEYS),
        st.integers(min_value=-5, max_value=5),
    ),
    st.tuples(st.just("merge"), st.sampled_from(VIEW_KEYS), st.integers(min_value=-5, max_value=5)),
)
_merges_strategy = st.lists(
    st.tuples(st.just("merge"), st.sampled_from(VIEW_KEYS), st.integers(min_value=-5, max_value=5)),
    min_size=1,
    max_size=3,
)
_step_strategy = st.one_of(
    st.tuples(
        st.just("tx"),
        st.lists(_op_strategy, min_size=1, max_size=3),
        st.sampled_from(["commit", "abort", "crash, then commit", "crash, then abort"]),
    ),
    # two merging transactions, the younger computed on the older's result (it may delete a
    # row the older one inserted); the younger's decision arrives first
    st.tuples(
        st.just("pair"),
        _merges_strategy,
        _merges_strategy,
        st.booleans(),
        st.sampled_from(["nothing", "crash", "checkpoint", "checkpoint, crash"]),
    ),
    st.just(("checkpoint",)),
    st.just(("crash",)),
)


def _member_change(row: dict[str, Any] | None, n: int) -> tuple[int, int]:
    """A view row is the aggregate of a multiset of member values: n >= 0 adds the member
    n % 3, n < 0 removes one of the members there are (adds one if there is none).
    Returns (sign, value)."""
    members = sorted(int(v) for v in (row or {}).get("m", {}))
    if n >= 0 or not members:
        return 1, abs(n) % 3
    return -1, members[-n % len(members)]


def _expected(
    model: dict[bytes, Any], ops: list[tuple[str, bytes, int]]
) -> tuple[int, dict, list[pb.RowOp]]:
    """The vote, the rows after the transaction and the operations to send."""
    rows = dict(model)
    row_ops = []
    for kind, key, n in ops:
        if kind == "merge":
            sign, value = _member_change(rows.get(key), n)
            row = rows.get(key) or {"_count": 0, "s": 0, "m": {}}
            members = dict(row["m"])
            members[str(value)] = members.get(str(value), 0) + sign
            members = {v: c for v, c in members.items() if c}
            if row["_count"] + sign:
                rows[key] = {"_count": row["_count"] + sign, "s": row["s"] + sign * value}
                rows[key]["m"] = members
            else:
                assert not members and row["s"] == sign * -value
                del rows[key]
            row_ops.append(merge(key, {"_count": sign, "s": sign * value, "m": {str(value): sign}}))
            continue
        row_ops.append(_row_op(kind, key, n))
        if kind == "insert":
            if key in rows:
                return ALREADY_EXISTS, model, row_ops
            rows[key] = {"v": n}
        elif key not in rows:
            return NOT_FOUND, model, row_ops
        elif kind == "update":
            rows[key] = {**rows[key], "v": n, "u": True}
        elif kind == "add":
            rows[key] = {**rows[key], "v": rows[key]["v"] + n}
        else:
            del rows[key]
    return YES, rows, row_ops


def _row_op(kind: str, key: bytes, n: int) -> pb.RowOp:
    if kind == "insert":
        return insert(key, {"v": n})
    if kind == "update":
        return update(key, {"v": n, "u": True})
    if kind == "add":
        return add(key, {"v": n})
    return delete(key)


@settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", 0)) or examples(15, 30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=st.lists(_step_strategy, max_size=20))
def test_histories_with_checkpoints_crashes_and_eviction_match_a_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[Any, ...]]
) -> None:
    env = Env(tmp_path_factory.mktemp("model"))

    async def check(p: Participant, ts: int, model: dict[bytes, Any]) -> None:
        for key in KEYS + VIEW_KEYS:
            assert await get(p, ts, key) == model.get(key), key
        assert await scan(p, ts) == sorted(model.items())

    async def restart(p: Participant, ts: int) -> Participant:
        await p.wal.flush()  # aborts are only queued; their loss is tested elsewhere
        crash(p)
        q = env.participant(cache_rows=2)
        await q.recover()
        return q

    async def main() -> None:
        p = env.participant(cache_rows=2)
        await p.recover()
        model: dict[bytes, Any] = {}
        ts = 0
        for step in steps:
            ts += 1
            if step[0] == "checkpoint":
                p.observe(ts, 0)
                await p.checkpoint()
                assert len(p.rows) <= max(2, p.dirty_rows())
            elif step[0] == "crash":
                p = await restart(p, ts)
                p.observe(0, ts)
            elif step[0] == "pair":
                _, older_ops, younger_ops, younger_commits, between = step
                _, with_older, older = _expected(model, older_ops)
                _, with_both, younger = _expected(with_older, younger_ops)
                assert (await p.prepare(sub(ts, *older))).outcome == YES
                ts += 1
                assert (await p.prepare(sub(ts, *younger))).outcome == YES
                await p.decide(ts, younger_commits)
                if between.startswith("checkpoint"):
                    await p.checkpoint()  # may store a partial sum
                if between.endswith("crash"):
                    p = await restart(p, ts)
                    assert set(p.prepared) == {ts - 1}
                    p.observe(0, ts)
                await p.decide(ts - 1, True)
                model = with_both if younger_commits else with_older
            else:
                _, ops, decision = step
                want, after, row_ops = _expected(model, ops)
                vote = await p.prepare(sub(ts, *row_ops))
                assert vote.outcome == want, (ops, model, vote)
                if want != YES:
                    continue
                if decision.startswith("crash"):
                    p = await restart(p, ts)
                    assert set(p.prepared) == {ts}
                    p.observe(0, ts)
                decision_commit = decision.endswith("commit")
                await p.decide(ts, decision_commit)
                if decision_commit:
                    model = after
            await check(p, ts, model)
        p.observe(ts, 0)
        await p.checkpoint()
        in_store = {k: decode_stored(v)[1] for k, v in env.store.scan(TABLE)}
        assert {k: row for k, row in in_store.items() if row is not None} == model
        p = await restart(p, ts)
        p.observe(0, ts + 1)
        await check(p, ts + 2, model)
        assert not any(s.busy() for s in p.rows.values())

    try:
        run(main)
    finally:
        env.store.close()


# ----------------------------------------------------------------------------- backfill


def backfill(key: bytes, values: dict[str, Any] | None) -> pb.RowOp:
    return _op(pb.RowOp.BACKFILL, key, values)


def test_backfill_yields_to_a_younger_write_and_applies_otherwise(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 30, put(b"taken", None))  # a younger writer already decided this row
        vote = await p.prepare(sub(20, backfill(b"taken", {"v": 1}), backfill(b"free", {"v": 2})))
        assert vote.outcome == YES  # where a plain PUT would be too late
        await p.decide(20, True)
        assert await get(p, 40, b"taken") is None  # the younger write stands
        assert await get(p, 40, b"free") == {"v": 2}
        assert await outcome(p, 20, put(b"taken", {"v": 1})) == TOO_LATE

    run(main)


def test_paged_scans_cover_store_and_memory_rows_exactly_once(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        for ts, key in enumerate([b"a", b"c", b"e", b"g", b"i"], start=10):
            await commit(p, ts, put(key, {"k": key.decode()}))
        await p.checkpoint()  # these are in the store now
        await commit(p, 20, put(b"b", {"k": "b"}), put(b"c", None), put(b"h", {"k": "h"}))
        seen, cursor = [], b""
        while True:
            rows, cursor = await p.read_page(
                pb.ReadRequest(ts=20, table=TABLE, scan=True, start=cursor, limit=2, page=True)
            )
            seen += [key for key, _ in rows]
            if not cursor:
                break
        assert seen == [b"a", b"b", b"e", b"g", b"h", b"i"]

    run(main)


def test_a_view_delta_committed_in_one_phase_survives_a_checkpoint_taken_before_it_applies(
    env: Env,
) -> None:
    """A one-phase commit's record gets its log number before its flush and is applied after
    it. Another transaction's delta on the same view row, logged later but applied first, is
    in a checkpoint taken meanwhile, which stores the row at that later number: replay after a
    crash would then skip the first commit's record as already stored, and its delta would be
    lost. The checkpoint leaves such a row for the next one."""

    async def main() -> None:
        p = env.participant()
        await commit(p, 10, merge(G, view(1, 1)))
        await p.checkpoint()
        # prepared on disk (several participants: its coordinator logs the decision)
        assert (await p.prepare(sub(30, merge(G, view(1, 10))))).outcome == YES
        await p.checkpoint()  # 30's prepare record now in an older segment than what follows
        disk = slow_disk(p)  # a flush ends once this is set
        assert (await p.prepare(sub(20, merge(G, view(1, 100))), durable=False)).outcome == YES
        one_phase = asyncio.ensure_future(p.decide(20, True))  # logged, waits for the disk
        await asyncio.sleep(0.01)
        later = asyncio.ensure_future(p.decide(30, True))  # applied now, logged after 20's
        await asyncio.sleep(0.01)
        checkpoint = asyncio.ensure_future(p.checkpoint())
        await asyncio.sleep(0.01)
        disk.set()
        await asyncio.wait_for(asyncio.gather(one_phase, later, checkpoint), 5)
        assert (await get(p, 40, G))["s"] == 111
        crash(p)
        q = env.participant()
        await q.recover()
        assert (await get(q, 50, G))["s"] == 111, "a view delta was lost across the crash"

    run(main)


def test_a_commit_logged_above_a_rows_number_does_not_hold_a_checkpoint_back(env: Env) -> None:
    """A commit applied once its record is durable (one-phase, or by its decision's record in
    a member's one log) has its log number before that flush. A checkpoint meanwhile stores a
    view row it adds to without its delta; where no commit numbered above it was applied to
    the row, replay applies the record over the stored row, so the checkpoint stores it (a
    row held back holds every segment back too: a member under steady load, with some commit
    always waiting on a hot view row, never dropped one). A crash then loses nothing."""

    async def main() -> None:
        p = env.participant()
        for ts in (10, 11, 12):  # segments the checkpoint below may drop
            await commit(p, ts, merge(G, view(1, 1)))
            await p.checkpoint()
        await commit(p, 15, merge(G, view(1, 10)))  # the row to store, numbered below 20's
        disk = slow_disk(p)  # a flush ends once this is set
        assert (await p.prepare(sub(20, merge(G, view(1, 100))), durable=False)).outcome == YES
        one_phase = asyncio.ensure_future(p.decide(20, True))  # logged, waits for the disk
        await asyncio.sleep(0.01)
        checkpoint = asyncio.ensure_future(p.checkpoint())
        await asyncio.sleep(0.01)
        disk.set()
        await asyncio.wait_for(asyncio.gather(one_phase, checkpoint), 5)
        assert stored(env.store, G)[1]["s"] == 13, "held back"  # without 20's: replay adds it
        assert (await get(p, 30, G))["s"] == 113
        crash(p)
        q = env.participant()
        await q.recover()
        assert (await get(q, 40, G))["s"] == 113, "a view delta was lost across the crash"

    run(main)
