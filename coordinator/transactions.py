"""The two-phase-commit driver and snapshot reads.

A one-shot transaction gets a timestamp, is split by partition into sub-transactions, and is
prepared at every participant; the votes carry row images. Between the votes and the decision
the transaction may grow (``ViewHooks.maintain``: view maintenance adds sub-transactions there).
A commit decision is durable in the decision log before anyone hears of it; phase two is then
delivered in the background until every participant has acknowledged it.

Reads never abort writers: a read takes the youngest issued timestamp t, waits until every
transaction at or below t is decided, and reads at t. So it sees exactly the transactions
committed before it started (strict serializability for reads too).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from aggview import errors, failpoints
from aggview.metrics import Metrics
from aggview.partition_map import partition_of
from aggview.retry import RetryPolicy, retry_on
from aggview.wire import client_pb2 as cpb
from aggview.wire import ltm_pb2 as lpb
from coordinator import lookup_cache
from coordinator.catalog import Catalog
from coordinator.convert import (
    Limits,
    check_operation_count,
    describe_condition,
    describe_key,
    row_op,
)
from coordinator.decision_log import DecisionLog
from coordinator.lookup_cache import LookupCache
from coordinator.member_clock import MemberClock
from coordinator.view_hooks import NO_VIEWS, ViewHooks
from ltm.server import NotServed

log = logging.getLogger(__name__)
Vote = lpb.Vote
SYSTEM_RETRIES = 50  # timestamp-order aborts a system transaction absorbs before giving up
# a system transaction's retries: 1, 2, 4 ... 100 ms, no jitter
SYSTEM_RETRY = RetryPolicy(attempts=SYSTEM_RETRIES + 1, spread=(1.0, 1.0))
# how long a read waits for a partition that moved to be found where it went (see _read)
MOVED_READ_WAIT = 5.0
# a commit decision an LTM missed: sent again after 0.05 s, then every 0.1, 0.2 ... 1 s, until
# it is delivered
REDELIVERY_FIRST = 0.05
REDELIVERY = RetryPolicy(
    attempts=None, first_delay=0.1, max_delay=1.0, spread=(1.0, 1.0), retryable=retry_on(Exception)
)


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
    images: list[lpb.RowImage] = field(default_factory=list)  # every row image seen so far


class TransactionManager:
    def __init__(
        self,
        catalog: Catalog,
        clock: MemberClock,
        decisions: DecisionLog,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.catalog = catalog
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.in_flight = clock.in_flight
        self.decisions = decisions
        self.limits = limits or Limits()
        # Each partition's participant: hosted here (``LocalLtm``) or at another member
        # (``LtmChannel``); set by ``coordinator.member_wiring.build_manager``.
        self.channels: list[Any] = []
        self.local: Any = None  # the partitions hosted in this process
        self.replication: Any = None  # members' decision logs copied (``--replicate``)
        # What the transaction path calls on views: change capture before the first prepare,
        # maintenance after every round of yes votes, which tables need row images, which are
        # looked up by key (cached here): the view manager once one is attached, else nothing.
        self.view_hooks: ViewHooks = NO_VIEWS
        self.epoch = 0  # bumped when views change; maintenance refuses an older transaction
        # the view manager, once one is attached (``coordinator.member_wiring.build_manager``): for
        # the service's DDL, reads and refreshes; the transaction path calls ``view_hooks``
        self.views: Any = None
        self.lookups = LookupCache(
            lambda: self.view_hooks.lookup_tables(),
            lambda: self.epoch,
            lambda: self.clock.issued(),  # the clock object changes on a takeover
            warm=self._warm,
        )
        clock.cache = self.lookups  # it hears what each timestamp writes as it is granted
        self._warming: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._committing: set[asyncio.Task[None]] = set()  # decided, not yet durable
        # Commits whose decision record failed to be logged (its log taken over, a disk
        # error): undecided until a restart replays the log, or the log's adopter answers.
        self.unlogged: set[int] = set()
        self.committed = 0
        self.aborted = 0
        self.leader: str | None = None  # the leader's address, when this member is not it
        self.leader_member = 0  # which member leads (keeps the clock and the catalog)
        self.lead: Any = None  # the leadership record this member leads under (replicated)
        self.members: list[str] = []  # every coordinating member's address (none: just this)
        self.transact_addresses: list[str] = []  # their framed ports for clients' transactions
        self.member = 0  # this one's index among them
        # whether the member serving LTM ``ltm`` fell silent to this one's prober
        # (``coordinator.quorum``; replicated clusters): calls to it then fail at once
        self.ltm_silent: Callable[[int], bool] = lambda ltm: False
        # the members silent to this one's prober, told to clients with their answers
        self.silent_members: Callable[[], list[int]] = lambda: []
        self.refreshes = 0  # async-view refreshes committed here

    def at_leader(self, what: str) -> None:
        """Refuses, at a follower member, what only the leader runs (it keeps the catalog)."""
        if self.leader is not None:
            raise errors.FailedPrecondition(
                f"{what} runs at the cluster's leader, member {self.leader_member} "
                f"({self.leader}); send it there (the Python client does)"
            )

    def bump_epoch(self, configuration: dict[str, Any]) -> None:
        """Views, indexes or tables changed: a new epoch for what is timestamped from now."""
        self.epoch += 1
        self.clock.publish(self.epoch, configuration)

    @property
    def partitions(self) -> int:
        return len(self.channels)

    def _watermarks(self) -> tuple[int, int]:
        return self.clock.marks.low, self.clock.issued()

    async def start(self) -> None:
        """Re-delivers commit decisions that participants had not acknowledged before a restart."""
        for ts, participants in list(self.decisions.committed.items()):
            self._deliver_later(ts, participants)

    async def close(self) -> None:
        if self.lookups.hits or self.lookups.misses:
            log.info("lookup cache: %d hits, %d misses", self.lookups.hits, self.lookups.misses)
        if self._warming is not None:
            self._warming.cancel()
        if self._deliveries:
            await asyncio.wait(self._deliveries, timeout=5)
        for channel in self.channels:
            await channel.close()

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
        writes = self.lookups.writes(_row_keys(ops), (), epoch)
        ts, granted = await self.clock.next(writes)
        if self.epoch != epoch:  # the catalog changed meanwhile: convert under the new one
            try:
                ops = self._row_ops(operations)
            except BaseException:
                self.in_flight.decided(ts)
                self.lookups.aborted(ts)
                raise
            self.lookups.writing(ts, _row_keys(ops))
        tx = Transaction(ts, epoch=granted, catalog_bound=True)
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
                self.lookups.writing(ts, _row_keys(ops))
                await self._prepare_rounds(tx, ops, extend=True)

        return await self._decide(tx, rounds())

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
            self.lookups.writing(ts, _row_keys(ops))
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
            if tx.catalog_bound and tx.epoch != self.epoch:
                raise errors.TooLate(
                    "tables, views or indexes changed during the transaction; retry it"
                )
            if failpoints.ARMED:
                failpoints.hit(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED)
        except BaseException as exc:
            self._aborted(tx, exc)
            raise
        # The decision point: once the commit record is queued the transaction commits, even
        # if the caller goes away (a cancelled RPC must not turn into aborts at the LTMs). So
        # it runs as a task of its own, which tells the caller through a future (the caller's
        # cancellation cancels only that future). Unlike ``asyncio.shield``, the caller resumes
        # in the very next pass of the loop.
        outcome: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        decided = asyncio.ensure_future(_settle(outcome, self._commit_local(tx)))
        self._committing.add(decided)
        decided.add_done_callback(self._committing.discard)
        return await outcome

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
        local = [p for p in participants if hasattr(self.channels[p], "flush")]
        if len(participants) != 1 or not local:  # across processes: two-phase commit
            try:
                if failpoints.ARMED:
                    failpoints.hit(failpoints.COORDINATOR_LOCAL_FLUSH)
                await asyncio.gather(*(self.channels[p].flush() for p in local))
            except BaseException as exc:  # a vote not durable: nothing decided yet, so abort
                self._aborted(tx, exc)
                raise
            return await self._commit(tx)
        await self._decided(tx, self.channels[participants[0]].decide(tx.ts, True))
        self.committed += 1
        self.metrics.committed(tx.system, tx.started)
        return tx.ts

    async def _decided(self, tx: Transaction, durable: Awaitable[None]) -> None:
        """Awaits what makes the commit durable; then the transaction is decided (reads at
        its timestamp may go on) and the lookup cache learns its outcome, or that it is
        unknown if the write failed."""
        try:
            await durable
        except BaseException:
            self.lookups.unknown(tx.ts)
            raise
        else:
            self.lookups.committed(tx.ts, tx.images)
        finally:
            self.in_flight.decided(tx.ts)

    async def _commit(self, tx: Transaction) -> int:
        ts, participants = tx.ts, sorted(tx.participants)
        try:
            await self._decided(tx, self.decisions.commit(ts, participants))
        except BaseException:
            # Not known to be logged, yet its record may be on this member's disk, and a
            # restart would deliver it: never answer "aborted" for it from here.
            self.unlogged.add(ts)
            raise
        if failpoints.ARMED:
            failpoints.hit(failpoints.COORDINATOR_AFTER_DECISION_LOGGED)
        self.committed += 1
        self.metrics.committed(tx.system, tx.started)
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
        by_partition: dict[int, lpb.SubTransaction] = {}
        watches = self.view_hooks.watches
        for op in ops:
            partition = partition_of(op.table, op.key, self.partitions)
            sub = by_partition.get(partition)
            if sub is None:
                sub = by_partition[partition] = lpb.SubTransaction(ts=tx.ts)
            if not sub.want_images and not tx.maintained and watches(op.table):
                sub.want_images = True
            sub.ops.append(op)
        tx.participants.update(by_partition)
        if len(by_partition) == 1:  # awaited in this task: gather would add loop passes
            ((p, sub),) = by_partition.items()
            votes = [await self.channels[p].prepare(sub)]
        else:
            votes = await asyncio.gather(
                *(self.channels[p].prepare(sub) for p, sub in by_partition.items())
            )
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
            log.info("commit %d to LTM %d not delivered (%s); retrying", ts, partition, exc)

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

    # ----------------------------------------------------------------- reads

    @asynccontextmanager
    async def snapshot(self, at: int = 0) -> AsyncIterator[int]:
        """A read timestamp: every transaction at or below it is decided, and no LTM prunes
        the versions it needs until the block ends (it counts in the low watermark from the
        moment it is taken). ``at``: a timestamp the caller keeps readable (a held snapshot)."""
        if at:
            await self.clock.wait_decided(at)
            yield at
            return
        ts = await self.clock.read_timestamp()
        try:
            await self.clock.wait_decided(ts)
            yield ts
        finally:
            self.in_flight.stop_reading(ts)

    async def read_keys(
        self, table_id: str, keys: list[bytes], at: int = 0
    ) -> tuple[dict[bytes, bytes], int]:
        """Rows by key from one consistent snapshot (now, or ``at``, a held one); returns
        (key -> row, timestamp)."""
        async with self.snapshot(at) as ts:
            return await self.read_keys_at(table_id, keys, ts), ts

    async def read_range(
        self, table_id: str, start: bytes, stop: bytes, limit: int = 0, at: int = 0
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """A key range of a table from one consistent snapshot (now, or ``at``), in key
        order."""
        async with self.snapshot(at) as ts:
            return await self.read_range_at(table_id, start, stop, ts, limit=limit), ts

    async def read_keys_at(
        self, table_id: str, keys: list[bytes], ts: int, *, own: bool = False
    ) -> dict[bytes, bytes]:
        """Rows by key at ``ts``. ``own``: transaction ``ts`` reads (the state before it, and
        no older writer may change what it read afterwards)."""
        by_partition: dict[int, list[bytes]] = {}
        for key in keys:
            by_partition.setdefault(partition_of(table_id, key, self.partitions), []).append(key)
        replies = await asyncio.gather(
            *(
                self._read(p, lpb.ReadRequest(ts=ts, table=table_id, keys=ks, register_read=own))
                for p, ks in by_partition.items()
            )
        )
        return {kv.key: kv.row for reply in replies for kv in reply.rows}

    async def _read(self, partition: int, request: lpb.ReadRequest) -> lpb.ReadReply:
        """A read of one partition; one that moved meanwhile (handed back home, failed over)
        is read again from where its channel points next (replaced within a poll of the
        ownership records), for up to ``MOVED_READ_WAIT`` seconds: a read at a timestamp
        reads the same rows anywhere."""
        deadline = time.monotonic() + MOVED_READ_WAIT
        while True:
            channel = self.channels[partition]
            try:
                return await channel.read(request)
            except NotServed:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    async def lookup_keys_at(self, table_id: str, keys: list[bytes], ts: int) -> dict[bytes, bytes]:
        """Rows by primary key as transaction ``ts`` reads them (``own``), from the lookup
        cache where it knows them, from the LTMs otherwise."""
        if table_id not in self.lookups.tables():
            return await self.read_keys_at(table_id, keys, ts, own=True)
        found: dict[bytes, bytes] = {}
        missing = []
        for key in keys:
            known, row = self.lookups.lookup((table_id, key), ts)
            if not known:
                missing.append(key)
            elif row is not None:
                found[key] = row
        if lookup_cache.CHECK and len(missing) < len(keys):
            read = await self._checked_lookups(table_id, keys, missing, found, ts)
        elif missing:
            read = await self.read_keys_at(table_id, missing, ts, own=True)
        else:
            return found
        for key in missing:  # the cache's own answers stand, even in check mode
            row = read.get(key)
            self.lookups.offer((table_id, key), row, ts)
            if row is not None:
                found[key] = row
        return found

    async def _checked_lookups(
        self,
        table_id: str,
        keys: list[bytes],
        missing: list[bytes],
        found: dict[bytes, bytes],
        ts: int,
    ) -> dict[bytes, bytes]:
        """Check mode: reads every key from the LTMs once, logs where a cache answer differs,
        and returns the rows read (the missing keys' answers among them)."""
        truth = await self.read_keys_at(table_id, keys, ts, own=True)
        for key in set(keys) - set(missing):
            if truth.get(key) != found.get(key):
                log.error(
                    "lookup cache mismatch: %s key %r at %d: cache %r, LTM %r",
                    table_id,
                    key,
                    ts,
                    found.get(key),
                    truth.get(key),
                )
        return truth

    def _warm(self, table_ids: set[str]) -> None:
        """Fills the lookup cache with the rows of newly cached tables, in the background."""
        if self._warming is not None:
            self._warming.cancel()
        self._warming = asyncio.get_running_loop().create_task(self._warm_from_snapshot(table_ids))

    async def _warm_from_snapshot(self, table_ids: set[str]) -> None:
        budget = self.lookups.max_rows // 2
        try:
            async with self.snapshot() as ts:
                for table_id in sorted(table_ids):
                    async for page in self.read_pages(table_id, b"", b"", ts):
                        for key, row in page[:budget]:
                            self.lookups.offer((table_id, key), row, ts + 1)
                        budget -= len(page)
                        if budget <= 0:
                            return
        except Exception as exc:  # noqa: BLE001 - e.g. an LTM down: lookups fill the cache
            log.info("lookup cache not warmed: %s", exc)

    async def read_range_at(
        self,
        table_id: str,
        start: bytes,
        stop: bytes,
        ts: int,
        *,
        limit: int = 0,
        own: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        request = lpb.ReadRequest(
            ts=ts, table=table_id, scan=True, start=start, stop=stop, limit=limit, register_read=own
        )
        replies = await asyncio.gather(*(self._read(p, request) for p in range(len(self.channels))))
        rows = sorted((kv.key, kv.row) for reply in replies for kv in reply.rows)
        return rows[:limit] if limit else rows

    async def read_pages(
        self, table_id: str, start: bytes, stop: bytes, ts: int, page_rows: int = 5000
    ) -> AsyncIterator[list[tuple[bytes, bytes]]]:
        """[start, stop) at ``ts`` page by page, LTM by LTM (not in key order across LTMs), for
        readers of whole tables: no reply ever holds more than ``page_rows`` rows. The caller
        keeps ``ts`` readable (a held snapshot, or its own undecided transaction)."""
        for channel in self.channels:
            cursor = start
            while True:
                reply = await channel.read(
                    lpb.ReadRequest(
                        ts=ts,
                        table=table_id,
                        scan=True,
                        start=cursor,
                        stop=stop,
                        limit=page_rows,
                        page=True,
                    )
                )
                if reply.rows:
                    yield [(kv.key, kv.row) for kv in reply.rows]
                if not reply.resume:
                    break
                cursor = reply.resume

    async def drop_table(self, table_id: str) -> None:
        await asyncio.gather(*(ch.drop_table(table_id) for ch in self.channels))


async def _settle(outcome: asyncio.Future[int], work: Awaitable[int]) -> None:
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


def _row_keys(ops: list[lpb.RowOp]) -> list[tuple[str, bytes]]:
    """The rows ``ops`` write, as the lookup cache names them."""
    return [(op.table, op.key) for op in ops]
