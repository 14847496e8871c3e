"""Write-ahead log with group commit, in numbered segment files.

Records are appended to the current segment; every appender waits for one shared ``fsync`` that
covers everything appended since the previous one (group commit), so many concurrent
transactions cost one disk flush. A checkpoint rotates to a new segment and, once the store
holds everything the old segments describe, drops them. A torn record at the end of the last
segment (a crash mid-write) ends replay; it was never acknowledged.

Records are pickled dicts, and unpickling runs what it decodes: log bytes may come only from
this process or a cluster member. A backup's copy of a log (``ltm/replication.py``) does arrive
over the network, from the primary, on the members-only channel (mutual TLS and the cluster
secret; ``--insecure`` only on one trusted machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import queue
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from aggview import errors

_HEADER = struct.Struct(">II")  # length, crc32


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # os.write may write less than asked (a full disk, a signal)
        view = view[os.write(fd, view) :]


def sync_directory(directory: Path) -> None:
    """Makes a file's creation or removal in ``directory`` durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Shipper(Protocol):
    """Where a replicated log sends each flush (see ``ltm.replication``)."""

    async def ship(self, segment: int, data: bytes, drop_before: int) -> None: ...


class WriteAheadLog:
    def __init__(
        self,
        directory: Path,
        *,
        fsync: bool = True,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        """``observe``: called with each flush's seconds, on the log's thread (metrics)."""
        self.directory = directory
        self.fsync = fsync
        self.observe = observe
        directory.mkdir(parents=True, exist_ok=True)
        segments = self.segments()
        self._segment = segments[-1] + 1 if segments else 1
        self._fd = self._open(self._segment)
        # Records queued (appended by the loop, taken by the log's thread, under the mutex)
        # and who waits for them: (the LSN that must be durable, its future), in LSN order.
        self._mutex = threading.Lock()
        self._pending: list[bytes] = []
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._draining = False  # the thread is taking groups itself (no shipper)
        self._queued = 0  # the LSN of the last record this object queued (0: none yet)
        self._done_upto = 0  # the LSN up to which every group is done (synced, or failed)
        self._flusher: asyncio.Task[None] | None = None
        self._retired: list[int] = []  # old segments' descriptors, synced and closed by the flusher
        self.lsn = 0  # sequence number of the last record queued (or replayed)
        self.bytes_written = 0
        self.flushes = 0
        # The log's own thread for writes and syncs (started by the first flush): a job is
        # one queue put, cheaper on the event loop than an executor's submit and future.
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._syncer: threading.Thread | None = None
        self._closed = False
        # Replication: each flush also goes to the backup, and counts as durable only once it
        # is there too. Held for a whole flush, so a resync sees exactly the flushed files.
        self.shipper: Shipper | None = None
        self.flush_lock = asyncio.Lock()
        self.closed_to_writes: str | None = None  # why nothing more is written (a handover)
        self._dropped_before = 0
        self._flushing = self._segment  # the segment the flush under way writes to
        # Whether a group may be written and synced on the loop's thread, which it blocks:
        # when nothing else would run meanwhile (a member's undecided transactions all wait
        # for it), handing it to the log's thread and hearing back cost more than the wait
        # (see ``_kick``). Asked at the kick; the flush runs in the loop's next pass.
        self.flush_here: Callable[[], bool] = _never
        self._here_due = False  # a flush on the loop's thread is called for, in its next pass

    def read_segment(self, segment: int) -> bytes:
        """A segment's flushed bytes (all of them once it is sealed; read the others inside
        :meth:`held` for a consistent copy)."""
        return self._path(segment).read_bytes()

    def sealed(self) -> list[int]:
        """Segments no flush writes to any more: below the current one and below the one a
        flush under way writes to. A backup's resync copies these without stopping flushes."""
        return [s for s in self.segments() if s < self._flushing]

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.directory.glob("*.wal"))

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:012d}.wal"

    def _open(self, segment: int) -> int:
        fd = os.open(self._path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._sync_directory()
        return fd

    def replay(self) -> Iterator[dict[str, Any]]:
        """Every intact record of every segment, oldest first (call before appending)."""
        for segment in self.segments():
            data = self._path(segment).read_bytes()
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, crc = _HEADER.unpack_from(data, offset)
                body = data[offset + _HEADER.size : offset + _HEADER.size + length]
                if len(body) < length or zlib.crc32(body) != crc:
                    break  # torn tail: never acknowledged
                record = pickle.loads(body)
                self.lsn = max(self.lsn, record.get("lsn", 0))
                yield record
                offset += _HEADER.size + length

    def write(self, record: dict[str, Any], *, flush: bool = True, tag: str | None = None) -> int:
        """Queues a record without waiting for it to be durable (e.g. an abort: presumed) and
        returns its log sequence number (LSN): records replay in LSN order, and what a
        checkpoint stored is known by the LSN of the last change it contains. ``tag``: whose
        record it is, in a log several writers share (``aggview.member_log``)."""
        if self.closed_to_writes:
            raise errors.FailedPrecondition(self.closed_to_writes)
        lsn = self.lsn + 1
        stamped = {**record, "lsn": lsn} if tag is None else {**record, "lsn": lsn, "log": tag}
        data = _framed(stamped)
        with self._mutex:  # the log's thread takes the queued records and the LSN together
            self.lsn = self._queued = lsn
            self._pending.append(data)
        if flush:
            self._kick()
        return lsn

    def number_above(self, lsn: int) -> None:
        """Numbers later records above ``lsn`` (one the store holds from another log)."""
        with self._mutex:
            self.lsn = max(self.lsn, lsn)

    def copy(self, records: Iterable[dict[str, Any]]) -> None:
        """Queues records taken from another log as they are, their LSNs included (a log
        moving to another layout: what the store holds is known by those LSNs), then a mark
        of this log's own above them all, so that later records are numbered above every
        copied one and :meth:`flush` waits for them."""
        with self._mutex:
            for record in records:
                self.lsn = max(self.lsn, record.get("lsn", 0))
                self._pending.append(_framed(record))
        self.write({"kind": "mark", "ts": 0}, flush=False)

    def write_now(self) -> None:
        """Writes and syncs what is queued on the caller's thread: only before the log's own
        thread has started (at start-up, e.g. records copied in from another log)."""
        if self._syncer is not None:
            raise RuntimeError("the log's thread runs: flush() instead")
        with self._mutex:
            chunk, fd, retired, upto = self._take()
        self._write_and_sync(fd, chunk, retired)
        self._synced(upto, len(chunk), None)

    def close_now(self) -> None:
        """Closes a log that never started its thread (read, or written by :meth:`write_now`)."""
        if self._syncer is not None or self._pending:
            raise RuntimeError("the log has a thread or queued records: close() instead")
        os.close(self._fd)
        self._closed = True

    async def append(self, record: dict[str, Any], tag: str | None = None) -> int:
        """Queues a record and returns its LSN once it is on disk."""
        lsn = self.write(record, flush=False, tag=tag)
        await self.flush()  # waits for it, whether the flush runs on a thread or here
        return lsn

    def flush(self) -> asyncio.Future[None]:
        """A future done once everything queued so far is durable: a plain future, not a
        coroutine, so a caller in this process may wait for it without a task (a local
        participant's decision, ``coordinator.local_ltm``)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._queued <= self._done_upto:
            # its group is done (a failed one's appenders heard why), or none was
            waiter.set_result(None)
            return waiter
        # The rest is queued (the thread takes it before it stops) or in a group under way.
        self._waiters.append((self._queued, waiter))
        self._kick()
        return waiter

    def _kick(self) -> None:
        """Group commit: everything queued while the previous flush ran is written and synced
        at once, on the log's own thread, so the event loop keeps preparing the next group
        meanwhile (on the loop thread, an LTM spent two thirds of its time blocked in
        fdatasync under load). Unreplicated, that thread takes each next group itself as
        soon as a sync ends, and the loop only hears that a group is durable; a replicated
        log's flushes are driven from the loop, which ships each one to the backup."""
        loop = asyncio.get_running_loop()
        if self.shipper is None:
            with self._mutex:
                if self._draining or self._here_due or not self._pending:
                    return  # the thread, or the flush due here, takes what is queued
                self._here_due = self.flush_here()
                if not self._here_due:
                    self._draining = True
            if self._here_due:  # in the next pass: what this one queues goes along
                loop.call_soon(self._flush_here_now)
                return
            try:
                self._on_thread(lambda: self._drain(loop))
            except errors.Unavailable as exc:  # closed: the appenders hear it
                self._draining = False
                loop.call_soon(self._synced, self._queued, 0, exc)
        elif self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush_loop())

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the log's thread: writes and syncs group after group until nothing is queued."""
        while True:
            with self._mutex:
                if self.shipper is not None:  # replicated now: the loop takes the rest
                    self._draining = False
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(self._kick)
                    return
                if not self._pending:
                    self._draining = False
                    return
                if self._closed:  # written after the close: nowhere, and its appenders hear it
                    self._draining = False
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(
                            self._synced, self._queued, 0, self._closed_error()
                        )
                    return
                chunk, fd, retired, upto = self._take()
            self._sync_then(
                loop, fd, chunk, retired, functools.partial(self._synced, upto, len(chunk))
            )

    def _sync_then(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        chunk: bytes,
        retired: list[int],
        then: Callable[[BaseException | None], None],
    ) -> None:
        """On the log's thread: writes and syncs a group, then runs ``then(error)`` on the
        loop (the group's appenders hear of a failure)."""
        error, took = self._write_timed(fd, chunk, retired)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(then, error)
        self._observe(error, took)

    def _write_timed(
        self, fd: int, chunk: bytes, retired: list[int]
    ) -> tuple[BaseException | None, float]:
        """Writes and syncs a group: its error (handed to its appenders), and its seconds."""
        started = time.perf_counter()
        try:
            self._write_and_sync(fd, chunk, retired)
        except Exception as exc:  # noqa: BLE001 - the group's appenders hear it
            return exc, time.perf_counter() - started
        return None, time.perf_counter() - started

    def _observe(self, error: BaseException | None, took: float) -> None:
        """A flush's seconds to ``observe`` (metrics), once its waiters are told."""
        if error is None and self.observe is not None:
            self.observe(took)

    def _flush_here_now(self) -> None:
        """Writes and syncs a group on the loop's thread (``flush_here``): the commits
        waiting for it then cost no wake-up of the log's thread, nor of the loop when it is
        done."""
        with self._mutex:
            self._here_due = False
            if self._draining or not self._pending:
                return
            closed = self._closed
            if not closed and self.shipper is None:
                chunk, fd, retired, upto = self._take()
        if closed:  # as on the thread (``_on_thread``): nothing written, the appenders hear it
            self._synced(self._queued, 0, self._closed_error())
            return
        if self.shipper is not None:  # replicated meanwhile: every flush goes to the copy too
            self._kick()
            return
        error, took = self._write_timed(fd, chunk, retired)
        self._synced(upto, len(chunk), error)
        self._observe(error, took)

    def _take(self) -> tuple[bytes, int, list[int], int]:
        """The next group (hold the mutex): its bytes, the descriptor to write them to, old
        segments' descriptors to sync and close first, and the last LSN it holds."""
        chunk, self._pending = b"".join(self._pending), []
        fd, retired, self._retired = self._fd, self._retired, []
        self._flushing = self._segment
        return chunk, fd, retired, self._queued

    async def _flush_loop(self) -> None:
        while self._pending or self._waiters:
            async with self.held():
                with self._mutex:
                    chunk, fd, retired, upto = self._take()
                error: BaseException | None = None
                try:
                    await self._flush(self._flushing, fd, chunk, retired)
                except Exception as exc:  # noqa: BLE001 - e.g. the log was closed
                    error = exc
                self._synced(upto, len(chunk), error)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """No flush runs meanwhile (a backup's resync copies the files as flushed)."""
        async with self.flush_lock:
            while self._draining:  # the thread's last unreplicated group (rare: at a switch)
                await asyncio.sleep(0.001)
            yield

    async def _flush(self, segment: int, fd: int, chunk: bytes, retired: list[int]) -> None:
        """Writes and syncs one group of a replicated log and ships it to the backup; it
        counts as durable once both are done."""
        loop = asyncio.get_running_loop()
        synced: asyncio.Future[None] = loop.create_future()

        self._on_thread(
            lambda: self._sync_then(loop, fd, chunk, retired, functools.partial(_settle, synced))
        )
        work: list[Awaitable[None]] = [synced]
        if self.shipper is not None:
            work.append(self.shipper.ship(segment, chunk, self._dropped_before))
        results = await asyncio.gather(*work, return_exceptions=True)
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            raise failures[0]

    def _on_thread(self, job: Callable[[], None]) -> None:
        """Runs ``job`` on the log's thread, after the jobs queued before it."""
        if self._closed:
            raise self._closed_error()
        if self._syncer is None:
            self._syncer = threading.Thread(target=self._run_jobs, name="wal-sync", daemon=True)
            self._syncer.start()
        self._jobs.put(job)

    def _closed_error(self) -> errors.Unavailable:
        return errors.Unavailable(f"the log in {self.directory} is closed")

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def _synced(self, upto: int, written: int, error: BaseException | None) -> None:
        """On the loop: every record up to LSN ``upto`` is durable, or failed with ``error``."""
        if error is None:
            self.bytes_written += written
            self.flushes += 1
        self._done_upto = max(self._done_upto, upto)
        while self._waiters and self._waiters[0][0] <= upto:
            _, waiter = self._waiters.popleft()
            _settle(waiter, error)

    def _write_and_sync(self, fd: int, chunk: bytes, retired: list[int]) -> None:
        for old in retired:  # records written there before the switch must be durable too
            if self.fsync:
                os.fdatasync(old)
            os.close(old)
        write_all(fd, chunk)
        if self.fsync:
            os.fdatasync(fd)

    @property
    def segment(self) -> int:
        """The segment new records go to."""
        return self._segment

    def switch(self, carry: list[dict[str, Any]], tag: str | None = None) -> int:
        """Starts a new segment at once (no await, so a caller can take a consistent snapshot
        of its state in the same step), queues ``carry`` (records still needed, such as
        undecided PREPARED records) and returns the new segment's number. Older segments stay
        until :meth:`drop_before`; a mark record keeps the LSN known even if they all go."""
        fd = self._open(self._segment + 1)
        with self._mutex:  # the thread takes the descriptor with the records queued for it
            self._retired.append(self._fd)
            self._segment += 1
            self._fd = fd
        self.write({"kind": "mark", "ts": 0})
        for record in carry:
            self.write(record, tag=tag)
        return self._segment

    async def rotate(self, carry: list[dict[str, Any]], tag: str | None = None) -> int:
        """:meth:`switch`, then wait until the carried records are durable."""
        segment = self.switch(carry, tag)
        await self.flush()
        return segment

    def drop_before(self, segment: int) -> None:
        """Removes older segments strictly oldest first (the directory is synced after each),
        so a crash never leaves an old segment behind without the newer ones. A backup hears of
        it with the next flush: keeping old segments longer is harmless, as replay is by LSN."""
        self._dropped_before = max(self._dropped_before, segment)
        for old in self.segments():
            if old < segment:
                self._path(old).unlink(missing_ok=True)
                self._sync_directory()

    def _sync_directory(self) -> None:
        if self.fsync:
            sync_directory(self.directory)

    def size(self) -> int:
        return sum(self._path(s).stat().st_size for s in self.segments())

    async def close(self, clean: bool = False) -> None:
        """``clean``: its writer needs none of its records any more (unused here: it
        matters in a log several writers share, ``aggview.member_log``)."""
        await self.flush()
        with self._mutex:  # no group is taken for the descriptor from now on
            self._closed = True
        os.close(self._fd)
        self._jobs.put(None)  # the thread ends after what is queued


def _framed(record: dict[str, Any]) -> bytes:
    """A record as a segment holds it: length and CRC32, then the pickled record."""
    body = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def _never() -> bool:
    return False


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if not future.done():
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
