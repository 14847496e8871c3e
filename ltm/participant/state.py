"""What a participant's parts share: its settings, a prepared transaction, a refused vote,
and the rows of its partition in memory (loaded from the store, pinned, evicted)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.member_log import LogWriter
from aggview.partition_map import index_base, indexed_row, is_partials, partition_of
from aggview.rowcodec import decode_stored
from aggview.wal import WriteAheadLog
from ltm.participant.operations import Outcome, RowId, VoteNo
from ltm.rows import Row, RowCache, RowState
from ltm.store.base import Store
from ltm.store.ownership import Ownership


@dataclass
class Prepared:
    ts: int
    after: dict[RowId, Row | None] = field(default_factory=dict)  # rows held exclusively
    before: dict[RowId, Row | None] = field(default_factory=dict)
    merges: dict[RowId, Row] = field(default_factory=dict)  # view deltas (not held)
    since: float = field(default_factory=time.monotonic)
    segment: int = 0  # the log segment of its first record (0: unknown, e.g. recovered)
    # Whether its prepare records are known to be on disk: not after ``prepare(durable=False)``
    # until ``flush_prepared``; ``lsn``, its last prepare record's.
    durable: bool = True
    lsn: int = 0

    def record(self, after: dict[RowId, Row | None], merges: dict[RowId, Row]) -> dict[str, Any]:
        return {"kind": "prepared", "ts": self.ts, "after": after, "merges": merges}


@dataclass
class Settings:
    partition: int = 0
    partitions: int = 1
    cache_rows: int = 1_000_000
    checkpoint_interval: float = 2.0
    checkpoint_dirty_rows: int = 50_000
    lock_wait_timeout: float = 5.0
    outcome_query_after: float = 1.0


OutcomeQuery = Callable[[list[int]], Awaitable[list[bool | None]]]  # None: still undecided


class PartitionState:
    """The state of one partition's participant that its parts share (``Participant`` is
    built of them: ``Recovery``, ``Prepares``, ``Decisions``, ``Reads``, ``Checkpoints``), and
    the rows in memory they all reach through."""

    def __init__(
        self,
        store: Store,
        log_dir: Path,
        settings: Settings | None = None,
        *,
        fsync: bool = True,
        outcome_query: OutcomeQuery | None = None,
        ownership: Ownership | None = None,
        wal_observe: Callable[[float], None] | None = None,
        log: LogWriter | None = None,
    ) -> None:
        """``wal_observe``: called with each flush's seconds by its log (metrics); ``log``:
        the member's shared log to write to instead of one of its own in ``log_dir``."""
        self.store = store
        # Checkpoints are written under this ownership's fence: once a newer epoch owns the
        # partition, the store refuses them, and this copy stops serving.
        self.ownership = ownership
        self.fenced: str | None = None
        self.settings = settings or Settings()
        self.wal: WriteAheadLog | LogWriter = log or WriteAheadLog(
            log_dir, fsync=fsync, observe=wal_observe
        )
        self.outcome_query = outcome_query
        self.rows = RowCache()
        self.loading: dict[RowId, asyncio.Future[None]] = {}
        self.prepared: dict[int, Prepared] = {}
        self.dropped: set[str] = set()
        self.low_watermark = 0
        self.evicted_floor = 0  # youngest timestamp forgotten by eviction (see _load)
        self.contacted = False
        self.commits_since_checkpoint = 0
        self.touched: set[RowId] = set()  # rows changed since the last checkpoint's snapshot
        # commits whose record is logged and whose changes wait for its flush (one-phase, or
        # in the decision's record): ts -> the record's LSN
        self._committing: dict[int, int] = {}
        self.scans_running = 0
        # Key ranges read by read/write transactions: (start, stop or None, ts) per table. An
        # older transaction may not write a key into such a range (no phantoms).
        self.range_reads: dict[str, list[tuple[bytes, bytes | None, int]]] = {}
        self.checkpoints = 0
        self._floor_table = False  # whether the table of LSN floors is known to exist
        self._background: list[asyncio.Task[None]] = []
        self._checkpoint_lock = asyncio.Lock()

    def _check_serving(self) -> None:
        if self.fenced:  # a newer epoch owns the partition: its rows here may be stale
            raise errors.NotServed(self.fenced)

    def _check_owned(self, row_id: RowId) -> None:
        if row_id[0] in self.dropped:
            raise VoteNo(Outcome.INVALID, f"table id {row_id[0]} was dropped", row_id)
        owner = partition_of(row_id[0], row_id[1], self.settings.partitions)
        if owner != self.settings.partition:
            raise VoteNo(
                Outcome.INVALID,
                f"row belongs to partition {owner}, not {self.settings.partition}",
                row_id,
            )

    async def _pin(self, row_ids: Iterable[RowId]) -> list[RowState]:
        """Loads rows and keeps them in memory until :meth:`_unpin`: a checkpoint may evict
        clean rows while a request that loaded them waits for another row."""
        wanted = list(dict.fromkeys(row_ids))
        while True:
            await self._load(wanted)
            if all(row_id in self.rows for row_id in wanted):  # none evicted meanwhile
                break
        states = [self.rows[row_id] for row_id in wanted]
        for state in states:
            state.pins += 1
        return states

    @staticmethod
    def _unpin(states: list[RowState]) -> None:
        for state in states:
            state.pins -= 1

    async def _load(self, row_ids: Iterable[RowId]) -> None:
        """Brings rows into memory from the store, once each even under concurrent callers."""
        wanted: dict[str, dict[bytes, None]] = {}  # ordered sets: a bulk load asks for many
        waits = []
        for row_id in row_ids:
            if row_id in self.rows:
                continue
            if row_id in self.loading:
                waits.append(self.loading[row_id])
                continue
            wanted.setdefault(row_id[0], {})[row_id[1]] = None
        missing = {table: list(keys) for table, keys in wanted.items()}
        if missing and self._all_new(missing):  # nothing to read: no store call, no thread
            self._install(missing, {})
        elif missing and self.store.fast_point_reads:  # read now: nobody else runs meanwhile
            self._install_read(missing, self._read_missing(missing))
        elif missing:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            for table, keys in missing.items():
                for key in keys:
                    self.loading[(table, key)] = future
            try:
                read = await asyncio.to_thread(self._read_missing, missing)
                self._install_read(missing, read)
                future.set_result(None)
            except BaseException as exc:
                future.set_exception(exc)
                future.exception()  # mark retrieved; waiters re-raise it
                raise
            finally:
                for table, keys in missing.items():
                    for key in keys:
                        self.loading.pop((table, key), None)
        for wait in waits:
            await wait

    def _all_new(self, missing: dict[str, list[bytes]]) -> bool:
        """Whether every key in ``missing`` is above what its store table may hold."""
        new = self.rows.new
        return all(new(table, min(keys)) for table, keys in missing.items())

    def _install_read(
        self, missing: dict[str, list[bytes]], read: tuple[dict[RowId, bytes], dict[str, bytes]]
    ) -> None:
        """:meth:`_install` what :meth:`_read_missing` read, and take in the greatest keys it
        learned (``RowCache.learned``)."""
        found, learned = read
        for table, stored in learned.items():
            self.rows.learned(table, stored)
        self._install(missing, found)

    def _install(self, missing: dict[str, list[bytes]], found: dict[RowId, bytes]) -> None:
        """The states of rows read from the store (``found``: those it has)."""
        for table, keys in missing.items():
            partial = is_partials(table)
            for key in keys:
                data = found.get((table, key))
                ts, row, lsn = decode_stored(data) if data else (0, None, 0)
                # rts and older versions were forgotten on eviction: assume the worst.
                self.rows[(table, key)] = RowState(
                    versions=[(ts, row)], rts=self.evicted_floor, lsn=lsn, partial=partial
                )

    def _read_missing(
        self, missing: dict[str, list[bytes]]
    ) -> tuple[dict[RowId, bytes], dict[str, bytes]]:
        """The stored data of rows not in memory, and the greatest key of each table read
        for the first time (for :meth:`_install`, on the loop). A key above its table's
        greatest is not asked for, nor is an index entry whose base row is read along and
        has never been stored: entries are written and erased with their base rows, so a
        new row's entries are new too (an insert under a sync view reads its row alone, not
        also the entry its view's index adds)."""
        new = self.rows.new
        learn = [table for table in missing if table not in self.rows.greatest]
        entries = self._entries_of_loading(missing)
        asked = {
            table: [k for k in keys if (table, k) not in entries and not new(table, k)]
            for table, keys in missing.items()
        }
        found = self._get_many(asked)
        if entries:
            later: dict[str, list[bytes]] = {}
            for (table, key), base in entries.items():
                if base in found:  # the base row was stored once: its entries may be too
                    later.setdefault(table, []).append(key)
            if later:
                found.update(self._get_many(later))
        return found, {table: self._stored_greatest(table) for table in learn}

    def _stored_greatest(self, table: str) -> bytes:
        try:
            return self.store.last_key(table) or b""
        except errors.UnknownTable:
            return b""  # a table created but never checkpointed into is empty

    @staticmethod
    def _entries_of_loading(missing: dict[str, list[bytes]]) -> dict[RowId, RowId]:
        """Index entries in ``missing`` whose base row is in it too, with that row."""
        entries: dict[RowId, RowId] = {}
        for table, keys in missing.items():
            base_table = index_base(table)
            if base_table is None or base_table not in missing:
                continue
            loading = set(missing[base_table])
            for key in keys:
                base = indexed_row(table, key)
                if base is not None and base[1] in loading:
                    entries[(table, key)] = base
        return entries

    def _get_many(self, missing: dict[str, list[bytes]]) -> dict[RowId, bytes]:
        out: dict[RowId, bytes] = {}
        for table, keys in missing.items():
            if not keys:
                continue
            try:
                found = self.store.get_many(table, keys)
            except errors.UnknownTable:
                found = {}  # a table created but never checkpointed into is empty
            for key, value in found.items():
                out[(table, key)] = value
        return out

    def _maybe_evict(self) -> None:
        excess = len(self.rows) - self.settings.cache_rows
        if excess <= 0 or self.scans_running:
            return
        victims = []
        for row_id, state in self.rows.items():
            if not (state.dirty or state.busy()) and state.last_ts <= self.low_watermark:
                victims.append(row_id)
                if len(victims) >= excess:
                    break
        for row_id in victims:
            state = self.rows.pop(row_id)
            self.evicted_floor = max(self.evicted_floor, state.rts, state.last_ts)
