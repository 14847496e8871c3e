"""Replicated LTM logs: a partition's primary ships every log flush to its backup, which keeps
the same segment files; on failover the backup recovers the partition from the store plus that
copy, exactly as the primary would after a restart.

The primary counts a flush as durable once it is on its own disk *and* on the backup's, or once
the store's ownership record says the backup is out of sync (then the coordinator will not fail
over to it, and the partition waits for its primary instead of losing what was acknowledged).
A backup that falls out (a restart, a timeout) is brought back by a resync: the whole live log,
then every flush again. A member may record its copy out of sync only while it reaches a
majority of the members: cut off, it keeps the copy named in sync (the majority may fail over to
it) and its flushes wait instead of going on alone.

A flush stops waiting for a copy that leaves it unanswered after ``DROP_AFTER`` (0.3 s), not
``SHIP_TIMEOUT``, when the copy's member answers none of this member's probes sent since the
flush went and a majority without it does (``DropRule``): recording the copy out of sync is a
compare-and-set whose only cost is a resync later, and waiting longer stalled every commit on
the log."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Protocol

import grpc

from aggview import errors
from aggview.net import CONTROL_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wal import WriteAheadLog, sync_directory, write_all
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from ltm.store import ownership
from ltm.store.base import Store
from ltm.store.ownership import Superseded

log = logging.getLogger(__name__)

SHIP_TIMEOUT = 2.0  # a backup slower than this is dropped (and resynced) rather than waited for
SILENCE_POLL = 0.05  # seconds between looks at the prober's verdict while a flush waits
# A flush unanswered this long stops waiting for its copy when the copy's member answers no
# probe and a majority without it does (``DropRule``); doubled after each drop of a copy that
# turned out only slow, up to SHIP_TIMEOUT, back after DROP_CALM seconds without one
DROP_AFTER = 0.3
DROP_MARGIN = 0.1  # probes count from this long after the flush went
DROP_CALM = 30.0
RESYNC_EVERY = 1.0
HOLD_BACK_POLL = 0.1  # seconds between looks for a majority while a flush waits for one
RESYNC_TIMEOUT = 30.0  # per request of a resync
# per request of the part of a resync sent under the log's flush lock, while every flush
# waits: a copy that stops answering then holds the log back no longer than this
LOCKED_TIMEOUT = 5.0
CHUNK_BYTES = 4 << 20


def log_dir_of(base: Path, own_partition: int, partition: int) -> Path:
    """Where LTM ``own_partition`` keeps partition ``partition``'s log, as primary or backup:
    its own partition's in ``base`` itself, any other one's beside it."""
    return base if partition == own_partition else base / f"replica-{partition}"


class Mirror:
    """The backup's copy of one partition's log: the primary's segment files, byte for byte."""

    def __init__(self, directory: Path, partition: int, *, fsync: bool = True) -> None:
        self.directory = directory
        self.partition = partition
        self.fsync = fsync
        self.epoch = -1  # no resync received yet: appends are refused until one arrives
        self._dropped_before = 0  # segments below this one are gone already

    def apply(self, request: pb.ReplicateRequest) -> None:
        """Runs in a worker thread; everything is on disk when it returns."""
        if request.epoch < self.epoch:
            raise Superseded(
                f"partition {self.partition}: epoch {request.epoch} is older than {self.epoch}"
            )
        if not request.reset and self.epoch < 0:
            raise errors.FailedPrecondition(
                f"no copy of partition {self.partition}'s log here yet: resync first"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        if request.reset:
            for path in sorted(self.directory.glob("*.wal")):
                path.unlink()
            self._sync_directory()
            self._dropped_before = 0
        self.epoch = request.epoch
        created = False
        for chunk in request.chunks:
            path = self.directory / f"{chunk.segment:012d}.wal"
            created |= not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                write_all(fd, chunk.data)
                if self.fsync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
        if created:
            self._sync_directory()
        if request.drop_before > self._dropped_before:  # (every flush says it: look once)
            for path in sorted(self.directory.glob("*.wal")):  # oldest first, as the primary
                if int(path.stem) < request.drop_before:
                    path.unlink()
                    self._sync_directory()
            self._dropped_before = request.drop_before

    def _sync_directory(self) -> None:
        if self.fsync:
            sync_directory(self.directory)


class Hearing(Protocol):
    """What this member's prober heard, by member (``coordinator.quorum.Reachability``);
    times are ``time.monotonic()`` of the probes' sending."""

    members: int

    def answered_since(self, member: int, since: float) -> bool: ...

    def unanswered_since(self, member: int, since: float) -> bool: ...

    def majority_since(self, since: float, without: int) -> bool: ...


class DropRule:
    """When a flush stops waiting for the copy at ``member`` before ``SHIP_TIMEOUT``, and
    whether a copy so dropped may be resynced yet (pure over ``hearing`` and the times given).

    A flush sent at ``sent`` gives up once it has waited ``wait`` seconds, the copy's member
    answered no probe sent since ``sent + DROP_MARGIN``, and a majority without it (this
    member included) did: the network around this member is whole, so the silence is the
    copy's. A member cut off from the others hears no such majority and keeps waiting (held
    back, as ``LogShipper`` says), so the majority may still fail its partition over to the
    copy. The margin keeps a flush that was already waiting when a cut came from counting
    the last probes before it.

    A dropped copy is resynced only once its member answered a probe sent after the drop (a
    resync to a cut member would hold the log's flushes under its lock). If none of its
    probes since the flush went unanswered meanwhile, it was slow rather than gone (CPU
    starvation, a slow disk): the next drop waits twice as long, up to ``longest``, so a slow
    copy is not dropped and resynced over and over; ``calm`` seconds without such a drop
    bring the wait back to ``base``."""

    def __init__(
        self,
        hearing: Hearing,
        member: int,
        base: float = DROP_AFTER,
        longest: float = SHIP_TIMEOUT,
        calm: float = DROP_CALM,
    ) -> None:
        self.hearing = hearing
        self.member = member
        self.base, self.longest, self.calm = base, longest, calm
        self._backed_off = base  # the wait after the last drop of a copy only slow
        self._slow_at: float | None = None  # when that drop was found only slow
        self._dropped: tuple[float, float] | None = None  # (flush sent, dropped) awaiting resync

    def wait(self, now: float) -> float:
        """How long a flush waits for the copy before this rule may give up on it."""
        if self._slow_at is None or now - self._slow_at >= self.calm:
            return self.base
        return self._backed_off

    def give_up(self, sent: float, now: float) -> bool:
        """Whether a flush sent at ``sent`` and unanswered at ``now`` stops waiting."""
        since = sent + DROP_MARGIN
        return (
            now - sent >= self.wait(now) - 1e-9  # (floating point: 100.3 - 100.0 < 0.3)
            and not self.hearing.answered_since(self.member, since)
            and self.hearing.majority_since(since, self.member)
        )

    def dropped(self, sent: float, now: float) -> None:
        """The copy was recorded out of sync at ``now`` by this rule, for a flush sent at
        ``sent``."""
        self._dropped = (sent, now)

    def may_resync(self, now: float) -> bool:
        """Whether the copy may be resynced: always, unless this rule dropped it and its
        member answered no probe since (then the drop is judged: only slow, or gone)."""
        if self._dropped is None:
            return True
        sent, dropped = self._dropped
        if not self.hearing.answered_since(self.member, dropped):
            return False
        if not self.hearing.unanswered_since(self.member, sent):  # slow, not gone
            self._backed_off = min(2 * self.wait(now), self.longest)
            self._slow_at = now
        self._dropped = None
        return True


class FlushStream:
    """One ordered ``ReplicateStream`` to the backup: each flush is sent on it and answered in
    order once on the backup's disk. The first failure (an error from the backup, a broken
    connection) fails every flush still waiting, and the stream is done for: the shipper counts
    the backup out of sync and opens a new stream after the resync."""

    def __init__(self, stub: pb_grpc.LtmStub, metadata: tuple[tuple[str, str], ...]) -> None:
        self._outgoing: asyncio.Queue[pb.ReplicateRequest | None] = asyncio.Queue()
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self.failure: BaseException | None = None
        self._call = stub.ReplicateStream(self._requests(), metadata=metadata)
        self._reader = asyncio.get_running_loop().create_task(self._answers())

    async def _requests(self) -> AsyncIterator[pb.ReplicateRequest]:
        while (request := await self._outgoing.get()) is not None:
            yield request

    async def _answers(self) -> None:
        try:
            async for _ in self._call:
                self._waiting.popleft().set_result(None)
            failure: BaseException = errors.Unavailable("the backup ended the flush stream")
        except grpc.aio.AioRpcError as exc:
            failure = errors.Unavailable(f"{exc.code().name}: {exc.details()}")
        except asyncio.CancelledError:
            failure = errors.Unavailable("the flush stream was closed")
        self.failure = failure
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(failure)

    async def send(
        self,
        request: pb.ReplicateRequest,
        timeout: float,
        give_up: Callable[[float], bool] = lambda sent: False,
    ) -> None:
        """Raises TimeoutError when unanswered in ``timeout`` seconds, or earlier once
        ``give_up(sent)`` says so (``sent``: ``time.monotonic()`` when the request went;
        looked at every ``SILENCE_POLL`` seconds of the wait)."""
        if self.failure is not None:
            raise self.failure
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()
        self._waiting.append(answered)
        sent = time.monotonic()
        self._outgoing.put_nowait(request)
        deadline = loop.time() + timeout
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0 or give_up(sent):
                    raise TimeoutError
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(answered), min(left, SILENCE_POLL))
                    return
        except TimeoutError:  # its answer (or failure) may still come: nobody waits for it
            answered.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    async def close(self) -> None:
        self._outgoing.put_nowait(None)
        self._call.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


