"""The local transaction manager's logic (ltm.participant and ltm.rows), driven directly."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggview.partition_map import partition_of
from aggview.rowcodec import (
    decode_json,
    decode_row,
    decode_stored,
    encode_json,
    encode_row,
    encode_stored,
)
from aggview.wire import ltm_pb2 as pb
from ltm.participant import Participant, Settings
from ltm.rows import RowState
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


def _op(
    kind: int,
    key: bytes,
    values: dict[str, Any] | None,
    *,
    require: list[list[Any]] | None = None,
    limits: dict[str, int] | None = None,
    table: str = TABLE,
) -> pb.RowOp:
    op = pb.RowOp(kind=kind, table=table, key=key, values=encode_row(values))
    if require is not None:
        op.require = encode_json(require)
    if limits is not None:
        op.limits = encode_json(limits)
    return op


def sub(ts: int, *ops: pb.RowOp, want_images: bool = False) -> pb.SubTransaction:
    return pb.SubTransaction(ts=ts, ops=list(ops), want_images=want_images)


async def commit(p: Participant, ts: int, *ops: pb.RowOp) -> None:
    vote = await p.prepare(sub(ts, *ops))
    assert vote.outcome == YES, vote
    await p.decide(ts, True)


async def outcome(p: Participant, ts: int, *ops: pb.RowOp) -> int:
    """Prepares and aborts; returns the vote's outcome."""
    vote = await p.prepare(sub(ts, *ops))
    await p.decide(ts, False)
    return vote.outcome


async def get(p: Participant, ts: int, key: bytes, register: bool = False) -> Any:
    rows = await p.read(pb.ReadRequest(ts=ts, table=TABLE, keys=[key], register_read=register))
    assert len(rows) <= 1
    return decode_row(rows[0][1]) if rows else None


async def scan(p: Participant, ts: int, **kw: Any) -> list[tuple[bytes, Any]]:
    rows = await p.read(pb.ReadRequest(ts=ts, table=TABLE, scan=True, **kw))
    return [(key, decode_row(data)) for key, data in rows]


def stored(store: Store, key: bytes) -> tuple[int, Any] | None:
    data = store.get(TABLE, key)
    return decode_stored(data) if data is not None else None


def crash(p: Participant) -> None:
    """Like kill -9: no checkpoint, no flush of what was only queued, background tasks gone."""
    for task in p._background:
        task.cancel()
    p.wal._pending.clear()
    os.close(p.wal._fd)


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
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.log_dir = tmp_path / "log"
        self.store = open_store(f"sqlite:///{tmp_path}/store.db")
        self.store.create_table(TABLE)

    def participant(self, fsync: bool = False, **settings: Any) -> Participant:
        outcome_query = settings.pop("outcome_query", None)
        return Participant(
            self.store,
            self.log_dir,
            Settings(**settings),
            fsync=fsync,
            outcome_query=outcome_query,
        )


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
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
        await commit(p, 10, insert(b"x", {"v": 1}), insert(b"y", {"v": 1}))
        await commit(p, 20, update(b"x", {"v": 2}))
        assert p.dirty_rows() == 2
        assert p.wal.segments() == [1]
        assert await p.checkpoint() == 2
        assert stored(env.store, b"x") == (20, {"v": 2})
        assert stored(env.store, b"y") == (10, {"v": 1})
        assert p.wal.segments() == [2] and p.checkpoints == 1
        assert p.dirty_rows() == 0
        # a clean checkpoint writes nothing
        assert await p.checkpoint() == 0
        # a delete removes the row from the store
        await commit(p, 30, delete(b"y"))
        assert await p.checkpoint() == 1
        assert stored(env.store, b"y") is None
        assert stored(env.store, b"x") == (20, {"v": 2})
        assert len(p.wal.segments()) == 1

    run(main)


