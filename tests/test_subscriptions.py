"""View subscriptions: the copy a subscriber keeps from the changes it receives equals the
view at each message's timestamp while 8 clients write (checked against every commit the
writers saw, replayed up to that timestamp); a broken stream reconnects and the copy stays
exact; futures resolve on a predicate; the asyncio iterator; refusals."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from polling import wait_for

from aggclient import Client
from aggclient.client import AsyncClient
from aggclient.subscriptions import Changes, Watch
from aggview import errors


def _view_at(history: list[tuple[int, str, int, str, int]], ts: int) -> dict[tuple[Any], dict]:
    """The view (g -> total, n) from the commits at or below ``ts``."""
    alive: dict[int, tuple[str, int]] = {}
    for commit_ts, op, row_id, group, value in sorted(history):
        if commit_ts > ts:
            break
        if op == "insert":
            alive[row_id] = (group, value)
        else:
            alive.pop(row_id, None)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for group, value in alive.values():
        totals[group][0] += value
        totals[group][1] += 1
    return {(g,): {"g": g, "total": t, "n": n} for g, (t, n) in totals.items()}


def test_a_subscribers_copy_is_the_view_at_every_timestamp(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT NOT NULL, v INT NOT NULL)")
    view = f"{table_name}_by_g"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} AS SELECT g, SUM(v) AS total, COUNT(*) AS n "
        f"FROM {table_name} GROUP BY g"
    )
    seen: list[tuple[int, dict]] = []

    def record(changes: Changes, watch: Watch) -> None:
        seen.append((changes.timestamp, dict(watch.copy.rows)))

    watch = client.watch(view, record, interval_ms=20)
    history: list[tuple[int, str, int, str, int]] = []
    lock = threading.Lock()

    def writer(worker: int) -> None:
        rng = random.Random(worker)
        mine: list[int] = []
        with Client(client.address) as own:
            for i in range(25):
                if mine and rng.random() < 0.3:
                    row_id = mine.pop(rng.randrange(len(mine)))
                    with own.transaction() as tx:
                        tx.delete(table_name, {"id": row_id})
                    with lock:
                        history.append((tx.timestamp, "delete", row_id, "", 0))
                    continue
                row_id, group, value = worker * 1000 + i, rng.choice("abc"), rng.randint(1, 9)
                with own.transaction() as tx:
                    tx.insert(table_name, {"id": row_id, "g": group, "v": value})
                mine.append(row_id)
                with lock:
                    history.append((tx.timestamp, "insert", row_id, group, value))
                if worker == 0 and i == 12:  # the stream breaks: the watch reconnects
                    watch._stream.cancel()

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    last = max(ts for ts, *_ in history)
    wait_for("the watch to see the last commit", lambda: watch.copy.timestamp >= last)
    watch.stop()
    assert watch.error is None
    assert len(seen) > 3
    for ts, copy in seen:
        assert copy == _view_at(history, ts), ts
    assert seen[-1][1] == {(r["g"],): r for r in client.view(view)}


def test_when_resolves_once_the_predicate_holds(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT NOT NULL)")
    view = f"{table_name}_n"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} AS SELECT g, COUNT(*) AS n FROM {table_name} GROUP BY g"
    )
    reached = client.when(view, {"g": "x"}, lambda row: row["n"] >= 3)
    for i in range(5):
        assert not reached.done() or i > 3
        with client.transaction() as tx:
            tx.insert(table_name, {"id": i, "g": "x" if i % 2 == 0 else "y"})
    assert reached.result(timeout=30) == {"g": "x", "n": 3}


def test_the_asyncio_iterator_and_refusals(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT NOT NULL)")
    view = f"{table_name}_n"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} AS SELECT g, COUNT(*) AS n FROM {table_name} GROUP BY g"
    )
    with client.transaction() as tx:
        tx.insert(table_name, {"id": 1, "g": "a"})

    async def main() -> list[Changes]:
        async with AsyncClient(client.address) as own:
            got: list[Changes] = []
            async for changes in own.watch(view, interval_ms=20):
                got.append(changes)
                if len(got) == 1:
                    async with own.transaction() as tx:
                        tx.insert(table_name, {"id": 2, "g": "b"})
                else:
                    return got
            raise AssertionError("the stream ended")

    first, second = asyncio.run(main())
    assert first.reset and [c.new for c in first.changes] == [{"g": "a", "n": 1}]
    assert not second.reset and [(c.old, c.new) for c in second.changes] == [
        (None, {"g": "b", "n": 1})
    ]
    assert second.timestamp > first.timestamp

    for bad, error in (("nowhere", errors.UnknownTable), (view, errors.InvalidArgument)):
        watch = client.watch(bad, interval_ms=5 if bad == view else 0)
        wait_for("the watch to fail", lambda w=watch: w.error is not None)
        assert isinstance(watch.error, error), watch.error
        watch.stop()
    with pytest.raises(errors.InvalidArgument, match="no column"):
        asyncio.run(_first(client.address, view, {"nope": 1}))


async def _first(address: str, view: str, where: dict[str, Any]) -> Changes:
    async with AsyncClient(address) as own:
        async for changes in own.watch(view, where):
            return changes
    raise AssertionError("no message")


def test_a_watch_is_a_context_manager_that_closes(client: Client, table_name: str) -> None:
    client.sql(f"CREATE TABLE {table_name} (id INT PRIMARY KEY, g TEXT NOT NULL)")
    view = f"{table_name}_n"
    client.sql(
        f"CREATE MATERIALIZED VIEW {view} AS SELECT g, COUNT(*) AS n FROM {table_name} GROUP BY g"
    )
    seen: list[Changes] = []
    with client.watch(view, lambda changes, _: seen.append(changes), interval_ms=20) as watch:
        wait_for("the first message", lambda: seen)
        assert seen[0].reset
    assert not watch._thread.is_alive()  # the block's end closed it
    client.sql(f"INSERT INTO {table_name} VALUES (1, 'a')")
    count = len(seen)
    wait_for("the insert in the view", lambda: client.view(view))
    time.sleep(0.2)  # ten intervals: a watch still open would have had it
    assert len(seen) == count  # nothing came after the close
    watch.close()  # a second close is harmless
