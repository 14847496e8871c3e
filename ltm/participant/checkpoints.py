"""Checkpoints: committed rows written to the store so the log stays short, and dropped
tables."""

from __future__ import annotations

import asyncio
import logging
import time

from aggview import failpoints
from aggview.loops import in_thread_to_the_end
from aggview.partition_map import CHANGES_ID
from aggview.rowcodec import encode_stored
from ltm.participant.operations import RowId
from ltm.participant.state import PartitionState
from ltm.rows import Row
from ltm.store import ownership
from ltm.store.ownership import Superseded, lsn_floor_mutation, write_fenced

log = logging.getLogger("ltm.participant")  # the participant's log, as before the split


class Checkpoints(PartitionState):
    """A participant's checkpoints (a part of ``Participant``)."""

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
            upto = self.wal.lsn  # every change in the snapshot is logged at or below it
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
                if self._committing and self._logged_below(state.merges, state.lsn):
                    # A commit logged below what this row holds now is not applied yet:
                    # stored at the higher number, the row would make replay skip it. It
                    # waits for the next checkpoint, and so do the segments its changes are
                    # in. (One logged above is replayed over the stored row: no wait. In one
                    # process commits apply in the order of their records, so none waits.)
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
                    # not left running when cancelled (a stop cancels the checkpoint loop):
                    # the next checkpoint's newer rows would be overwritten when it lands
                    await in_thread_to_the_end(self._write_checkpoint, pending, upto)
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

    def _logged_below(self, pending: dict[int, Row], lsn: int) -> bool:
        """Whether a delta in ``pending`` is of a commit logged (or about to be) at or below
        ``lsn`` and not applied yet."""
        committing = self._committing
        return any(committing.get(ts, lsn + 1) <= lsn for ts in pending)

    def _write_checkpoint(
        self, pending: list[tuple[str, bytes, int, Row | None, int]], upto: int
    ) -> None:
        """Stores the rows, and ``upto`` as the partition's LSN floor (``lsn_floor``)."""
        mutations: list[tuple[str, bytes, bytes | None]] = []
        for table, key, ts, row, lsn in pending:
            if row is None and CHANGES_ID.match(table):
                mutations.append((table, key, None))
            else:
                mutations.append((table, key, encode_stored(ts, row, lsn)))
        mutations.append(lsn_floor_mutation(self.settings.partition, upto))
        if not self._floor_table:
            self.store.create_table(ownership.TABLE)  # a no-op once it exists
            self._floor_table = True
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
        """Returns once no checkpoint can write the table's rows any more: the caller drops
        the store's table next, and a checkpoint still writing would fail on it."""
        self.dropped.add(table_id)
        async with self._checkpoint_lock:
            pass  # a running checkpoint took its rows before the drop; later ones skip them
        await self.wal.append({"kind": "drop", "ts": 0, "table": table_id})
        for row_id in [r for r, s in self.rows.items() if r[0] == table_id and not s.busy()]:
            del self.rows[row_id]