class LogShipper:
    """The primary's side: sends each flush of ``wal`` to the backup (see module docstring)."""

    def __init__(
        self,
        store: Store,
        wal: WriteAheadLog,
        record: ownership.Ownership,
        backup: int,
        backup_address: str,
        tls: TlsDir | None,
        may_drop: Callable[[], bool] = lambda: True,
        silent: Callable[[int], bool] = lambda backup: False,
        hearing: Hearing | None = None,
    ) -> None:
        """``may_drop()``: whether this process may record its unreachable copy as out of
        sync and go on alone (a member must reach a majority of the members for that);
        ``silent(backup)``: whether the member hosting LTM ``backup`` fell silent to this
        member's prober (``coordinator.quorum``); ``hearing``: that prober's answers, for
        dropping a copy sooner (``DropRule``; None: only ``silent`` and the timeout)."""
        self.store = store
        self.wal = wal
        self.may_drop = may_drop
        self.silent = silent
        self.drop_rule = None if hearing is None else DropRule(hearing, backup % hearing.members)
        self._quick = 0.0  # when the flush the drop rule gave up on went (0: none did)
        # Why flushes wait now (None: they don't): the copy is unreachable and dropping it is
        # not allowed, so the record still names it in sync and nothing is acknowledged that
        # it lacks; the majority may fail the partition over to it meanwhile.
        self.held_back: str | None = None
        self.record = record
        self.backup = backup
        self.backup_address = backup_address
        self._channel = member_channel(backup_address, tls, CONTROL_OPTIONS)
        self._stub = pb_grpc.LtmStub(self._channel)
        self._metadata = member_metadata(tls)
        self.in_sync = False
        self._resyncer: asyncio.Task[None] | None = None
        self._flushes: FlushStream | None = None  # open while in sync

    async def start(self) -> None:
        """Before the first flush: the standby is not known to be in sync until a resync (it
        may have missed flushes while this process was away)."""
        await self._set_in_sync(False)
        self.wal.shipper = self
        self._resyncer = asyncio.get_running_loop().create_task(self._resync_loop())

    async def close(self) -> None:
        self.wal.shipper = None
        if self._resyncer is not None:
            self._resyncer.cancel()
            await asyncio.gather(self._resyncer, return_exceptions=True)
        await self._close_flushes()
        await self._channel.close()

    async def _close_flushes(self) -> None:
        if self._flushes is not None:
            flushes, self._flushes = self._flushes, None
            await flushes.close()

    async def ship(self, segment: int, data: bytes, drop_before: int) -> None:
        """One flush to the backup, on the flush stream (a resync sends by calls)."""
        if not self.in_sync:
            return
        if self._flushes is None:
            self._flushes = FlushStream(self._stub, self._metadata)
        self._quick = 0.0
        started = time.monotonic()
        try:
            for request in self._requests(segment, data, drop_before=drop_before):
                await self._flushes.send(request, SHIP_TIMEOUT, self._give_up)
        except (errors.AggviewError, TimeoutError) as exc:
            await self._close_flushes()
            if not self.may_drop():
                await self._hold_back(exc)
            log.warning(
                "partition %d: backup LTM %d at %s fell out of sync (%s, %.2fs into a "
                "flush); serving without it",
                self.record.partition,
                self.backup,
                self.backup_address,
                str(exc) or ("no answer, nor to probes" if self._quick else "no answer"),
                time.monotonic() - started,
            )
            await self._set_in_sync(False)
            if self._quick and self.drop_rule is not None:
                self.drop_rule.dropped(self._quick, time.monotonic())

    def _give_up(self, sent: float) -> bool:
        """Whether a flush sent at ``sent`` stops waiting for the copy: its member is
        silent (``_gone``) or ``DropRule`` says so."""
        if self._gone():
            return True
        rule = self.drop_rule
        if rule is not None and self.may_drop() and rule.give_up(sent, time.monotonic()):
            self._quick = sent
            return True
        return False

    def _gone(self) -> bool:
        """Whether a flush waiting for the copy stops waiting before ``SHIP_TIMEOUT``: its
        member fell silent to the prober (no answer for a second) and this one reaches a
        majority, so the copy would be dropped anyway. A copy that answers probes, however
        slowly it writes, keeps the full timeout. The trace of a follower's cut showed every
        flush copied to the cut member waiting the 2 s, a floor under the cut's gap."""
        return self.silent(self.backup) and self.may_drop()

    async def _hold_back(self, exc: BaseException) -> None:
        """The copy does not answer and this member reaches no majority: the flush waits
        (and every flush behind it) until a majority answers, and then drops the copy as
        usual. Failing it instead would leave a commit decision written here but unknown,
        answered "pending" until a restart, its rows held at every participant. Meanwhile the
        majority may fail the partition over to the copy: then dropping it is refused
        (``Superseded``), the flush fails, and this member is fenced."""
        self.held_back = (
            f"partition {self.record.partition}: its copy at LTM {self.backup} "
            f"({self.backup_address}) does not answer ({exc or 'no answer in time'}) and this "
            "member reaches no majority of the members: its flushes wait for one"
        )
        log.warning("%s", self.held_back)
        while not self.may_drop():
            await asyncio.sleep(HOLD_BACK_POLL)

    async def _send(
        self,
        segment: int,
        data: bytes,
        *,
        reset: bool = False,
        drop_before: int = 0,
        timeout: float = RESYNC_TIMEOUT,
    ) -> None:
        """Appends ``data`` to the backup's copy of ``segment`` by calls."""
        for request in self._requests(segment, data, reset=reset, drop_before=drop_before):
            await self._stub.Replicate(request, timeout=timeout, metadata=self._metadata)

    def _requests(
        self, segment: int, data: bytes, *, reset: bool = False, drop_before: int = 0
    ) -> Iterator[pb.ReplicateRequest]:
        """``data`` for ``segment`` in requests of at most CHUNK_BYTES (a bulk load's log can
        outgrow a gRPC message)."""
        for offset in range(0, max(len(data), 1), CHUNK_BYTES):
            yield pb.ReplicateRequest(
                partition=self.record.partition,
                epoch=self.record.epoch,
                reset=reset and offset == 0,
                chunks=[pb.LogChunk(segment=segment, data=data[offset : offset + CHUNK_BYTES])],
                drop_before=drop_before,
            )

    async def _set_in_sync(self, in_sync: bool) -> None:
        """Recorded in the store before the next flush counts as durable: the coordinator
        fails over only to a backup the record names."""
        self.record = await asyncio.to_thread(self._record_backup, in_sync)
        self.in_sync = in_sync
        self.held_back = None

    def _record_backup(self, in_sync: bool) -> ownership.Ownership:
        updated = self.record.evolve(
            standby=self.backup, standby_address=self.backup_address, in_sync=in_sync
        )
        ownership.write_standby(self.store, updated)
        return updated

    async def _resync_loop(self) -> None:
        while True:
            # not to a copy whose member is silent: the part of a resync under the flush lock
            # would hold every flush back until the request timed out (a follower's cut
            # stopped its leader's commits until the heal)
            # nor to a copy the drop rule dropped, before its member answers again
            if not self.in_sync and not self.silent(self.backup) and self._may_resync():
                try:
                    await self.resync()
                except grpc.aio.AioRpcError as exc:
                    log.debug("resync of partition %d: %s", self.record.partition, exc.details())
                except Superseded:
                    raise
                except FileNotFoundError as exc:  # a checkpoint dropped it meanwhile
                    log.info("resync of partition %d starts over: %s", self.record.partition, exc)
                except Exception:
                    log.exception("resync of partition %d failed", self.record.partition)
            await asyncio.sleep(RESYNC_EVERY)

    def _may_resync(self) -> bool:
        """``DropRule.may_resync``, saying when a drop turned out to be of a copy only slow
        (its next drop waits longer: churn under CPU starvation shows in the log)."""
        rule = self.drop_rule
        if rule is None:
            return True
        now = time.monotonic()
        before = rule.wait(now)
        if not rule.may_resync(now):
            return False
        if rule.wait(now) > before:
            log.info(
                "partition %d: its copy at LTM %d was slow, not gone: the next drop of it "
                "waits %.1fs",
                self.record.partition,
                self.backup,
                rule.wait(now),
            )
        return True

    async def resync(self) -> None:
        """The whole live log to the backup, then every flush again. Sealed segments (which
        no flush writes to any more, often nearly all of it) are copied while flushes go on;
        only the rest is copied between two flushes, under the WAL's flush lock."""
        copied: set[int] = set()
        reset = True
        for segment in self.wal.sealed():
            await self._send(
                segment, await asyncio.to_thread(self.wal.read_segment, segment), reset=reset
            )
            copied.add(segment)
            reset = False
        async with self.wal.held():
            rest = [s for s in self.wal.segments() if s not in copied]
            for segment in rest or [self.wal.segment]:
                data = await asyncio.to_thread(self.wal.read_segment, segment) if rest else b""
                await self._send(segment, data, reset=reset, timeout=LOCKED_TIMEOUT)
                reset = False
            await self._set_in_sync(True)
        log.info(
            "partition %d: backup LTM %d in sync (%d sealed segments, %d more under the lock)",
            self.record.partition,
            self.backup,
            len(copied),
            len(rest),
        )
