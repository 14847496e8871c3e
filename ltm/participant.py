"""The local transaction manager's logic, free of gRPC so tests can drive it directly.

A participant owns the rows whose partition (``aggview.partition_map``) is its index. It keeps
the rows it has touched in memory (loaded lazily from the store, clean ones evicted when the
cache is full), runs sub-transactions in timestamp order (``ltm.rows``), makes every PREPARED
record durable before it votes yes, and checkpoints committed rows to the store so the log
stays short. On start it replays the log over the store; a transaction still undecided there
is kept prepared until the coordinator tells its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggview import errors, failpoints
from aggview.merge import combine
from aggview.partition_map import CHANGES_ID, is_partials, partition_of
from aggview.rowcodec import (
    decode_json,
    decode_row,
    decode_stored,
    encode_json,
    encode_row,
    encode_stored,
)
from aggview.wal import WriteAheadLog
from aggview.wire import ltm_pb2 as pb
from ltm.rows import Row, RowCache, RowState
from ltm.store.base import Store
from ltm.store.ownership import Ownership, Superseded, write_fenced

log = logging.getLogger(__name__)

RowId = tuple[str, bytes]  # (store table id, encoded key)
Outcome = pb.Vote.Outcome

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


class VoteNo(Exception):
    """A sub-transaction cannot commit; carries the vote's outcome and the row it is about."""

    def __init__(self, outcome: int, message: str, row: RowId | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.row = row


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


class Participant:
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
    ) -> None:
        """``wal_observe``: called with each flush's seconds by its log (metrics)."""
        self.store = store
        # Checkpoints are written under this ownership's fence: once a newer epoch owns the
        # partition, the store refuses them, and this copy stops serving.
        self.ownership = ownership
        self.fenced: str | None = None
        self.settings = settings or Settings()
        self.wal = WriteAheadLog(log_dir, fsync=fsync, observe=wal_observe)
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
        # one-phase commits whose record is logged and whose changes wait for its flush
        self._committing: set[int] = set()
        self.scans_running = 0
        # Key ranges read by read/write transactions: (start, stop or None, ts) per table. An
        # older transaction may not write a key into such a range (no phantoms).
        self.range_reads: dict[str, list[tuple[bytes, bytes | None, int]]] = {}
        self.checkpoints = 0
        self._background: list[asyncio.Task[None]] = []
        self._checkpoint_lock = asyncio.Lock()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.recover()
        loop = asyncio.get_running_loop()
        self._background = [
            loop.create_task(self._checkpoint_loop()),
            loop.create_task(self._outcome_loop()),
        ]

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if not self.fenced:
            await self.checkpoint()
        await self.wal.close()

    async def recover(self) -> None:
        """Replays the log over the store. A committed change is applied to a row only if its
        log sequence number is above the one the stored copy carries, so nothing is applied
        twice (view deltas are not idempotent); PREPARED transactions without a decision stay
        prepared (rows held, deltas pending) until the coordinator tells their outcome."""
        effects: list[tuple[int, int, RowId, bool, Row | None]] = []  # lsn, ts, row, merge?, data
        undecided: dict[int, Prepared] = {}
        unsettled: set[RowId] = set()  # rows with deltas of transactions aborted
        for record in self.wal.replay():
            kind, ts = record["kind"], record["ts"]
            if kind == "prepared":
                tx = undecided.setdefault(ts, Prepared(ts))
                tx.after.update(record["after"])
                tx.merges.update(record.get("merges", {}))
            elif kind == "commit":
                tx = undecided.pop(ts, None)
                if tx is not None:
                    lsn = record["lsn"]
                    effects += [(lsn, ts, r, False, after) for r, after in tx.after.items()]
                    effects += [(lsn, ts, r, True, delta) for r, delta in tx.merges.items()]
            elif kind == "abort":
                tx = undecided.pop(ts, None)
                if tx is not None:  # a partial sum stored while its delta was pending settles
                    unsettled.update(tx.merges)
            elif kind == "drop":
                self.dropped.add(record["table"])
        effects = [e for e in effects if e[2][0] not in self.dropped]
        held = {r for tx in undecided.values() for r in (*tx.after, *tx.merges)}
        unsettled = {r for r in unsettled if r[0] not in self.dropped}
        await self._load({e[2] for e in effects} | held | unsettled)
        # Deltas replayed later or undecided count as pending while earlier ones replay, as
        # they did when those committed (see RowState.settle).
        for ts, tx in undecided.items():
            for row_id, delta in tx.merges.items():
                self.rows[row_id].merges[ts] = delta
        for lsn, ts, row_id, is_merge, data in effects:
            if is_merge and lsn > self.rows[row_id].lsn:
                self.rows[row_id].merges[ts] = data or {}
        applied = 0
        for lsn, ts, row_id, is_merge, data in effects:
            state = self.rows[row_id]
            if lsn <= state.lsn:
                continue  # the stored copy has it already
            applied += 1
            self.touched.add(row_id)
            if is_merge:
                state.commit_merge(ts, data or {}, ts, lsn)
            else:
                state.commit(ts, data, ts, lsn)
        for row_id in unsettled:
            if self.rows[row_id].settle():
                self.rows[row_id].dirty = True
                self.touched.add(row_id)
        for ts, tx in sorted(undecided.items()):
            for row_id in tx.after:
                state = self.rows[row_id]
                tx.before[row_id] = state.current
                state.holder = ts
            self.prepared[ts] = tx
        if effects or undecided:
            log.info(
                "recovered: %d changes replayed, %d undecided transactions",
                applied,
                len(undecided),
            )

    # ----------------------------------------------------------------- prepare / decide

    def observe(self, low_watermark: int, issued: int) -> None:
        """Takes in what the coordinator piggybacks on every batch.

        After a restart this LTM has forgotten which rows read/write transactions read (rts),
        so every transaction issued before its first contact with the coordinator is treated
        as too late on every row: aborted and retried by the client, never misordered."""
        if low_watermark > self.low_watermark:
            self.low_watermark = low_watermark
            for table, reads in list(self.range_reads.items()):
                # every transaction still to write is younger than the watermark
                kept = [r for r in reads if r[2] > low_watermark]
                if kept:
                    self.range_reads[table] = kept
                else:
                    del self.range_reads[table]
        if not self.contacted and issued:
            self.contacted = True
            self.evicted_floor = max(self.evicted_floor, issued)
            for state in self.rows.values():  # loaded before (by recovery, by reads)
                state.rts = max(state.rts, issued)

    async def prepare(self, sub: pb.SubTransaction, *, durable: bool = True) -> pb.Vote:
        """Runs one sub-transaction up to its vote; a yes vote is durable before it is sent,
        unless ``durable`` is False: a coordinator in this very process then makes it durable
        with the commit record (one-phase commit: seen only once on disk) or by
        ``flush_prepared`` before its decision.

        Ordinary operations take their rows in timestamp order; view deltas (MERGE) only
        register as pending. A row of a table with asynchronous views also gets its change
        row (before and after image) appended in the same transaction, on this LTM."""
        self._check_serving()
        ts = sub.ts
        tx = self.prepared.get(ts) or Prepared(ts, segment=self.wal.segment)
        taken: dict[RowId, None] = {}  # insertion-ordered set
        pinned: list[RowState] = []
        ops = [(op, (op.table, op.key)) for op in sub.ops if op.kind != pb.RowOp.MERGE]
        merges = [((op.table, op.key), op.values) for op in sub.ops if op.kind == pb.RowOp.MERGE]
        suffix = ts.to_bytes(8, "big")
        captured = {
            (changes, row_id[1] + suffix): row_id
            for op, row_id in ops
            for changes in op.changes_tables
        }
        exclusive = list(dict.fromkeys([r for _, r in ops] + list(captured)))
        backfills = {r for op, r in ops if op.kind == pb.RowOp.BACKFILL}
        superseded: set[RowId] = set()
        try:
            deltas = [(row_id, self._delta(row_id, values)) for row_id, values in merges]
            for row_id in exclusive + [r for r, _ in merges]:
                self._check_owned(row_id)
            for change_id in captured:  # its key holds this ts: new, never in the store
                if change_id not in self.rows:
                    self.rows[change_id] = RowState(versions=[(0, None)], rts=self.evicted_floor)
            pinned = await self._pin(exclusive + [r for r, _ in merges])
            for row_id in exclusive:
                if row_id in tx.after or row_id in taken:
                    continue
                if self._in_younger_range_read(row_id, ts) or not await self._acquire(row_id, ts):
                    if row_id in backfills:
                        superseded.add(row_id)
                        continue
                    raise VoteNo(Outcome.TOO_LATE, "a younger transaction got there first", row_id)
                taken[row_id] = None
                tx.before[row_id] = self.rows[row_id].current
            after: dict[RowId, Row | None] = {}  # this round's rows (a bulk load has many)
            for op, row_id in ops:
                if row_id in superseded:
                    continue
                before = tx.before[row_id]
                current = after[row_id] if row_id in after else tx.after.get(row_id, before)
                after[row_id] = _apply(op, before, current, row_id)
            for change_id, row_id in captured.items():
                after[change_id] = {"b": tx.before[row_id], "a": after[row_id]}
        except VoteNo as no:
            self._release(tx, taken)
            if no.outcome == Outcome.CONDITION_FAILED:
                for _, row_id in ops:  # the condition read the row at ts
                    state = self.rows[row_id]
                    state.rts = max(state.rts, ts)
            table, key = no.row or ("", b"")
            return pb.Vote(ts=ts, outcome=no.outcome, message=str(no), table=table, key=key)
        except BaseException:  # store failure, cancellation: never leave a row held
            self._release(tx, taken)
            raise
        finally:
            self._unpin(pinned)
        changed = {row_id: after[row_id] for row_id in exclusive if row_id not in superseded}
        await self._log_prepared(tx, changed, deltas, durable)
        if failpoints.ARMED:
            failpoints.hit(failpoints.LTM_AFTER_PREPARE_LOGGED)
        vote = pb.Vote(ts=ts, outcome=Outcome.YES)
        if sub.want_images:
            _add_images(vote, tx, [r for _, r in ops if r not in superseded])
        return vote

    async def _log_prepared(
        self,
        tx: Prepared,
        changed: dict[RowId, Row | None],
        deltas: list[tuple[RowId, Row]],
        durable: bool,
    ) -> None:
        """Takes this round's rows and view deltas into the transaction and logs its
        PREPARED record (flushed now, or by the caller's commit record or flush)."""
        tx.after.update(changed)
        merged: dict[RowId, Row] = {}
        for row_id, delta in deltas:
            merged[row_id] = combine(tx.merges.get(row_id, {}), delta)
            tx.merges[row_id] = merged[row_id]
            self.rows[row_id].merges[tx.ts] = merged[row_id]
        self.prepared[tx.ts] = tx
        if durable:
            tx.lsn = await self.wal.append(tx.record(changed, merged))
            tx.durable = True
        else:
            tx.lsn = self.wal.write(tx.record(changed, merged), flush=False)
            tx.durable = False

    def _release(self, tx: Prepared, taken: dict[RowId, None]) -> None:
        """A refused or failed round gives back the rows it took (earlier rounds keep theirs)."""
        for row_id in taken:
            tx.before.pop(row_id, None)
            self.rows[row_id].release()

    def _in_younger_range_read(self, row_id: RowId, ts: int) -> bool:
        table, key = row_id
        return any(
            read_ts > ts and start <= key and (stop is None or key < stop)
            for start, stop, read_ts in self.range_reads.get(table, ())
        )

    async def _acquire(self, row_id: RowId, ts: int) -> bool:
        now = self.rows[row_id].try_acquire(ts)  # most rows are free: no task, no timer
        if now is not None:
            return now
        try:
            return await asyncio.wait_for(
                self.rows[row_id].acquire(ts), self.settings.lock_wait_timeout
            )
        except asyncio.TimeoutError:
            state = self.rows[row_id]
            if state.holder == ts:  # handed to us just as the wait timed out: give it back
                state.release()
            return False

    async def decide(self, ts: int, commit: bool) -> None:
        """Applies the coordinator's decision. Unknown timestamps are already decided here
        (decisions are retried), so they are acknowledged without effect, but only while
        this copy serves the partition: a fenced one may have forgotten a transaction its
        successor holds prepared, and an acknowledgment from it would let the coordinator
        forget a commit the successor still has to apply."""
        self._check_serving()
        tx = self.prepared.get(ts)
        if tx is None:
            return
        if commit and not tx.durable:
            # One-phase commit (one participant, in the coordinator's process): no decision
            # record exists anywhere else, so this commit record is the decision, and what the
            # transaction wrote must not be seen before it is on disk: a crash in between
            # takes the transaction back, after another member's transaction read it (a
            # lookup, cached there) and built on it. Its rows stay held and its view deltas
            # pending meanwhile.
            lsn = self.wal.write({"kind": "commit", "ts": ts})
            self._committing.add(ts)  # logged at ``lsn``, applied only after the flush
            try:
                await self.wal.flush()
            finally:  # a failed flush: applied anyway, as before (its outcome is unknown)
                self._committing.discard(ts)
                if self.prepared.pop(ts, None) is tx:
                    self._apply_commit(ts, tx, lsn)
            if failpoints.ARMED:
                failpoints.hit(failpoints.LTM_AFTER_COMMIT_APPLIED)
            return
        del self.prepared[ts]
        if not commit:
            for row_id in tx.after:
                self.rows[row_id].release()
            for row_id in tx.merges:
                self.rows[row_id].drop_merge(ts)
                self.touched.add(row_id)  # dropping a delta can settle a partial sum
            self.wal.write({"kind": "abort", "ts": ts}, flush=False)  # presumed abort
            return
        self._apply_commit(ts, tx, self.wal.write({"kind": "commit", "ts": ts}))
        await self.wal.flush()
        if failpoints.ARMED:
            failpoints.hit(failpoints.LTM_AFTER_COMMIT_APPLIED)

    async def flush_prepared(self) -> None:
        """Every prepare record so far is on disk (a coordinator in this process, before it
        logs the decision of a transaction with several participants): their commits then
        need no flush before they are seen."""
        upto = self.wal.lsn
        await self.wal.flush()
        for tx in self.prepared.values():
            if tx.lsn <= upto:
                tx.durable = True

    def _apply_commit(self, ts: int, tx: Prepared, lsn: int) -> None:
        for row_id, after in tx.after.items():
            state = self.rows[row_id]
            if row_id[0] not in self.dropped:
                state.commit(ts, after, self.low_watermark, lsn)
            state.release()
        for row_id, delta in tx.merges.items():
            state = self.rows[row_id]
            if row_id[0] in self.dropped:
                state.drop_merge(ts)
                continue
            try:
                state.commit_merge(ts, delta, self.low_watermark, lsn)
            except TypeError as exc:  # only a malformed request makes one (see _delta)
                log.error("view delta of %d does not fit row %r: %s; dropped", ts, row_id, exc)
                state.drop_merge(ts)
        self.commits_since_checkpoint += len(tx.after) + len(tx.merges)
        self.touched.update(tx.after)
        self.touched.update(tx.merges)

    # ----------------------------------------------------------------- reads

    async def read(self, request: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
        """Rows as of ``request.ts``, waiting only for transactions at or below it to land."""
        self._check_serving()
        ts, table = request.ts, request.table
        if request.scan:
            return await self._scan(request)
        row_ids = [(table, key) for key in request.keys]
        for row_id in row_ids:
            self._check_owned(row_id)
        pinned = await self._pin(row_ids)
        try:
            out = []
            for row_id in row_ids:
                row = await self._read_row(row_id, ts, request.register_read)
                if row is not None:
                    out.append((row_id[1], encode_row(row)))
            return out
        finally:
            self._unpin(pinned)

    async def _read_row(self, row_id: RowId, ts: int, register: bool) -> Row | None:
        """``register``: a read of transaction ``ts`` itself (view maintenance), which sees
        the committed state before ``ts`` and keeps older writers off the row."""
        state = self.rows[row_id]
        try:
            if state.blocks(ts, own=register):  # most reads find the row free: no wait task
                await asyncio.wait_for(
                    state.wait_readable(ts, own=register), self.settings.lock_wait_timeout
                )
        except asyncio.TimeoutError:
            raise errors.Unavailable(
                f"row of {row_id[0]} is still held by undecided transaction {state.holder}"
            ) from None
        if register:
            state.rts = max(state.rts, ts)
            return state.version_at(ts - 1)[1]
        return state.version_at(ts)[1]

    async def _scan(self, request: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
        ts, table = request.ts, request.table
        start, stop = request.start or None, request.stop or None
        self.scans_running += 1  # no eviction meanwhile: the store copy we read must stay valid
        try:
            stored, _ = await asyncio.to_thread(self._scan_store, table, start, stop)
            if request.register_read:  # the read must stay remembered (rts) on every row
                self.range_reads.setdefault(table, []).append((start or b"", stop, ts))
                await self._load((table, key) for key, (_, data) in stored.items() if data)
            return await self._merged(
                table, stored, start, stop, ts, request.register_read, request.limit
            )
        finally:
            self.scans_running -= 1

    async def read_page(self, request: pb.ReadRequest) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """About ``limit`` rows of a snapshot scan, for bulk readers that page through a big
        range: the store is read only up to the page's last stored key, so a page costs its
        own size, not the rest of the range. Returns the rows and where the next page starts
        (empty when the range is done)."""
        self._check_serving()
        ts, table = request.ts, request.table
        start, stop = request.start or None, request.stop or None
        self.scans_running += 1
        try:
            stored, last = await asyncio.to_thread(
                self._scan_store, table, start, stop, max(request.limit, 1)
            )
            bound = stop if last is None else last + b"\x00"  # exclusive end of this page
            rows = await self._merged(table, stored, start, bound, ts, False, 0)
            return rows, (bound or b"") if last is not None else b""
        finally:
            self.scans_running -= 1

    async def _merged(
        self,
        table: str,
        stored: dict[bytes, tuple[int, bytes]],
        start: bytes | None,
        stop: bytes | None,
        ts: int,
        register: bool,
        limit: int,
    ) -> list[tuple[bytes, bytes]]:
        """Live rows of [start, stop) at ``ts``: the cached version where a row is in memory,
        the store's copy otherwise, in key order, at most ``limit`` (0: all). A store copy
        newer than ``ts`` fails the read, as a point read of it does (``RowState.version_at``):
        its older version is gone (a restart forgot it; in between, eviction keeps it)."""
        keys = set(stored)
        for key in list(self.rows.keys_of(table)):
            if (start is None or key >= start) and (stop is None or key < stop):
                keys.add(key)
        out: list[tuple[bytes, bytes]] = []
        for key in sorted(keys):
            row_id = (table, key)
            if row_id in self.rows:
                row = await self._read_row(row_id, ts, register)
                data = encode_row(row) if row is not None else b""
            else:
                version, data = stored.get(key, (0, b""))
                if version > ts:
                    raise errors.Unavailable(
                        f"snapshot too old: {table} has a row stored at {version}, newer than "
                        f"the read at {ts}; read again"
                    )
            if data:
                out.append((key, data))
                if limit and len(out) >= limit:
                    break
        return out

    def _scan_store(
        self, table: str, start: bytes | None, stop: bytes | None, limit: int = 0
    ) -> tuple[dict[bytes, tuple[int, bytes]], bytes | None]:
        """Rows of this partition in [start, stop) as stored: each key's version timestamp
        and encoded row (empty: a tombstone), and the last key read when ``limit`` live rows
        were reached before the end (None: the range was read to its end)."""
        out: dict[bytes, tuple[int, bytes]] = {}
        live = 0
        for key, value in self.store.scan(table, start, stop):
            if partition_of(table, key, self.settings.partitions) == self.settings.partition:
                version, row, _ = decode_stored(value)
                out[key] = (version, b"" if row is None else encode_row(row))
                if row is not None:
                    live += 1
                    if limit and live >= limit:
                        return out, key
        return out, None

    # ----------------------------------------------------------------- cache

    def _delta(self, row_id: RowId, values: bytes) -> Row:
        """A view delta that can merge into its row: numbers that add, or multisets of
        numbers, each of the kind the row and the deltas pending on it hold (the coordinator
        never sends another; a member's malformed request is refused, not merged later)."""
        delta = decode_row(values) or {}
        state = self.rows.get(row_id)
        others = [] if state is None else [state.current or {}, *state.merges.values()]
        for name, change in delta.items():
            ok = _number(change) or (
                isinstance(change, dict) and all(_number(n) for n in change.values())
            )
            for other in others:
                if ok and name in other:
                    ok = isinstance(other[name], dict) == isinstance(change, dict) and (
                        isinstance(change, dict) or _number(other[name])
                    )
            if not ok:
                raise VoteNo(Outcome.INVALID, f"malformed view delta for {name}", row_id)
        return delta

    def _check_serving(self) -> None:
        if self.fenced:  # a newer epoch owns the partition: its rows here may be stale
            raise errors.FailedPrecondition(self.fenced)

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
        if missing:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            for table, keys in missing.items():
                for key in keys:
                    self.loading[(table, key)] = future
            try:
                if self.store.fast_point_reads:
                    found = self._get_many(missing)
                else:
                    found = await asyncio.to_thread(self._get_many, missing)
                for table, keys in missing.items():
                    for key in keys:
                        data = found.get((table, key))
                        ts, row, lsn = decode_stored(data) if data else (0, None, 0)
                        # rts and older versions were forgotten on eviction: assume the worst.
                        self.rows[(table, key)] = RowState(
                            versions=[(ts, row)],
                            rts=self.evicted_floor,
                            lsn=lsn,
                            partial=is_partials(table),
                        )
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

    def _get_many(self, missing: dict[str, list[bytes]]) -> dict[RowId, bytes]:
        out: dict[RowId, bytes] = {}
        for table, keys in missing.items():
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

    # ----------------------------------------------------------------- checkpoint

    async def checkpoint(self) -> int:
        """Writes committed rows to the store, then drops the log segments they cover.

        The new log segment starts in the same step as the snapshot of dirty rows is taken,
        so every change in the snapshot is in an older segment or carries an LSN the stored
        row already has. Deleted rows are stored as tombstones that keep their LSN."""
        async with self._checkpoint_lock:
            # A dropped table stays dropped after a restart. Undecided transactions are not
            # copied forward (a bulk load's would be copied whole at every checkpoint): the
            # segments holding their records stay until they are decided.
            carry = [{"kind": "drop", "ts": 0, "table": t} for t in sorted(self.dropped)]
            segment = self.wal.switch(carry)
            keep_from = min((tx.segment for tx in self.prepared.values()), default=segment)
            self.commits_since_checkpoint = 0
            written: list[tuple[RowId, int]] = []
            # (table, key, ts, row, lsn); row versions are never changed in place, so they
            # are encoded off the event loop, which keeps serving meanwhile
            pending: list[tuple[str, bytes, int, Row | None, int]] = []
            touched, self.touched = self.touched, set()
            held_back = False
            for row_id in touched:  # not every cached row: a checkpoint must not stall reads
                state = self.rows.get(row_id)
                if state is None or not state.dirty or row_id[0] in self.dropped:
                    continue
                if not self._committing.isdisjoint(state.merges):
                    # A one-phase commit logged below what this row holds now is not applied
                    # yet: stored at the higher number, the row would make replay skip it. It
                    # waits for the next checkpoint, and so do the segments its changes are in.
                    self.touched.add(row_id)
                    held_back = True
                    continue
                ts, row = state.versions[-1]
                # A deleted row leaves a tombstone with its LSN, so no log record it already
                # holds is replayed over it. Drained change rows are removed instead: they
                # would pile up with every change ever made, and segments are dropped in
                # order (see WriteAheadLog.drop_before), so no older record comes back.
                pending.append((row_id[0], row_id[1], ts, row, state.lsn))
                written.append((row_id, state.lsn))
            try:
                await self.wal.flush()
                if pending:
                    await asyncio.to_thread(self._write_checkpoint, pending)
                    if failpoints.ARMED:
                        failpoints.hit(failpoints.LTM_MID_CHECKPOINT)
            except BaseException:
                self.touched |= touched  # still dirty: the next checkpoint tries again
                raise
            for row_id, lsn in written:
                state = self.rows.get(row_id)
                if state is not None and state.lsn == lsn:
                    state.dirty = False
                elif state is not None:
                    self.touched.add(row_id)
            if not held_back:
                self.wal.drop_before(min(segment, keep_from))
            self.checkpoints += 1
            self._forget_drained_changes(written)
            self._maybe_evict()
            return len(pending)

    def _write_checkpoint(self, pending: list[tuple[str, bytes, int, Row | None, int]]) -> None:
        mutations: list[tuple[str, bytes, bytes | None]] = []
        for table, key, ts, row, lsn in pending:
            if row is None and CHANGES_ID.match(table):
                mutations.append((table, key, None))
            else:
                mutations.append((table, key, encode_stored(ts, row, lsn)))
        if self.ownership is None:
            self.store.write(mutations)
            return
        try:
            self.ownership = write_fenced(self.store, self.ownership, mutations)
        except Superseded as exc:
            self.fenced = str(exc)
            raise

    def _forget_drained_changes(self, written: list[tuple[RowId, int]]) -> None:
        """Change rows that a refresh deleted and the store no longer has need no memory:
        nobody writes a change key twice, and refreshes read below every undecided writer.
        Not while a scan runs: it may hold the store's older copy of such a row."""
        if self.scans_running:
            return
        for row_id, _ in written:
            if not CHANGES_ID.match(row_id[0]):
                continue
            state = self.rows.get(row_id)
            if state is not None and state.current is None and not (state.dirty or state.busy()):
                del self.rows[row_id]

    def dirty_rows(self) -> int:
        return sum(1 for state in self.rows.values() if state.dirty)

    async def _checkpoint_loop(self) -> None:
        """Checkpoints every interval, or sooner when dirty rows or the cache run over."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(0.1, self.settings.checkpoint_interval))
            due = time.monotonic() - last >= self.settings.checkpoint_interval
            if not due and len(self.rows) > self.settings.cache_rows * 1.25:
                due = True
            if not due and self.commits_since_checkpoint > self.settings.checkpoint_dirty_rows:
                due = True
            if not due:
                continue
            last = time.monotonic()
            try:
                await self.checkpoint()
            except Superseded as exc:
                log.warning("partition %d fenced off: %s", self.settings.partition, exc)
                return
            except Exception:
                log.exception("checkpoint failed; the log keeps everything, retrying later")

    async def drop_table(self, table_id: str) -> None:
        self.dropped.add(table_id)
        await self.wal.append({"kind": "drop", "ts": 0, "table": table_id})
        for row_id in [r for r, s in self.rows.items() if r[0] == table_id and not s.busy()]:
            del self.rows[row_id]

    # ----------------------------------------------------------------- recovery queries

    async def _outcome_loop(self) -> None:
        """Asks the coordinator about transactions prepared here for too long: it may have
        crashed, or its decision may not have reached us."""
        while True:
            await asyncio.sleep(self.settings.outcome_query_after / 2)
            if self.outcome_query is None:
                continue
            now = time.monotonic()
            stale = [
                ts
                for ts, tx in self.prepared.items()
                if now - tx.since > self.settings.outcome_query_after
            ]
            if not stale:
                continue
            try:
                outcomes = await self.outcome_query(stale)
            except Exception as exc:  # coordinator down: ask again later
                log.info("outcome query failed: %s", exc)
                continue
            for ts, outcome in zip(stale, outcomes, strict=True):
                if outcome is not None:
                    try:
                        await self.decide(ts, outcome)
                    except Exception:
                        log.exception("applying the outcome of %d failed; asking again", ts)


def _infinite(value: Any) -> bool:
    """A FLOAT sum past 1.8e308: JSON (and SQL) have no infinity."""
    return isinstance(value, float) and not math.isfinite(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _apply(op: pb.RowOp, before: Row | None, current: Row | None, row_id: RowId) -> Row | None:
    """One operation on a row; conditions see the row as it was before the transaction."""
    if op.require:
        _check_conditions(decode_json(op.require), before, row_id)
    kind = op.kind
    if kind in (pb.RowOp.PUT, pb.RowOp.BACKFILL):
        return decode_row(op.values)
    if kind == pb.RowOp.INSERT:
        if current is not None:
            raise VoteNo(Outcome.ALREADY_EXISTS, "a row with this key already exists", row_id)
        return decode_row(op.values)
    if current is None:
        raise VoteNo(Outcome.NOT_FOUND, "no row with this key", row_id)
    if kind == pb.RowOp.DELETE:
        return None
    changes = decode_row(op.values) or {}
    if kind == pb.RowOp.UPDATE:
        return {**current, **changes}
    if kind == pb.RowOp.ADD:
        limits = decode_json(op.limits) or {}
        if not isinstance(limits, dict):
            raise VoteNo(Outcome.INVALID, "malformed limits: a JSON object expected", row_id)
        row = dict(current)
        for column, delta in changes.items():
            value = row.get(column)
            if value is None:
                raise VoteNo(Outcome.INVALID, f"cannot add to column {column}: it is NULL", row_id)
            try:
                value += delta
            except TypeError:
                raise VoteNo(
                    Outcome.INVALID, f"cannot add {delta!r} to column {column}", row_id
                ) from None
            limit = limits.get(column)
            try:
                over = (limit is not None and abs(value) >= limit) or _infinite(value)
            except TypeError:
                raise VoteNo(Outcome.INVALID, f"cannot add to column {column}", row_id) from None
            if over:
                raise VoteNo(Outcome.INVALID, f"adding to column {column} overflows it", row_id)
            row[column] = value
        return row
    raise VoteNo(Outcome.INVALID, f"unknown operation kind {kind}", row_id)


def _check_conditions(
    conditions: Sequence[Sequence[Any]], before: Row | None, row_id: RowId
) -> None:
    if not isinstance(conditions, list) or not all(
        isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], str)
        for c in conditions
    ):
        raise VoteNo(Outcome.INVALID, "malformed conditions: [column, op, value] lists", row_id)
    if before is None:
        raise VoteNo(Outcome.CONDITION_FAILED, "the row does not exist", row_id)
    for column, op, value in conditions:
        actual = before.get(column)
        compare = _COMPARE.get(op)
        if compare is None:
            raise VoteNo(Outcome.INVALID, f"unknown comparison {op!r}", row_id)
        try:
            holds = actual is not None and value is not None and compare(actual, value)
        except TypeError:
            raise VoteNo(
                Outcome.INVALID, f"cannot compare column {column} with {value!r}", row_id
            ) from None
        if not holds:
            # structured, so the coordinator can show the values as the user typed them
            detail = encode_json([column, op, value, actual]).decode()
            raise VoteNo(Outcome.CONDITION_FAILED, detail, row_id)


def _add_images(vote: pb.Vote, tx: Prepared, row_ids: list[RowId]) -> None:
    """Each written row's image before and after the transaction, for view maintenance."""
    for table, key in dict.fromkeys(row_ids):
        vote.images.add(
            table=table,
            key=key,
            before=encode_row(tx.before[(table, key)]),
            after=encode_row(tx.after[(table, key)]),
        )
