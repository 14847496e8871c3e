"""Transactions built from reads at their own timestamp: the system's (a refresh, an
initialization, an index backfill) and a client's read/write ones (SQL UPDATE or DELETE with a
WHERE), run again at a new timestamp after a timestamp-order abort."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from aggview import errors
from aggview.retry import RetryPolicy
from aggview.wire import client_pb2 as cpb
from aggview.wire import ltm_pb2 as lpb
from coordinator.commits import Commits, Transaction, row_keys
from coordinator.convert import check_operation_count

SYSTEM_RETRIES = 50  # timestamp-order aborts a system transaction absorbs before giving up
# a system transaction's retries: 1, 2, 4 ... 100 ms, no jitter
SYSTEM_RETRY = RetryPolicy(attempts=SYSTEM_RETRIES + 1, spread=(1.0, 1.0))


async def _retry_commits(attempt: Callable[[Callable[[], None]], Awaitable[int]]) -> int:
    """Runs ``attempt`` under ``SYSTEM_RETRY``: a timestamp-order abort is retried (at a new
    timestamp) once the attempt called ``committing()``; one raised before, while it built its
    operations, is its answer."""
    committing = False

    def started() -> None:
        nonlocal committing
        committing = True

    async def once() -> int:
        nonlocal committing
        committing = False
        return await attempt(started)

    policy = replace(
        SYSTEM_RETRY, retryable=lambda exc: committing and isinstance(exc, errors.TooLate)
    )
    return await policy.arun(once)


class SystemTransactions(Commits):
    """Retried transactions (a part of ``TransactionManager``, over its state)."""

    async def system_transaction(self, build: Callable[[int], Awaitable[list[lpb.RowOp]]]) -> int:
        """A transaction of the system's own (view refresh, initialization): it gets its
        timestamp first, waits until every older transaction is decided, then builds its
        operations from reads at that timestamp. A timestamp-order abort (a younger writer
        got to a row first) runs it again at a new timestamp."""

        async def once(committing: Callable[[], None]) -> int:
            ts, epoch = await self.clock.next()
            tx = Transaction(ts, epoch=self.epoch, system=True)
            try:
                await self.clock.wait_decided(ts - 1)
                ops = await build(ts)
            except BaseException:
                self.in_flight.decided(ts)
                raise
            committing()
            return await self._run(tx, ops, extend=False)

        return await _retry_commits(once)

    async def read_write_transaction(
        self, build: Callable[[int], Awaitable[list[cpb.Operation]]], tables: set[str]
    ) -> int:
        """A client's transaction whose writes depend on what it reads (a SQL UPDATE or DELETE
        with a WHERE): ``build`` reads at the transaction's own timestamp, marking what it read
        so no older writer can change it afterwards, and returns the operations (on the store
        ``tables``), which commit at that timestamp like any client's (checked, captured,
        views maintained). A timestamp-order abort runs it again at a new timestamp. Nothing
        to write: nothing commits, and the reads' timestamp is returned."""

        async def once(committing: Callable[[], None]) -> int:
            # its rows are known only once it has read: any row of its tables until then
            ts, epoch = await self.clock.next(self.lookups.writes((), tables, self.epoch))
            tx = Transaction(ts, epoch=epoch, catalog_bound=True)
            try:
                operations = await build(ts)
                if operations:
                    check_operation_count(len(operations), self.limits)
                ops = self._row_ops(operations)
            except BaseException:
                self.in_flight.decided(ts)
                self.lookups.aborted(ts)
                raise
            if not ops:
                self.in_flight.decided(ts)
                self.lookups.aborted(ts)
                return ts
            # Its writes are known now: registered, so its commit installs their images over
            # what the lookup cache holds (opaque alone would leave the old rows cached).
            self.lookups.writing(ts, row_keys(ops))
            committing()
            return await self._run(tx, ops)

        return await _retry_commits(once)

    async def bulk_system_transaction(
        self, build: Callable[[int], AsyncIterator[list[lpb.RowOp]]]
    ) -> int:
        """A system transaction too big for one message (an index backfill over a large table):
        like :meth:`system_transaction`, but its operations come in chunks, each prepared as
        another round at the same timestamp."""

        async def once(committing: Callable[[], None]) -> int:
            ts, epoch = await self.clock.next()
            tx = Transaction(ts, epoch=self.epoch, system=True)

            async def rounds() -> None:
                await self.clock.wait_decided(tx.ts - 1)
                async for ops in build(tx.ts):
                    await self._prepare_rounds(tx, ops, extend=False)

            committing()  # its chunks are built as its rounds go: all of it is retried
            return await self._decide(tx, rounds())

        return await _retry_commits(once)
