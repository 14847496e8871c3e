"""The ownership record (``ltm/store/ownership.py``): every change of it is one compare-and-set,
so members racing on one partition, each on its own store connection, never both win -- on the
embedded store and on a real HBase (``checkAndPut``; it checked, then wrote, before)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from store_contract import run_in_threads

from ltm.store import Store, open_store, ownership
from ltm.store.ownership import Moved, Ownership, Superseded


@pytest.fixture(params=["sqlite", "real-hbase"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    """Opens a connection of its own to one fresh store (a table prefix of its own on HBase)."""
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path}/store.db"
    else:
        from test_real_hbase import fresh_prefix, store_url

        url = store_url(request.getfixturevalue("real_hbase"), table_prefix=fresh_prefix())
    opened: list[Store] = []

    def another() -> Store:
        opened.append(open_store(url))
        return opened[-1]

    yield another
    if request.param != "sqlite":
        opened[0].drop_table(ownership.TABLE)
    for store in opened:
        store.close()


def race(
    connect: Callable[[], Store], count: int, rounds: int, attempt: Callable[[Store, int], Any]
) -> list[list[int]]:
    """Each round, ``count`` members on their own connections make ``attempt(store, member)``
    at once (after reading what they need, before the barrier); the members that succeeded."""
    stores = [connect() for _ in range(count)]
    barrier = threading.Barrier(count, timeout=60)
    won: list[list[int]] = [[] for _ in range(rounds)]

    def member(n: int) -> None:
        for r in range(rounds):
            act = attempt(stores[n], n)  # reads, returns the write to race with
            barrier.wait()
            try:
                act()
                won[r].append(n)
            except (Moved, Superseded):
                pass
            barrier.wait()  # every attempt is over before the next round reads

    run_in_threads(count, member, barrier)
    return won


def test_members_racing_to_move_a_partition_from_one_epoch_have_one_winner(
    connect: Callable[[], Store],
) -> None:
    def attempt(store: Store, n: int) -> Callable[[], None]:
        was = ownership.read(store, 0)
        moved = Ownership(0, was.epoch + 1, n, standby=was.owner)
        return lambda: ownership.move(store, was, moved)

    won = race(connect, 6, 4, attempt)
    assert [len(w) for w in won] == [1, 1, 1, 1], won
    final = ownership.read(connect(), 0)
    assert (final.epoch, final.owner) == (4, won[-1][0])


def test_a_move_and_its_owner_s_own_write_never_both_land(
    connect: Callable[[], Store],
) -> None:
    """Two members read the record: its owner writes its standby's state (fenced), the other
    moves the partition to itself. One of the two lands, never both: the owner's write under
    a fence the move replaced would put the old epoch back."""

    def attempt(store: Store, n: int) -> Callable[[], object]:
        record = ownership.read(store, 0)
        if record.owner == n:
            flipped = record.evolve(standby=1 - n, in_sync=not record.in_sync)
            return lambda: ownership.write_standby(store, flipped)
        moved = Ownership(0, record.epoch + 1, n, standby=record.owner)
        return lambda: ownership.move(store, record, moved)

    won = race(connect, 2, 8, attempt)
    assert [len(w) for w in won] == [1] * 8, won


def test_data_writes_follow_the_owner_s_standby_and_stop_at_a_move(tmp_path: Path) -> None:
    """Rows are guarded on the whole record, read again when only the standby changed."""
    with open_store(f"sqlite://{tmp_path}/store.db") as store:
        store.create_table("rows")
        mine = Ownership(0, 0, 0)  # nothing stored yet
        mine = ownership.write_fenced(store, mine, [("rows", b"a", b"1")])
        ownership.write_standby(store, mine.evolve(standby=1, in_sync=True))
        now = ownership.write_fenced(store, mine, [("rows", b"b", b"2")])
        assert now.version != mine.version and now.in_sync
        ownership.move(store, now, Ownership(0, 1, 1, standby=0))
        with pytest.raises(Superseded, match="served by LTM 1 at epoch 1"):
            ownership.write_fenced(store, now, [("rows", b"c", b"3")])
        assert dict(store.scan("rows")) == {b"a": b"1", b"b": b"2"}


def test_a_record_of_the_earlier_three_key_layout_is_read_and_replaced(tmp_path: Path) -> None:
    """A data directory of an earlier build: fence ``f``, standby ``s`` and adoption ``a``."""
    with open_store(f"sqlite://{tmp_path}/store.db") as store:
        store.create_table(ownership.TABLE)
        p = b"\x00\x00\x00\x07"
        store.write(
            [
                (ownership.TABLE, b"f" + p, json.dumps({"epoch": 2, "owner": 3}).encode()),
                (
                    ownership.TABLE,
                    b"s" + p,
                    json.dumps(
                        {"standby": 4, "standby_address": "h:4", "in_sync": True, "at": 2}
                    ).encode(),
                ),
                (ownership.TABLE, b"a" + p, json.dumps({"epoch": 2, "committed": [5]}).encode()),
            ]
        )
        old = ownership.read(store, 7)
        assert old == Ownership(7, 2, 3, standby=4, standby_address="h:4", in_sync=True)
        assert ownership.read_adopted(store, 7) == (2, {5})
        ownership.move(store, old, Ownership(7, 3, 4, standby=3))
        with pytest.raises(Moved):  # the old layout is shadowed now
            ownership.move(store, old, Ownership(7, 3, 3))
        assert ownership.read(store, 7) == Ownership(7, 3, 4, standby=3)
        assert ownership.read_adopted(store, 7) == (2, {5})