def test_checkpoint_carries_undecided_transactions(env: Env) -> None:
    async def main() -> None:
        p = env.participant()
        await commit(p, 10, insert(b"x", {"v": 1}))
        assert (await p.prepare(sub(20, update(b"x", {"v": 2})))).outcome == YES
        assert (await p.prepare(sub(20, insert(b"y", {"v": 2})))).outcome == YES  # grows
        await p.checkpoint()
        await p.checkpoint()
        assert p.wal.segments() == [3]
        # the store has only the committed version
        assert stored(env.store, b"x") == (10, {"v": 1})
        crash(p)

        q = env.participant()
        await q.recover()
        assert set(q.prepared) == {20}
        assert set(q.prepared[20].after) == {(TABLE, b"x"), (TABLE, b"y")}
        assert q.rows[(TABLE, b"x")].holder == 20 and q.rows[(TABLE, b"y")].holder == 20
        await q.decide(20, True)
        assert await get(q, 30, b"x") == {"v": 2}
        assert await get(q, 30, b"y") == {"v": 2}
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
        await commit(p, 20, update(b"a", {"v": 2}), delete(b"b"), insert(b"d", {"v": 2}))
        await commit(p, 30, update(b"a", {"v": 3}))
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
        assert stored(env.store, b"a") == (30, {"v": 3})
        assert stored(env.store, b"b") is None
        assert stored(env.store, b"d") == (20, {"v": 2})
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
        await commit(p, 20, update(b"x", {"v": 2}))
        await p.checkpoint()
        assert stored(env.store, b"x") == (20, {"v": 2})
        crash(p)
        # the old segment comes back (a crash before its removal was durable)
        shutil.copy(saved, first)

        q = env.participant()
        await q.recover()
        assert await get(q, 30, b"x") == {"v": 2}
        assert await outcome(q, 15, update(b"x", {"v": 9})) == TOO_LATE
        await q.checkpoint()
        assert stored(env.store, b"x") == (20, {"v": 2})

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
        await commit(p, 10, *(insert(k, {"v": i}) for i, k in enumerate(keys)))
        p.observe(10, 0)
        # a row held by an undecided transaction and a row newer than the watermark stay
        assert (await p.prepare(sub(20, update(b"k0", {"v": 100})))).outcome == YES
        await commit(p, 30, update(b"k1", {"v": 101}))
        await p.checkpoint()
        assert len(p.rows) == 2
        assert {(TABLE, b"k0"), (TABLE, b"k1")} <= set(p.rows)
        for i, key in enumerate(keys[2:], start=2):
            assert stored(env.store, key) == (10, {"v": i})
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


# ----------------------------------------------------------------------------- model check

KEYS = [b"a", b"b", b"c", b"d"]
_op_strategy = st.tuples(
    st.sampled_from(["insert", "update", "add", "delete"]),
    st.sampled_from(KEYS),
    st.integers(min_value=-5, max_value=5),
)
_step_strategy = st.one_of(
    st.tuples(
        st.just("tx"),
        st.lists(_op_strategy, min_size=1, max_size=3),
        st.sampled_from(["commit", "abort", "crash, then commit", "crash, then abort"]),
    ),
    st.just(("checkpoint",)),
    st.just(("crash",)),
)


def _expected(model: dict[bytes, Any], ops: list[tuple[str, bytes, int]]) -> tuple[int, dict]:
    rows = dict(model)
    for kind, key, n in ops:
        if kind == "insert":
            if key in rows:
                return ALREADY_EXISTS, model
            rows[key] = {"v": n}
        elif key not in rows:
            return NOT_FOUND, model
        elif kind == "update":
            rows[key] = {**rows[key], "v": n, "u": True}
        elif kind == "add":
            rows[key] = {**rows[key], "v": rows[key]["v"] + n}
        else:
            del rows[key]
    return YES, rows


def _row_op(kind: str, key: bytes, n: int) -> pb.RowOp:
    if kind == "insert":
        return insert(key, {"v": n})
    if kind == "update":
        return update(key, {"v": n, "u": True})
    if kind == "add":
        return add(key, {"v": n})
    return delete(key)


@settings(
    max_examples=int(os.environ.get("MODEL_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=st.lists(_step_strategy, max_size=20))
def test_histories_with_checkpoints_crashes_and_eviction_match_a_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[Any, ...]]
) -> None:
    env = Env(tmp_path_factory.mktemp("model"))

    async def check(p: Participant, ts: int, model: dict[bytes, Any]) -> None:
        for key in KEYS:
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
            else:
                _, ops, decision = step
                want, after = _expected(model, ops)
                vote = await p.prepare(sub(ts, *(_row_op(*op) for op in ops)))
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
        assert in_store == model
        p = await restart(p, ts)
        p.observe(0, ts + 1)
        await check(p, ts + 2, model)
        assert not any(s.busy() for s in p.rows.values())

    try:
        run(main)
    finally:
        env.store.close()
