"""Phase two: commit decisions delivered to every participant until each has them durably (ours,
and those of dead members' decision logs adopted here), aborts sent best effort, and the
outcome of a transaction told to a participant that asks."""

from __future__ import annotations

import asyncio
import logging

from aggview import failpoints
from aggview.retry import RetryPolicy, retry_on
from aggview.wire import ltm_pb2 as lpb
from coordinator.decision_log import DecisionLog

log = logging.getLogger("coordinator.transactions")  # the manager's log, as before the split
# a commit decision an LTM missed: sent again after 0.05 s, then every 0.1, 0.2 ... 1 s, until
# it is delivered
REDELIVERY_FIRST = 0.05
REDELIVERY = RetryPolicy(
    attempts=None, first_delay=0.1, max_delay=1.0, spread=(1.0, 1.0), retryable=retry_on(Exception)
)


class DecisionDelivery:
    """The transaction manager's phase two (a part of ``TransactionManager``, over its state)."""

    def _send_abort(self, partition: int, ts: int) -> None:
        """Best effort: an LTM that misses it asks later and hears 'aborted' (presumed abort)."""
        future = self.channels[partition].decisions.submit(lpb.Decision(ts=ts, commit=False))
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _deliver_later(
        self, ts: int, participants: list[int], decisions: DecisionLog | None = None
    ) -> None:
        """Phase two, without a task per transaction: each participant's decision rides the
        next decide batch; a failed delivery is retried until every participant has the commit
        durably, then the decision log (ours, or a dead member's we adopted) may forget it."""
        pending = set(participants)
        decisions = decisions or self.decisions
        if not pending:  # a transaction that wrote nothing (DDL's): nobody to tell
            decisions.done(ts)
            return

        def delivered(partition: int, future: asyncio.Future[None]) -> None:
            if future.cancelled() or future.exception() is not None:
                self._retry_delivery(ts, partition, pending, decisions)
                return
            pending.discard(partition)
            if failpoints.ARMED:
                failpoints.hit(failpoints.COORDINATOR_MID_COMMIT_FANOUT)
            if not pending:
                decisions.done(ts)

        for partition in participants:
            future = self.channels[partition].decisions.submit(lpb.Decision(ts=ts, commit=True))
            future.add_done_callback(lambda f, p=partition: delivered(p, f))

    def _retry_delivery(
        self, ts: int, partition: int, pending: set[int], decisions: DecisionLog
    ) -> None:
        def undelivered(exc: BaseException, failed: int, wait: float) -> None:
            log.info(
                "commit %d to LTM %d not delivered (%s); retrying",
                ts,
                partition,
                exc,
                extra={"ts": ts},
            )

        async def retry() -> None:
            await asyncio.sleep(REDELIVERY_FIRST)
            await REDELIVERY.arun(lambda: self.channels[partition].decide(ts, True), undelivered)
            pending.discard(partition)
            if not pending:
                decisions.done(ts)

        task = asyncio.get_running_loop().create_task(retry())
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    @property
    def adopted(self) -> list[tuple[int, DecisionLog]]:
        """Dead members' decision logs taken over here, as (member, log)."""
        return self.replication.adopted if self.replication is not None else []

    async def answering_for(self) -> list[int]:
        """Dead members this member answers for: their decision logs adopted here and not
        taken back (see ``MemberDecisions.answering_for``)."""
        return await self.replication.answering_for() if self.replication is not None else []

    def adopt(self, decisions: DecisionLog) -> None:
        """A dead member's decision log, taken over here (``adopted``): its commits are
        delivered as ours are."""
        for ts, participants in list(decisions.committed.items()):
            self._deliver_later(ts, participants, decisions)

    def outcome(self, ts: int) -> int:
        if ts in self.decisions.committed:
            return lpb.OutcomeReply.COMMITTED
        if any(ts in adopted.committed for _, adopted in self.adopted):
            return lpb.OutcomeReply.COMMITTED
        if ts in self.in_flight or ts in self.unlogged:
            return lpb.OutcomeReply.PENDING
        return lpb.OutcomeReply.ABORTED
