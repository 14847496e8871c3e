"""The coordinator's durable record of commit decisions (presumed abort: aborts are not logged).

A commit decision stays until every participant has acknowledged it; until then an LTM that
asks about the transaction (after its own restart, or ours) learns it committed. Anything not
here and not in flight is aborted.

A replicated log can hold commits that never counted as logged: written here, refused by the
copy because another member had taken the log over (this member was declared dead while
alive). ``reconcile`` forgets them once the adopter says which commits its copy held."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggview.loops import pass_on
from aggview.member_log import NOTHING, LogWriter, SharedLog, shared_log_of
from aggview.wal import WriteAheadLog

COMPACT_BYTES = 4 * 1024 * 1024


class DecisionLog:
    def __init__(
        self,
        directory: Path,
        *,
        fsync: bool = True,
        observe: Callable[[float], None] | None = None,
        log: LogWriter | None = None,
    ) -> None:
        """``observe``: called with each flush's seconds (metrics); ``log``: the member's
        shared log to write to instead of one of its own in ``directory``."""
        self.wal: WriteAheadLog | LogWriter = log or WriteAheadLog(
            directory, fsync=fsync, observe=observe
        )
        self.committed: dict[int, list[int]] = {}  # ts -> participants not yet acknowledged
        self.reconciled = 0  # the newest adoption of this log reconciled with (an epoch)
        for record in self.wal.replay():
            if record["kind"] == "commit":
                self.committed[record["ts"]] = record["participants"]
            elif record["kind"] == "done":
                self.committed.pop(record["ts"], None)
            elif record["kind"] == "reconciled":
                self.reconciled = max(self.reconciled, record["epoch"])
        self._logging: dict[int, list[int]] = {}  # commits whose record is being written
        self._written_since_compaction = 0
        self._compacting = False
        # In a member's one log, the segment of each commit record, oldest first (0: from
        # before this start): the log asks which it still needs whenever a partition's
        # checkpoint drops segments, or none would ever go before a compaction.
        self._segments: deque[tuple[int, int]] | None = None
        if isinstance(self.wal, LogWriter):
            self._segments = deque((0, ts) for ts in self.committed)
            self.wal.needs = self._needs

    @property
    def log(self) -> SharedLog | None:
        """The member's one log, if this decision log writes to it."""
        return shared_log_of(self.wal)

    async def commit(self, ts: int, participants: list[int]) -> None:
        await self.log_commit(ts, participants)

    def log_commit(self, ts: int, participants: list[int]) -> asyncio.Future[None]:
        """Queues the commit record now (the decision point) and returns a future done once
        it is durable: a caller that goes away cancels only that future."""
        record = {"kind": "commit", "ts": ts, "participants": participants}
        return self._log(ts, participants, record, delivered=False)[1]

    def log_decided(
        self, ts: int, participants: list[int], tags: list[str]
    ) -> tuple[int, asyncio.Future[None]]:
        """:meth:`log_commit` for participants that all write to this log (a member's one
        log; ``tags``: their writers'): the record is their commit record too, which
        ``aggview.member_log`` hands to each at replay, so there is nothing to deliver and
        nothing to remember once it is durable. Returns its LSN, and the future; raises only
        if nothing was queued."""
        record = {"kind": "commit", "ts": ts, "participants": participants, "with": tags}
        return self._log(ts, participants, record, delivered=True)

    def _log(
        self, ts: int, participants: list[int], record: dict[str, Any], delivered: bool
    ) -> tuple[int, asyncio.Future[None]]:
        # Counted as committed (and answered so) only once durable, but carried by a
        # compaction meanwhile: its record may be in the segment the compaction drops.
        self._logging[ts] = participants
        if self._segments is not None:
            self._segments.append((self.wal.segment, ts))
        logged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            lsn = self.wal.write(record)
        except BaseException:  # nothing queued
            del self._logging[ts]
            raise
        try:
            durable = self.wal.flush()
        except Exception as exc:  # noqa: BLE001 - queued, its outcome unknown: heard as its flush's
            durable = asyncio.get_running_loop().create_future()
            durable.set_exception(exc)

        def flushed(durable: asyncio.Future[None]) -> None:
            del self._logging[ts]
            if not delivered and not durable.cancelled() and durable.exception() is None:
                self.committed[ts] = participants
                self._written_since_compaction += 1
            pass_on(durable, logged)

        durable.add_done_callback(flushed)
        return lsn, logged

    def undelivered(self, ts: int, participants: list[int]) -> None:
        """A commit logged by :meth:`log_decided` that some of its ``participants`` could not
        take from it (one fenced meanwhile, say): remembered until they acknowledge it, as
        a :meth:`log_commit` is (its record is theirs on disk: a restart needs nothing more)."""
        self.committed[ts] = participants

    def done(self, ts: int) -> None:
        """Every participant has the commit: forget it. The record needs no flush of its own
        (it goes out with the next commit's): replaying a commit without it only re-sends a
        decision the LTMs ignore."""
        if self.committed.pop(ts, None) is not None:
            self.wal.write({"kind": "done", "ts": ts}, flush=False)
            self._written_since_compaction += 1
            if self._written_since_compaction > 50_000:
                self._compact_soon()

    def _compact_soon(self) -> None:
        if not self._compacting:
            self._compacting = True
            task = asyncio.get_running_loop().create_task(self.compact())
            task.add_done_callback(lambda _: setattr(self, "_compacting", False))

    def _needs(self) -> int:
        """The oldest segment holding a commit record still needed (the done records of
        those below may go with them: replaying a done alone does nothing). One that holds
        the member's log back (its participant's member is down, say) is carried forward by
        a compaction, so the partitions' records behind it can go."""
        assert self._segments is not None
        segments = self._segments
        while (
            segments
            and segments[0][1] not in self.committed
            and (segments[0][1] not in self._logging)
        ):
            segments.popleft()
        if not segments:
            return NOTHING
        if segments[0][0] < self.wal.segment - 1:
            self._compact_soon()
        return segments[0][0]

    async def reconcile(self, epoch: int, copied: set[int]) -> list[int]:
        """Another member adopted this log at ``epoch`` from a copy holding the commits
        ``copied``, and answered "aborted" for any other: forgets every commit not copied
        (durably, with a mark so that a restart does not reconcile again) and returns them."""
        if epoch <= self.reconciled:
            return []
        forgotten = sorted(ts for ts in self.committed if ts not in copied)
        for ts in forgotten:
            del self.committed[ts]
            self.wal.write({"kind": "done", "ts": ts}, flush=False)
        await self.wal.append({"kind": "reconciled", "epoch": epoch})
        self.reconciled = epoch
        return forgotten

    async def compact(self) -> None:
        self._written_since_compaction = 0
        carry: list[dict[str, Any]] = [{"kind": "reconciled", "epoch": self.reconciled}]
        carry += [
            {"kind": "commit", "ts": ts, "participants": participants}
            for ts, participants in {**self.committed, **self._logging}.items()
        ]
        segment = await self.wal.rotate(carry)
        if self._segments is not None:  # the carried records are durable in ``segment``
            carried = [record["ts"] for record in carry[1:]]
            moved = set(carried)
            later = [(s, ts) for s, ts in self._segments if ts not in moved]
            self._segments = deque([(segment, ts) for ts in carried] + later)
        self.wal.drop_before(segment)

    async def close(self) -> None:
        await self.wal.close(clean=not (self.committed or self._logging))
