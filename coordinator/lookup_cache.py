"""Rows that view maintenance looks up by primary key, cached at the coordinator.

A sync insert into a fact table joins the new row with its dimension rows (a product, its
category) as they were just before the transaction; an async refresh does the same for every
change row it drains, at its own timestamp. Read from the LTMs, that is one round trip per join
step; the dimension rows hardly ever change, and every change to them passes through this
coordinator, so it can answer those reads itself.

A cached row is ``(row, visible_from)``: the committed state of the key seen by any read at a
timestamp ``t >= visible_from``, as long as no write to the key below ``t`` is undecided. Every
user transaction registers its writes to cached tables when it gets its timestamp, in the same
step of the event loop, so a reader knows each older writer that is still undecided. A write
can only commit once every older write of its row is decided (timestamp order at the LTM), so
a committed row image is the whole history below its timestamp. Hence:

- a lookup at ``t`` is served from the cache when the entry is visible at ``t`` and no write
  to the key below ``t`` is undecided; otherwise it reads the LTM (which registers the read
  there, so an older writer arriving later is refused) and offers the result back;
- a commit installs the row images it wrote (an operation whose image is unknown leaves an
  entry that only blocks older installs); an older install never overwrites a newer one;
- the first lookups need not all miss: when the set of cached tables changes (a view is
  created, the coordinator starts) their rows are read from a snapshot in the background, up
  to half the cache, and offered like any read;
- the ``floor`` is the newest timestamp the cache may have lost track of (an evicted entry, the
  set of cached tables changing): an install visible at or below it is refused, so nothing
  older than what was forgotten can come back.

A read that uses the cache leaves no read timestamp on the LTM's row. That is safe because a
writer older than the reader either was registered here before the reader looked (so the
reader went to the LTM) or will never exist: timestamps are handed out in order and a user
transaction's writes are all known when it gets its timestamp. Bulk transactions and SQL
writes with a WHERE, whose rows are known later, block the cache for their tables for every
younger reader while they are undecided.

With several coordinating members, each caches, and writers elsewhere reach it as the
clock's notices (``coordinator.clock``), in the step before any timestamp granted after them:
a notice's rows (or tables) are pending until the cluster has decided every transaction it
covers (``decided``); then its rows are unknown here and are read again from the LTMs, and a
notice for whole tables drops their entries (raising the floor above them). A new clock
stream (the leader restarted, the network failed) may have lost notices: the cache starts over
above everything issued before.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Protocol

from coordinator.clock import Notice, RowKey, Writes


class Image(Protocol):  # an ltm_pb2.RowImage
    table: str
    key: bytes
    after: bytes  # encoded row; empty: the row is gone


UNKNOWN = object()  # a committed write whose image the coordinator did not see
# Rows kept; 0 turns the cache off. Bytes kept (rows may be up to max_row_bytes each).
MAX_ROWS = int(os.environ.get("AGGVIEW_LOOKUP_CACHE_ROWS", "200000"))
MAX_BYTES = 64 * 1024 * 1024
ENTRY_OVERHEAD = 200  # bytes of bookkeeping per entry, roughly
# Tests set this: every answer from the cache is compared with a read from the LTMs and a
# difference is logged as "lookup cache mismatch" (the cache's answer is still used).
CHECK = os.environ.get("AGGVIEW_LOOKUP_CACHE_CHECK") == "1"


class LookupCache:
    def __init__(
        self,
        cached_tables: Callable[[], set[str]],
        epoch: Callable[[], int],
        current_ts: Callable[[], int],
        max_rows: int = MAX_ROWS,
        max_bytes: int = MAX_BYTES,
        warm: Callable[[set[str]], None] = lambda tables: None,
    ) -> None:
        self._cached_tables = cached_tables
        self._warm = warm
        self._epoch = epoch
        self._current_ts = current_ts
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.bytes = 0
        self._tables: set[str] = set()
        self._configured_epoch: int | None = None
        self._entries: OrderedDict[RowKey, tuple[object, int]] = OrderedDict()
        self._pending: dict[RowKey, set[int]] = {}
        self._writes: dict[int, list[RowKey]] = {}  # undecided ts -> its registered writes
        # undecided writers of rows known only later: ts -> the tables (None: any table)
        self._opaque: dict[int, frozenset[str] | None] = {}
        self._remote: list[Notice] = []  # other members' writers, until decided
        self.floor = 0
        self.hits = 0
        self.misses = 0

    def tables(self) -> set[str]:
        """The store tables cached now; a change of views starts the cache over."""
        epoch = self._epoch()
        if epoch != self._configured_epoch:
            self._configured_epoch = epoch
            self._tables = self._cached_tables() if self.max_rows > 0 else set()
            self._entries.clear()
            self.bytes = 0
            # Writers registered under the old set may be undecided and unregistered now:
            # what the LTMs return above every timestamp issued so far already waited for them.
            self.floor = max(self.floor, self._current_ts())
            if self._tables:
                self._warm(self._tables)
        return self._tables

    # ------------------------------------------------------------------ writers

    def writes(self, rows: Iterable[RowKey], tables: Iterable[str], epoch: int) -> Writes:
        """What a transaction about to ask for its timestamp writes in cached tables."""
        cached = self.tables()
        return Writes(
            tuple(dict.fromkeys(r for r in rows if r[0] in cached)),
            tuple(sorted(set(tables) & cached)),
            epoch,
        )

    def writing(self, ts: int, rows: Iterable[RowKey], tables: Iterable[str] = ()) -> None:
        """Registers writes of transaction ``ts``; call in the step that issued ``ts``:
        ``rows``, and any row of ``tables`` (rows known only once it has read)."""
        cached = self.tables()
        if not cached:
            return
        scope = frozenset(tables) & cached
        if scope:
            self._opaque[ts] = scope
        mine = self._writes.get(ts)
        for row_key in rows:
            if row_key[0] not in cached:
                continue
            if mine is None:
                mine = self._writes[ts] = []
            mine.append(row_key)
            self._pending.setdefault(row_key, set()).add(ts)

    def opaque(self, ts: int) -> None:
        """Transaction ``ts`` may write any row, known only later."""
        self._opaque[ts] = None

    # ------------------------------------------------------------------ other members

    def remote(self, notice: Notice) -> None:
        """Another member's transactions ``notice.first..last`` write these; call in the
        step the notice arrives, before any timestamp granted after it is used here."""
        self._remote.append(notice)
        if notice.everything or notice.tables:
            self._opaque[notice.first] = None if notice.everything else frozenset(notice.tables)
        for row_key in notice.rows:
            self._pending.setdefault(row_key, set()).add(notice.first)

    def decided(self, decided: int) -> None:
        """Every transaction at or below ``decided`` is decided, cluster-wide: the notices
        it covers are settled (their rows unknown here, their tables' entries dropped)."""
        if not any(notice.last <= decided for notice in self._remote):
            return
        kept = []
        for notice in self._remote:
            if notice.last > decided:
                kept.append(notice)
                continue
            self._opaque.pop(notice.first, None)
            for row_key in notice.rows:
                pending = self._pending.get(row_key)
                if pending is not None:
                    pending.discard(notice.first)
                    if not pending:
                        del self._pending[row_key]
                self._install(row_key, UNKNOWN, notice.last + 1)
            if notice.everything or notice.tables:
                # Entries are dropped whatever their age, so the floor rises above the newest
                # of them, as for an eviction: an entry newer than the notice may be the only
                # record of a later write (a commit's image), and a slow read from before
                # that write (a warm-up's snapshot) must not come back in its place.
                scope = None if notice.everything else set(notice.tables)
                self.floor = max(self.floor, notice.last)
                for row_key in [k for k in self._entries if scope is None or k[0] in scope]:
                    entry = self._entries[row_key]
                    self._drop(row_key, entry)
                    self.floor = max(self.floor, entry[1])
        self._remote = kept

    def start_over(self, issued: int) -> None:
        """Notices may have been lost (a new clock stream): forget every entry; nothing
        visible at or below ``issued`` (everything granted before) comes back."""
        self._entries.clear()
        self.bytes = 0
        self.floor = max(self.floor, issued)

    def committed(self, ts: int, images: Iterable[Image]) -> None:
        """Installs what ``ts`` wrote; call once its commit is logged, before any LTM hears."""
        rows = self._settle(ts)
        if rows:
            after = {(image.table, image.key): image.after or None for image in images}
            for row_key in rows:
                self._install(row_key, after.get(row_key, UNKNOWN), ts + 1)

    def aborted(self, ts: int) -> None:
        self._settle(ts)

    def unknown(self, ts: int) -> None:
        """The outcome of ``ts`` is unknown (its commit record may or may not be durable)."""
        for row_key in self._settle(ts):
            self._install(row_key, UNKNOWN, ts + 1)

    def _settle(self, ts: int) -> list[RowKey]:
        self._opaque.pop(ts, None)
        rows = self._writes.pop(ts, [])
        for row_key in rows:
            pending = self._pending.get(row_key)
            if pending is not None:
                pending.discard(ts)
                if not pending:
                    del self._pending[row_key]
        return rows

    # ------------------------------------------------------------------ readers

    def lookup(self, row_key: RowKey, ts: int) -> tuple[bool, bytes | None]:
        """(True, encoded row or None) when the state of the key before transaction ``ts`` is known
        here; (False, None) when the LTM must be asked."""
        entry = self._entries.get(row_key)
        if (
            entry is None
            or entry[0] is UNKNOWN
            or entry[1] > ts
            or any(t < ts and (s is None or row_key[0] in s) for t, s in self._opaque.items())
            or any(t < ts for t in self._pending.get(row_key, ()))
        ):
            self.misses += 1
            return False, None
        self._entries.move_to_end(row_key)
        self.hits += 1
        return True, entry[0]  # type: ignore[return-value]

    def offer(self, row_key: RowKey, row: bytes | None, ts: int) -> None:
        """What transaction ``ts`` read from the LTM: the state before ``ts`` (a snapshot
        read at ``s`` is the state before ``s + 1``)."""
        if row_key[0] in self.tables():
            self._install(row_key, row, ts)

    def _install(self, row_key: RowKey, row: object, visible_from: int) -> None:
        entry = self._entries.get(row_key)
        if entry is not None and entry[1] >= visible_from:
            return  # what the cache holds is at least as new (and the only record of it)
        if entry is not None:
            self._drop(row_key, entry)
        if visible_from <= self.floor:
            # Too old to trust; the older entry went too (this may be a write after it), and
            # the floor keeps anything at or below this from being installed again.
            return
        self._entries[row_key] = (row, visible_from)
        self.bytes += _size(row_key, row)
        while len(self._entries) > self.max_rows or self.bytes > self.max_bytes:
            evicted_key, evicted = next(iter(self._entries.items()))
            self._drop(evicted_key, evicted)
            self.floor = max(self.floor, evicted[1])

    def _drop(self, row_key: RowKey, entry: tuple[object, int]) -> None:
        del self._entries[row_key]
        self.bytes -= _size(row_key, entry[0])


def _size(row_key: RowKey, row: object) -> int:
    return len(row_key[1]) + (len(row) if isinstance(row, bytes) else 0) + ENTRY_OVERHEAD
