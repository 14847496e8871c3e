"""One row's in-memory state at its LTM: committed versions for snapshot reads, the prepared
transaction that holds it, and the transactions queued for it in timestamp order.

Timestamp ordering, per row: a transaction may take a row only if no younger transaction has
committed it, holds it, or has read it in a read/write transaction; otherwise it is too late.
A transaction that finds an older one holding the row waits, so waits only point from younger
to older transactions and cannot form a cycle.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from aggview import errors
from aggview.merge import merge

Row = dict[str, Any]
_sequence = itertools.count()


@dataclass
class RowState:
    versions: list[tuple[int, Row | None]]  # committed, oldest first; None marks "absent"
    rts: int = 0  # youngest read/write transaction that read this row
    holder: int = 0  # timestamp of the transaction that holds the row (0: free)
    dirty: bool = False  # committed changes the store does not have yet
    pins: int = 0  # requests between loading the row and taking or reading it: not evictable
    lsn: int = 0  # log sequence number of the last change applied (see Participant.recover)
    merges: dict[int, Row] = field(default_factory=dict)  # prepared view deltas by timestamp
    lock_waiters: list[tuple[int, int, asyncio.Future[bool]]] = field(default_factory=list)
    read_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    # a partial row of a view (aggview.partition_map): its _count may be 0 while its sums
    # are not, for good, so it is never settled
    partial: bool = False

    @property
    def last_ts(self) -> int:
        return self.versions[-1][0]

    @property
    def current(self) -> Row | None:
        return self.versions[-1][1]

    def too_late_for(self, ts: int) -> bool:
        return ts <= self.last_ts or ts < self.rts or self.holder > ts

    def version_at(self, ts: int) -> tuple[int, Row | None]:
        for version in reversed(self.versions):
            if version[0] <= ts:
                return version
        # Older than every version kept: only possible for a read below the low watermark,
        # which the coordinator never issues.
        raise errors.Unavailable(
            f"snapshot too old: no version at {ts}, the oldest kept is {self.versions[0][0]}; "
            "read again"
        )

    def busy(self) -> bool:
        return bool(
            self.holder or self.lock_waiters or self.read_waiters or self.pins or self.merges
        )

    def try_acquire(self, ts: int) -> bool | None:
        """Takes the row now if it can: True taken, False too late, None it must wait."""
        if self.holder == ts:
            return True  # a transaction growing more operations on a row it holds
        if self.too_late_for(ts):
            return False
        if not self.holder:
            self.holder = ts
            return True
        return None

    async def acquire(self, ts: int) -> bool:
        """Takes the row for transaction ``ts``; False means too late (abort)."""
        now = self.try_acquire(ts)
        if now is not None:
            return now
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.lock_waiters, (ts, next(_sequence), waiter))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # handed the row just as the wait was cancelled: pass it on
            raise

    def abandon(self, reason: Exception) -> None:
        """The partition stops here (handed over, fenced): every waiter gives up at once
        (a lock waiter as too late, so its transaction aborts and is tried again)."""
        waiters, self.lock_waiters = self.lock_waiters, []
        for _, _, waiter in waiters:
            if not waiter.done():
                waiter.set_result(False)
        readers, self.read_waiters = self.read_waiters, []
        for reader in readers:
            if not reader.done():
                reader.set_exception(reason)

    def release(self) -> None:
        """Frees the row and hands it to the oldest waiter that is not too late by now."""
        self.holder = 0
        while self.lock_waiters:
            ts, _, waiter = heapq.heappop(self.lock_waiters)
            if waiter.done():
                continue  # timed out
            if self.too_late_for(ts):
                waiter.set_result(False)
                continue
            self.holder = ts
            waiter.set_result(True)
            break
        self.wake_readers()

    def commit(self, ts: int, after: Row | None, low_watermark: int, lsn: int = 0) -> None:
        self.versions.append((ts, after))
        self.dirty = True
        self.lsn = max(self.lsn, lsn)
        self.prune(low_watermark)

    def commit_merge(self, ts: int, delta: Row, low_watermark: int, lsn: int = 0) -> None:
        """Applies a view delta committed at ``ts``. Deltas commit in any timestamp order, so
        the delta also goes into every younger version already there, and a version at ``ts``
        is made from the one before it (none is needed below the oldest kept: no read is that
        old)."""
        self.merges.pop(ts, None)
        younger = next((i for i, v in enumerate(self.versions) if v[0] > ts), len(self.versions))
        for i in range(younger, len(self.versions)):
            version_ts, row = self.versions[i]
            self.versions[i] = (version_ts, merge(row, delta))
        if younger:
            self.versions.insert(younger, (ts, merge(self.versions[younger - 1][1], delta)))
        self.settle()
        self.dirty = True
        self.lsn = max(self.lsn, lsn)
        self.prune(low_watermark)
        self.wake_readers()

    def drop_merge(self, ts: int) -> None:
        if self.merges.pop(ts, None) is not None:
            if self.settle():
                self.dirty = True
            self.wake_readers()

    def settle(self) -> bool:
        """Deletes the view row in every version whose ``_count`` is 0 and that no pending
        delta is older than: until then such a version may be a partial sum that the older
        delta completes (reads at or above a pending delta wait, so none sees it). Returns
        whether a version changed."""
        if self.partial:
            return False
        oldest = min(self.merges, default=None)
        changed = False
        for i, (ts, row) in enumerate(self.versions):
            if row is not None and not row.get("_count") and (oldest is None or ts < oldest):
                self.versions[i] = (ts, None)
                changed = True
        return changed

    def prune(self, low_watermark: int) -> None:
        """Keeps the newest version at or below the watermark and everything younger."""
        keep_from = 0
        for i, (ts, _) in enumerate(self.versions):
            if ts <= low_watermark:
                keep_from = i
        if keep_from:
            del self.versions[:keep_from]

    def blocks(self, ts: int, own: bool) -> bool:
        limit = ts - 1 if own else ts
        if self.holder and self.holder <= limit:
            return True
        return any(merge_ts <= limit for merge_ts in self.merges)

    def blocker(self, ts: int, own: bool) -> int:
        """The oldest transaction a read at ``ts`` waits for (0: none), for messages."""
        limit = ts - 1 if own else ts
        waits_for = [t for t in (self.holder, *self.merges) if t and t <= limit]
        return min(waits_for, default=0)

    async def wait_readable(self, ts: int, *, own: bool = False) -> None:
        """Waits until no transaction at or below ``ts`` holds the row or has a view delta
        pending on it (those are decided, so the wait is short: the coordinator reads only
        below every undecided timestamp). ``own``: the reader is transaction ``ts`` itself,
        which sees the row as it was before it."""
        while self.blocks(ts, own):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.read_waiters.append(waiter)
            await waiter

    def wake_readers(self) -> None:
        readers, self.read_waiters = self.read_waiters, []
        for reader in readers:
            if not reader.done():
                reader.set_result(None)


class RowCache(dict[tuple[str, bytes], RowState]):
    """The rows an LTM holds in memory, with the keys of each table kept apart, so a scan
    visits one table's cached rows instead of every cached row.

    It also knows, per table whose store table was asked (:meth:`learned`), the greatest key
    that store table may hold: a key above it that is not here is new, read from nowhere (an
    insert of an ascending id needs no store read). A row leaves memory stored and evicted,
    or gone from the store too, so every key that leaves raises it, however it leaves
    (``removed``: the greatest that left, for values learned meanwhile)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_table: dict[str, set[bytes]] = {}
        self.greatest: dict[str, bytes] = {}  # b"": the store table holds no key
        self.removed: dict[str, bytes] = {}

    def __setitem__(self, row_id: tuple[str, bytes], state: RowState) -> None:
        super().__setitem__(row_id, state)
        self.by_table.setdefault(row_id[0], set()).add(row_id[1])

    def __delitem__(self, row_id: tuple[str, bytes]) -> None:
        super().__delitem__(row_id)
        self._forget(row_id)

    def pop(self, row_id: tuple[str, bytes], *default: Any) -> Any:  # type: ignore[override]
        state = super().pop(row_id, *default)
        self._forget(row_id)
        return state

    def clear(self) -> None:
        for table, keys in self.by_table.items():
            self._left(table, max(keys))
        super().clear()
        self.by_table.clear()

    def _forget(self, row_id: tuple[str, bytes]) -> None:
        table, key = row_id
        keys = self.by_table.get(table)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_table[table]
        self._left(table, key)

    def _left(self, table: str, key: bytes) -> None:
        if key > self.removed.get(table, b""):
            self.removed[table] = key
            if key > self.greatest.get(table, key):
                self.greatest[table] = key

    def learned(self, table: str, stored: bytes) -> None:
        """The store table's greatest key, read at some moment since the read began: with
        every key that left memory meanwhile (stored, maybe after that moment)."""
        self.greatest[table] = max(
            stored, self.removed.get(table, b""), self.greatest.get(table, b"")
        )

    def new(self, table: str, key: bytes) -> bool:
        """Whether ``key`` is above every key ``table``'s store table may hold."""
        greatest = self.greatest.get(table)
        return greatest is not None and key > greatest

    def keys_of(self, table: str) -> set[bytes]:
        return self.by_table.get(table, set())
