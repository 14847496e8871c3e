"""The decision path: a commit or abort logged and applied, and transactions in doubt asked
about."""

from __future__ import annotations

import asyncio
import logging
import time

from aggview import errors, failpoints
from aggview.loops import pass_on
from ltm.participant.state import PartitionState, Prepared

log = logging.getLogger("ltm.participant")  # the participant's log, as before the split


class Decisions(PartitionState):
    """A participant's decisions (a part of ``Participant``)."""

    async def decide(self, ts: int, commit: bool) -> None:
        """Applies the coordinator's decision. Unknown timestamps are already decided here
        (decisions are retried), so they are acknowledged without effect, but only while
        this copy serves the partition: a fenced one may have forgotten a transaction its
        successor holds prepared, and an acknowledgment from it would let the coordinator
        forget a commit the successor still has to apply."""
        await self.decide_at_once(ts, commit)

    def decide_at_once(self, ts: int, commit: bool) -> asyncio.Future[None]:
        """:meth:`decide` without a coroutine, for a coordinator in this process (a task
        per decision cost more than the decision): the future is done once the commit
        record is durable, or at once for an abort or a timestamp unknown here. A commit
        whose vote is durable is applied now; one whose vote is not (one-phase commit) is
        applied once its record is on disk (:meth:`_commit_one_phase`)."""
        self._check_serving()
        tx = self.prepared.get(ts)
        if tx is None or not commit:
            if tx is not None:
                self._abort(ts, tx)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if not tx.durable:
            return self._commit_one_phase(ts, tx)
        del self.prepared[ts]
        self._apply_commit(ts, tx, self.wal.write({"kind": "commit", "ts": ts}))
        durable = self.wal.flush()
        return _after_commit_applied(durable) if failpoints.ARMED else durable

    def _commit_one_phase(self, ts: int, tx: Prepared) -> asyncio.Future[None]:
        """One participant, in the coordinator's process: no decision record exists anywhere
        else, so this commit record is the decision, and what the transaction wrote must not
        be seen before it is on disk: a crash in between takes the transaction back, after
        another member's transaction read it (a lookup, cached there) and built on it. Its
        rows stay held and its view deltas pending meanwhile. The record is queued now, so
        the commit stands whoever waits for the returned future (a caller gone cancels only
        that future)."""
        lsn = self.wal.write({"kind": "commit", "ts": ts})
        # logged at ``lsn``, applied only after the flush; if a decision record that is this
        # commit's was queued before (its apply failed), replay takes that one, lower
        self._committing[ts] = min(lsn, self._committing.get(ts) or lsn)
        applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def flushed(durable: asyncio.Future[None]) -> None:
            self._committing.pop(ts, None)
            try:
                # a failed flush: applied anyway, as before (its outcome is unknown)
                if self.prepared.pop(ts, None) is tx:
                    self._apply_commit(ts, tx, lsn)
            except Exception as exc:  # noqa: BLE001 - its waiter hears it, as from a coroutine
                if not applied.done():
                    applied.set_exception(exc)
                return
            pass_on(durable, applied)

        asyncio.ensure_future(self.wal.flush()).add_done_callback(flushed)  # a future as is
        return _after_commit_applied(applied) if failpoints.ARMED else applied

    def commit_with_decision(self, ts: int) -> None:
        """Raises unless ``ts`` may commit by its decision's record in this partition's own
        log (a member's one log): served here and prepared. That record is this partition's
        commit record too (``aggview.member_log`` hands it to each participant it names at
        replay), so none of its own is written."""
        self._check_serving()
        if ts not in self.prepared:
            raise errors.FailedPrecondition(f"transaction {ts} is not prepared here")

    def decision_queued(self, ts: int, lsn: int) -> None:
        """The decision record of ``ts`` is queued at ``lsn``. Whatever its flush says, it may
        be on disk: until :meth:`decision_logged` its rows stay held and its view deltas
        pending, as for a one-phase commit, and a checkpoint holds back each view row it
        adds to that holds a number above it (or until a restart decides)."""
        self._committing[ts] = lsn

    def decision_logged(self, ts: int, lsn: int) -> None:
        """The decision record of ``ts`` is durable at ``lsn``: the commit is applied, at it."""
        tx = self.prepared.pop(ts, None)
        if tx is not None:
            tx.durable = True
            self._apply_commit(ts, tx, lsn)
        self._committing.pop(ts, None)

    def _abort(self, ts: int, tx: Prepared) -> None:
        """Releases what ``tx`` holds; its record is never waited for (presumed abort)."""
        del self.prepared[ts]
        for row_id in tx.after:
            self.rows[row_id].release()
        for row_id in tx.merges:
            self.rows[row_id].drop_merge(ts)
            self.touched.add(row_id)  # dropping a delta can settle a partial sum
        self.wal.write({"kind": "abort", "ts": ts}, flush=False)

    async def flush_prepared(self) -> None:
        """Every prepare record so far is on disk (a coordinator in this process, before it
        logs the decision of a transaction with several participants): their commits then
        need no flush before they are seen."""
        upto = self.wal.lsn
        await self.wal.flush()
        for tx in self.prepared.values():
            if tx.lsn <= upto:
                tx.durable = True

    def logged_with_decision(self, ts: int) -> None:
        """The commit record of ``ts`` is durable in this partition's own log, after its
        prepare records (a member's one log, ``aggview.member_log``): they are durable too,
        so its commit here needs no flush before it is seen."""
        tx = self.prepared.get(ts)
        if tx is not None:
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
                log.error(
                    "view delta of %d does not fit row %r: %s; dropped",
                    ts,
                    row_id,
                    exc,
                    extra={"ts": ts},
                )
                state.drop_merge(ts)
        self.commits_since_checkpoint += len(tx.after) + len(tx.merges)
        self.touched.update(tx.after)
        self.touched.update(tx.merges)

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
                        log.exception(
                            "applying the outcome of %d failed; asking again", ts, extra={"ts": ts}
                        )


def _after_commit_applied(durable: asyncio.Future[None]) -> asyncio.Future[None]:
    """``durable``, then the failpoint :meth:`Decisions.decide` hits after a commit (its
    ``raise`` fails the future, as it fails that coroutine)."""
    result: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(future: asyncio.Future[None]) -> None:
        if future.cancelled():
            result.cancel()
            return
        error = future.exception()
        if error is None:
            try:
                failpoints.hit(failpoints.LTM_AFTER_COMMIT_APPLIED)
            except Exception as exc:  # noqa: BLE001 - the decision's outcome
                error = exc
        if error is None:
            result.set_result(None)
        else:
            result.set_exception(error)

    durable.add_done_callback(done)
    return result
