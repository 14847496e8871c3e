"""The commit path: a transaction split by partition into sub-transactions, prepared round by
round (view maintenance adds rounds on the votes), then decided: one-phase where its one
participant is in this process, otherwise a commit record in the decision log first."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aggview import errors, failpoints
from aggview.partition_map import partition_of
from aggview.wire import client_pb2 as cpb
from aggview.wire import ltm_pb2 as lpb
from coordinator.convert import check_operation_count, describe_condition, describe_key, row_op
from coordinator.decision_delivery import DecisionDelivery
from ltm.participant.operations import LocalSub

if TYPE_CHECKING:
    from ltm.participant import Participant

log = logging.getLogger("coordinator.transactions")  # the manager's log, as before the split
Vote = lpb.Vote


@dataclass
class Transaction:
    ts: int
    participants: set[int] = field(default_factory=set)  # partitions prepared so far
    epoch: int = 0  # the catalog epoch its timestamp was granted under
    # A client's writes: converted, captured for views and maintained under the catalog of
    # ``epoch``, so it commits only while that catalog is still the current one. Then every
    # timestamp granted before a catalog change ran under the old catalog, every later one
    # under the new: a view changing mode can cut its history at a timestamp.
    catalog_bound: bool = False
    maintained: bool = False  # maintenance already ran on images predicted from its inserts
    system: bool = False  # the system's own (a refresh, an initialization), not a client's
    started: float = field(default_factory=time.perf_counter)  # at its grant (metrics)
    asked: float = 0.0  # when a client's commit asked for its timestamp (0: not measured)
    prepared: float = 0.0  # when its every round had voted yes
    images: list[lpb.RowImage] = field(default_factory=list)  # every row image seen so far
    # view deltas it merged into views other views read, by view and group: a later round's
    # cascade starts from the rows as this transaction left them (``cumulus.cascade``)
    merged: dict[str, dict[bytes, dict[str, Any]]] = field(default_factory=dict)


class Commits(DecisionDelivery):
    """The transaction manager's commit path (a part of ``TransactionManager``, over its state)."""

    # ----------------------------------------------------------------- writes

    async def commit(self, operations: list[cpb.Operation]) -> int:
        """Runs one one-shot transaction; returns its commit timestamp or raises why not."""
        check_operation_count(len(operations), self.limits)
        try:
            ops, epoch = self._row_ops(operations), self.epoch
        except errors.UnknownTable:
            if self.leader is None:
                raise
            await self.catch_up()  # a follower's catalog may be older than the client's
            ops, epoch = self._row_ops(operations), self.epoch
        writes = self.lookups.writes(row_keys(ops), (), epoch)
        asked = time.perf_counter()
        ts, granted = await self.clock.next(writes)
        if self.epoch != epoch:  # the catalog changed meanwhile: convert under the new one
            try:
                ops = self._row_ops(operations)
            except BaseException:
                self.in_flight.decided(ts)
                self.lookups.aborted(ts)
                raise
            self.lookups.writing(ts, row_keys(ops))
        tx = Transaction(ts, epoch=granted, catalog_bound=True, asked=asked)
        return await self._run(tx, ops)

    def _row_ops(self, operations: list[cpb.Operation]) -> list[lpb.RowOp]:
        ops = [row_op(op, self.catalog.table, self.limits) for op in operations]
        self.view_hooks.capture(ops)
        return ops

    async def catch_up(self) -> None:
        """Takes the catalog as of now (at a follower: one round trip to the clock)."""
        ts = await self.clock.read_timestamp()
        self.in_flight.stop_reading(ts)

    async def bulk_transaction(
        self, chunks: AsyncIterator[list[lpb.RowOp]], tables: set[str]
    ) -> int:
        """One transaction too big for one message (a bulk load into the store ``tables``):
        its operations arrive in chunks, each prepared as another round at the same
        timestamp, so every row becomes visible at once when it commits, and an LTM never
        spends long on one message."""
        ts, epoch = await self.clock.next(self.lookups.writes((), tables, self.epoch))
        tx = Transaction(ts, epoch=epoch, catalog_bound=True)

        async def rounds() -> None:
            async for ops in chunks:
                self.view_hooks.capture(ops)
                self.lookups.writing(ts, row_keys(ops))
                await self._prepare_rounds(tx, ops, extend=True)

        return await self._decide(tx, rounds())

    async def _run(self, tx: Transaction, ops: list[lpb.RowOp], extend: bool = True) -> int:
        return await self._decide(tx, self._prepare_rounds(tx, ops, extend))

    async def _prepare_rounds(self, tx: Transaction, ops: list[lpb.RowOp], extend: bool) -> None:
        """Prepares ``ops``, then what view maintenance adds on their votes, until it adds none."""
        round_ops = ops
        predicted = self._predicted_images(ops) if extend else None
        maintained = tx.maintained
        if predicted:
            # Only inserts of new rows: their images are known before any vote, so the
            # maintenance runs now and its operations join the first round (one round
            # instead of two, e.g. for a fact-table insert under a sync view).
            tx.maintained = True
            tx.images.extend(predicted)
            round_ops = round_ops + await self.view_hooks.maintain(tx, predicted)
        while round_ops:
            images = await self._prepare_round(tx, round_ops)
            tx.images.extend(images)
            round_ops = []
            if images and extend and not tx.maintained:
                round_ops.extend(await self.view_hooks.maintain(tx, images))
        tx.maintained = maintained

    async def _decide(self, tx: Transaction, prepared: Awaitable[None]) -> int:
        """Commits once every round in ``prepared`` voted yes; aborts everywhere otherwise."""
        try:
            await prepared
            tx.prepared = time.perf_counter()
            if tx.catalog_bound and tx.epoch != self.epoch:
                raise errors.TooLate(
                    "tables, views or indexes changed during the transaction; retry it"
                )
            if failpoints.ARMED:
                failpoints.hit(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED)
        except BaseException as exc:
            self._aborted(tx, exc)
            raise
        # The decision point: from here the transaction commits, even if the caller goes
        # away (a cancelled RPC must not turn into aborts at the LTMs). The caller hears of it
        # through a future, whose cancellation cancels nothing else. Where every participant
        # is here and no vote needs a flush of its own, the rest are callbacks; otherwise
        # it runs as a task.
        outcome: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if failpoints.ARMED or not self._decide_at_once(tx, outcome):
            decided = asyncio.ensure_future(settle(outcome, self._commit_local(tx)))
            self._committing.add(decided)
            decided.add_done_callback(self._committing.discard)
        return await outcome

    def _decide_at_once(self, tx: Transaction, outcome: asyncio.Future[int]) -> bool:
        """:meth:`_commit_local` without a task, where it would not wait before its record is
        queued: one participant, here (one-phase commit), or several, all here and logging
        to the decision log's own log (their prepares are durable with the decision, whose
        record is their commit record too: nothing to deliver). False, having done nothing,
        otherwise (none: the decision is logged all the same).

        The record is queued in the loop's next pass, as a task's first step would queue it:
        queued in this step, between other transactions' prepares, it let the log's thread
        take a group whenever one of those let go of the GIL (a store read), and concurrent
        commits split for good into groups of one to four (twice the flushes and 30 % more
        CPU a commit at eight clients)."""
        participants = sorted(tx.participants)
        channels = self.channels
        two_phase = len(participants) > 1
        if not participants or not (two_phase or channels[participants[0]].in_process):
            return False
        if two_phase:
            log = self.decisions.log
            if log is None or not all(
                channels[p].in_process and channels[p].log is log for p in participants
            ):
                return False
        along = participants if two_phase else []
        lsn = 0  # of the decision record that is its participants' commit record too, if so

        def decide() -> None:
            nonlocal lsn
            try:
                if not two_phase:
                    durable = channels[participants[0]].decide_at_once(tx.ts, True)
                elif (taking := self._commit_with_decision(tx.ts, participants)) is not None:
                    tags = [part.wal.tag for part in taking]  # type: ignore[union-attr]
                    lsn, durable = self.decisions.log_decided(tx.ts, participants, tags)
                    for part in taking:  # from here the record may be on disk, whatever
                        part.decision_queued(tx.ts, lsn)
                else:
                    durable = self.decisions.log_commit(tx.ts, participants)
            except Exception as exc:  # noqa: BLE001 - e.g. the log closed: heard as the outcome
                durable = asyncio.get_running_loop().create_future()
                durable.set_exception(exc)
            durable.add_done_callback(logged)

        def logged(durable: asyncio.Future[None]) -> None:
            failed = asyncio.CancelledError() if durable.cancelled() else durable.exception()
            error = failed
            try:
                self._learn_outcome(tx, failed)
            except Exception as exc:  # noqa: BLE001 - the caller's error
                error = error or exc
            deliver = participants if two_phase and not lsn and failed is None else []
            try:
                if failed is not None:  # in doubt: prepared until a restart replays the log
                    if two_phase:
                        self.unlogged.add(tx.ts)  # see _commit
                elif lsn:  # each participant commits by the decision's own record
                    deliver = self._decision_logged(tx.ts, participants, lsn)
                else:
                    for p in along:  # e.g. one fenced meanwhile raises: it commits all the same
                        channels[p].logged_with_decision(tx.ts)
                if error is None:
                    self._count_committed(tx)
            finally:  # durable: delivered and answered whatever the bookkeeping said
                if deliver:
                    self._deliver_later(tx.ts, deliver)
                if not outcome.done():
                    if error is None:
                        outcome.set_result(tx.ts)
                    else:
                        outcome.set_exception(error)

        self.in_flight.deciding(tx.ts)
        asyncio.get_running_loop().call_soon(decide)
        return True

    def _commit_with_decision(self, ts: int, participants: list[int]) -> list[Participant] | None:
        """The participants (all here, all writing to the decision log's log) if every one
        may take its commit from the decision's own record: one record for the decision and
        every commit, nothing to deliver, nothing left to forget. None if one cannot (it is
        fenced, say): the decision is then delivered as across processes."""
        try:
            taking = [self.channels[p].participant for p in participants]
            for part in taking:
                part.commit_with_decision(ts)
        except Exception:  # noqa: BLE001 - the ordinary way then
            return None
        return taking

    def _decision_logged(self, ts: int, participants: list[int], lsn: int) -> list[int]:
        """Each participant applies the commit logged at ``lsn``; returns those that could
        not (fenced meanwhile, say), which the decision log then remembers and which hear the
        decision as from another process."""
        failed = []
        for p in participants:
            try:
                self.channels[p].decision_logged(ts, lsn)
            except Exception:  # noqa: BLE001 - delivered the ordinary way instead
                failed.append(p)
        if failed:
            self.decisions.undelivered(ts, failed)
        return failed

    def _aborted(self, tx: Transaction, exc: BaseException) -> None:
        """Before its decision: the transaction aborts everywhere (presumed abort), and reads
        at its timestamp go on."""
        self.in_flight.decided(tx.ts)
        self.lookups.aborted(tx.ts)
        self.aborted += 1
        self.metrics.aborted_by(exc)
        for partition in tx.participants:
            self._send_abort(partition, tx.ts)

    async def _commit_local(self, tx: Transaction) -> int:
        """Some participants are in this process and their votes are not on disk yet. One
        participant, here: one-phase commit, its prepare and commit records flushed together, no
        decision record (a crash before that flush leaves a prepare alone, which the
        participant's question about it then aborts: presumed abort). Several: their prepares
        flushed, then two-phase commit as across processes."""
        participants = sorted(tx.participants)
        local = [p for p in participants if self.channels[p].in_process]
        if len(participants) != 1 or not local:  # across processes: two-phase commit
            # Prepares in the decision log's own log need no flush of their own: the
            # decision record's flush, after them, makes them durable too.
            log = self.decisions.log
            along = [p for p in local if log is not None and self.channels[p].log is log]
            try:
                if failpoints.ARMED:
                    failpoints.hit(failpoints.COORDINATOR_LOCAL_FLUSH)
                await asyncio.gather(*(self.channels[p].flush() for p in local if p not in along))
            except BaseException as exc:  # a vote not durable: nothing decided yet, so abort
                self._aborted(tx, exc)
                raise
            return await self._commit(tx, along)
        await self._decided(tx, self.channels[participants[0]].decide(tx.ts, True))
        self._count_committed(tx)
        return tx.ts

    async def _decided(self, tx: Transaction, durable: Awaitable[None]) -> None:
        """Awaits what makes the commit durable, then :meth:`_learn_outcome`."""
        try:
            await durable
        except BaseException as exc:
            self._learn_outcome(tx, exc)
            raise
        self._learn_outcome(tx, None)

    def _count_committed(self, tx: Transaction) -> None:
        self.committed += 1
        self.metrics.committed(tx.system, tx.started, tx.asked, tx.prepared)

    def _learn_outcome(self, tx: Transaction, error: BaseException | None) -> None:
        """The commit is durable, or failed with ``error``: the transaction is decided (reads
        at its timestamp may go on) and the lookup cache learns its outcome, or that it is
        unknown if the write failed."""
        try:
            if error is None:
                self.lookups.committed(tx.ts, tx.images)
                self.view_hooks.committed(tx.ts, tx.images)  # to this member's switch
            else:
                self.lookups.unknown(tx.ts)
                self.view_hooks.unknown(tx.ts, tx.images)
        finally:
            self.in_flight.decided(tx.ts)

    async def _commit(self, tx: Transaction, along: tuple[int, ...] | list[int] = ()) -> int:
        """Logs the decision, then delivers it; ``along``: local participants whose
        prepares went to disk with the decision record."""
        ts, participants = tx.ts, sorted(tx.participants)
        try:
            await self._decided(tx, self.decisions.commit(ts, participants))
        except BaseException:
            # Not known to be logged, yet its record may be on this member's disk, and a
            # restart would deliver it: never answer "aborted" for it from here.
            self.unlogged.add(ts)
            raise
        for p in along:
            self.channels[p].logged_with_decision(ts)
        if failpoints.ARMED:
            failpoints.hit(failpoints.COORDINATOR_AFTER_DECISION_LOGGED)
        self._count_committed(tx)
        self._deliver_later(ts, participants)
        return ts

    def _predicted_images(self, ops: list[lpb.RowOp]) -> list[lpb.RowImage] | None:
        """Row images of a transaction whose every watched operation inserts a distinct row
        (a failed insert aborts the whole transaction, so the prediction cannot be wrong)."""
        images = []
        seen = set()
        watches = self.view_hooks.watches
        for op in ops:
            if not watches(op.table):
                continue
            if op.kind != lpb.RowOp.INSERT or (op.table, op.key) in seen:
                return None
            seen.add((op.table, op.key))
            images.append(lpb.RowImage(table=op.table, key=op.key, after=op.values))
        return images or None

    async def _prepare_round(self, tx: Transaction, ops: list[lpb.RowOp]) -> list[lpb.RowImage]:
        by_partition: dict[int, LocalSub] = {}
        watches = self.view_hooks.watches
        for op in ops:
            partition = partition_of(op.table, op.key, self.partitions)
            sub = by_partition.get(partition)
            if sub is None:
                sub = by_partition[partition] = LocalSub(tx.ts)
            if not sub.want_images and not tx.maintained and watches(op.table):
                sub.want_images = True
            sub.ops.append(op)
        tx.participants.update(by_partition)
        # Partitions in this process are prepared one after the other in this task (a task
        # each cost more than their prepares, which seldom wait); the other members' prepares
        # run as tasks meanwhile, from this task's first wait on.
        channels = self.channels
        local, remote = [], []
        for p, sub in by_partition.items():
            if channels[p].in_process:
                local.append((p, sub))
            else:
                remote.append(channels[p].prepare(sub.message()))
        if len(remote) == 1 and not local:  # awaited in this task: no loop pass for gather
            votes = [await remote[0]]
        else:
            others = asyncio.gather(*remote) if remote else None
            try:
                votes = [await channels[p].prepare(sub) for p, sub in local]
            except BaseException:
                if others is not None:
                    others.cancel()
                raise
            if others is not None:
                votes.extend(await others)
        self._raise_for_votes(votes)
        return [image for vote in votes for image in vote.images]

    def _raise_for_votes(self, votes: list[lpb.Vote]) -> None:
        """The most telling no vote becomes the transaction's error: a failed condition or a
        missing row is the answer at this timestamp; too-late and unavailable are retryable."""
        order = [
            Vote.CONDITION_FAILED,
            Vote.NOT_FOUND,
            Vote.ALREADY_EXISTS,
            Vote.INVALID,
            Vote.UNAVAILABLE,
            Vote.TOO_LATE,
        ]
        no = [v for v in votes if v.outcome != Vote.YES]
        if not no:
            return
        vote = min(no, key=lambda v: order.index(v.outcome))
        schema = self.catalog.by_id.get(vote.table)
        where = (
            f"table {schema.name}, row {describe_key(schema, vote.key)}"
            if schema
            else ("a participant")
        )
        if vote.outcome == Vote.CONDITION_FAILED:
            detail = describe_condition(schema, vote.message) if schema else vote.message
            raise errors.ConditionFailed(f"condition failed: {where}: {detail}")
        if vote.outcome == Vote.NOT_FOUND:
            raise errors.RowNotFound(f"{where}: {vote.message}")
        if vote.outcome == Vote.ALREADY_EXISTS:
            raise errors.AlreadyExists(f"{where}: {vote.message}")
        if vote.outcome == Vote.INVALID:
            raise errors.InvalidArgument(f"{where}: {vote.message}")
        if vote.outcome == Vote.UNAVAILABLE:
            raise errors.Unavailable(vote.message)
        raise errors.TooLate(f"transaction aborted by timestamp order at {where}; retry it")


async def settle(outcome: asyncio.Future[int], work: Awaitable[int]) -> None:
    """Runs ``work`` to its end and puts its result (or error) into ``outcome``, unless
    whoever waited for it has gone."""
    try:
        result = await work
    except asyncio.CancelledError:
        outcome.cancel()
        raise
    except Exception as exc:
        if not outcome.done():
            outcome.set_exception(exc)
    else:
        if not outcome.done():
            outcome.set_result(result)


def row_keys(ops: list[lpb.RowOp]) -> list[tuple[str, bytes]]:
    """The rows ``ops`` write, as the lookup cache names them."""
    return [(op.table, op.key) for op in ops]
