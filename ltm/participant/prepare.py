"""The prepare path: rows taken in timestamp order, operations applied, the PREPARED record
logged before the vote."""

from __future__ import annotations

import asyncio

from aggview import failpoints
from aggview.merge import combine
from aggview.rowcodec import decode_row, encode_row
from aggview.wire import ltm_pb2 as pb
from ltm.participant.operations import LocalSub, Outcome, RowId, VoteNo, apply_op, is_number
from ltm.participant.state import PartitionState, Prepared
from ltm.rows import Row, RowState

_MERGE, _BACKFILL = pb.RowOp.MERGE, pb.RowOp.BACKFILL


class Prepares(PartitionState):
    """A participant's prepares and the watermarks the coordinator piggybacks (a part of
    ``Participant``)."""

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

    async def prepare(self, sub: pb.SubTransaction | LocalSub, *, durable: bool = True) -> pb.Vote:
        """Runs one sub-transaction up to its vote; a yes vote is durable before it is sent,
        unless ``durable`` is False: a coordinator in this very process then makes it durable
        with the commit record (one-phase commit: seen only once on disk) or by
        ``flush_prepared`` before its decision.

        Ordinary operations take their rows in timestamp order; view deltas (MERGE) only
        register as pending (a guarded one is too late where a younger transaction read
        the row as its own: views over views read their inner view's rows so). A row of a
        table with asynchronous views also gets its change row (before and after image)
        appended in the same transaction, on this LTM."""
        self._check_serving()
        ts = sub.ts
        tx = self.prepared.get(ts) or Prepared(ts, segment=self.wal.segment)
        taken: dict[RowId, None] = {}  # insertion-ordered set
        pinned: list[RowState] = []
        ops: list[tuple[pb.RowOp, RowId]] = []
        merges: list[tuple[RowId, bytes]] = []
        guarded: list[RowId] = []
        backfills: set[RowId] = set()
        captured: dict[RowId, RowId] = {}  # change row -> the row whose change it holds
        for op in sub.ops:  # one pass: each field read of a wire message costs
            row_id = (op.table, op.key)
            kind = op.kind
            if kind == _MERGE:
                merges.append((row_id, op.values))
                if op.guarded:
                    guarded.append(row_id)
                continue
            ops.append((op, row_id))
            if kind == _BACKFILL:
                backfills.add(row_id)
            changes_tables = op.changes_tables
            if changes_tables:
                suffix = ts.to_bytes(8, "big")
                for changes in changes_tables:
                    captured[(changes, row_id[1] + suffix)] = row_id
        exclusive = list(dict.fromkeys([r for _, r in ops] + list(captured)))
        touched = exclusive + [r for r, _ in merges] if merges else exclusive
        superseded: set[RowId] = set()
        try:
            deltas = [(row_id, self._delta(row_id, values)) for row_id, values in merges]
            for row_id in touched:
                self._check_owned(row_id)
            for change_id in captured:  # its key holds this ts: new, never in the store
                if change_id not in self.rows:
                    self.rows[change_id] = RowState(versions=[(0, None)], rts=self.evicted_floor)
            pinned = await self._pin(touched)
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
            # Once every row is taken (those waits may let a younger transaction read a view
            # row meanwhile), in the step that registers the deltas (``_log_prepared``).
            self._check_guarded(guarded, ts)
            after: dict[RowId, Row | None] = {}  # this round's rows (a bulk load has many)
            for op, row_id in ops:
                if row_id in superseded:
                    continue
                before = tx.before[row_id]
                current = after[row_id] if row_id in after else tx.after.get(row_id, before)
                after[row_id] = apply_op(op, before, current, row_id)
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

    def _check_guarded(self, guarded: list[RowId], ts: int) -> None:
        """A guarded merge into a row a younger transaction read as its own is too late:
        that reader saw the row without this delta."""
        for row_id in guarded:
            if self.rows[row_id].rts > ts or self._in_younger_range_read(row_id, ts):
                message = "a younger transaction read the view row"
                raise VoteNo(Outcome.TOO_LATE, message, row_id)

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

    def _delta(self, row_id: RowId, values: bytes) -> Row:
        """A view delta that can merge into its row: numbers that add, or multisets of
        numbers, each of the kind the row and the deltas pending on it hold (the coordinator
        never sends another; a member's malformed request is refused, not merged later)."""
        delta = decode_row(values) or {}
        state = self.rows.get(row_id)
        others = [] if state is None else [state.current or {}, *state.merges.values()]
        for name, change in delta.items():
            ok = is_number(change) or (
                isinstance(change, dict) and all(is_number(n) for n in change.values())
            )
            for other in others:
                if ok and name in other:
                    ok = isinstance(other[name], dict) == isinstance(change, dict) and (
                        isinstance(change, dict) or is_number(other[name])
                    )
            if not ok:
                raise VoteNo(Outcome.INVALID, f"malformed view delta for {name}", row_id)
        return delta


def _add_images(vote: pb.Vote, tx: Prepared, row_ids: list[RowId]) -> None:
    """Each written row's image before and after the transaction, for view maintenance."""
    for table, key in dict.fromkeys(row_ids):
        vote.images.add(
            table=table,
            key=key,
            before=encode_row(tx.before[(table, key)]),
            after=encode_row(tx.after[(table, key)]),
        )
