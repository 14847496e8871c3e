"""Recovery: the log replayed over the store by LSN at start."""

from __future__ import annotations

import asyncio
import logging

from ltm.participant.operations import RowId
from ltm.participant.state import PartitionState, Prepared
from ltm.rows import Row
from ltm.store.ownership import lsn_floor

log = logging.getLogger("ltm.participant")  # the participant's log, as before the split


class Recovery(PartitionState):
    """A participant's restart recovery (a part of ``Participant``)."""

    async def recover(self) -> None:
        """Replays the log over the store. A committed change is applied to a row only if its
        log sequence number is above the one the stored copy carries, so nothing is applied
        twice (view deltas are not idempotent); PREPARED transactions without a decision stay
        prepared (rows held, deltas pending) until the coordinator tells their outcome."""
        # What the store holds may come from another log (another layout): later records
        # are numbered above it, or replay would skip them as stored already.
        self.wal.number_above(
            await asyncio.to_thread(lsn_floor, self.store, self.settings.partition)
        )
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
