"""One write-ahead log for a member's partitions and its decisions.

A member whose logs are not copied to other members (no ``--replicate``) writes every record of
the partitions it hosts and of its decision log into one :class:`~aggview.wal.WriteAheadLog`,
each record tagged with its writer. Group commit then spans every transaction of the member: a
commit whose partitions are all here is durable with one flush for its prepares and its
decision, and two partitions' prepares share a flush instead of syncing two files. Its
decision record is then its participants' commit record too (:func:`as_replayed`): such a
commit writes one record a participant and one more, not two a participant and two more.

Each writer sees a log of its own (:class:`LogWriter`, the part of ``WriteAheadLog`` that a
participant and a decision log use): its records replayed, its segments released. A segment is
removed once every writer has released it (each checkpoints on its own schedule), and a writer
whose records are in the log but who never came back keeps them all.

A writer's log of its own (the layout before this one, or the one a member that copies its
logs to others uses) is copied in when the shared log opens, with its LSNs, which the store's
rows carry, and later records are numbered above them; :func:`split` is the way back. Either
copy skips records whose LSN the target holds already, so one cut short by a crash is redone
exactly.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.wal import WriteAheadLog

log = logging.getLogger(__name__)

DECISIONS = "decisions"  # the decision log's tag; a partition's is ``partition_tag(p)``
NOTHING = sys.maxsize  # what ``LogWriter.needs`` says of a writer that needs no segment
CLOSED = "closed"  # a writer's last record when it stopped needing all of its records


def partition_tag(partition: int) -> str:
    return f"partition-{partition}"


class SharedLog:
    """The member's one log and its writers."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync: bool = True,
        observe: Callable[[float], None] | None = None,
        own: dict[str, Path] | None = None,
    ) -> None:
        """``own``: each writer that may join, with the directory of its log of its own,
        whose records are copied in; records of another writer refuse the start (none:
        any writer may join)."""
        self.wal = WriteAheadLog(directory, fsync=fsync, observe=observe)
        self._records: dict[str, list[dict[str, Any]]] = {}
        for record in self.wal.replay():
            if record.get("log") is not None:  # untagged: the log's own marks
                for tag, mine in as_replayed(record):
                    self._records.setdefault(tag, []).append(mine)
        for tag, path in (own or {}).items():
            if any(path.glob("*.wal")):
                self._take_in(tag, path)
        closed = {tag for tag, records in self._records.items() if records[-1]["kind"] == CLOSED}
        strays = set(self._records) - set(own or self._records) - closed
        if strays:
            self.wal.close_now()
            raise _not_hosted(directory, strays)
        self._writers: dict[str, LogWriter] = {}
        # the oldest segment each writer may still need: a writer with records here that has
        # not joined this run needs them all, unless it closed clean
        self._keep: dict[str, int] = {t: NOTHING if t in closed else 0 for t in self._records}

    @property
    def directory(self) -> Path:
        return self.wal.directory

    def writer(self, tag: str) -> LogWriter:
        """Joins ``tag`` to the log."""
        if tag in self._writers:
            raise errors.FailedPrecondition(f"{tag} already writes to {self.directory}")
        writer = LogWriter(self, tag, self._records.pop(tag, []))
        self._writers[tag] = writer
        self._keep[tag] = 0
        return writer

    def _take_in(self, tag: str, own: Path) -> None:
        """Copies a writer's own log in and syncs it (no thread runs yet), then removes its
        segment files."""
        old = WriteAheadLog(own, fsync=self.wal.fsync)
        records = [r for r in old.replay() if r["kind"] != "mark"]
        held = {r["lsn"] for r in self._records.get(tag, ())}
        copied = _copy_into(self.wal, records, old.lsn, tag, held)
        if copied:
            self._records.setdefault(tag, []).extend(copied)
        old.close_now()
        _remove_segments(old)
        log.info("%s: its own log (%d records) joined %s", tag, len(copied), self.directory)

    def release(self, tag: str, segment: int) -> None:
        """``tag`` needs nothing below ``segment`` any more: drops what nobody needs."""
        self._keep[tag] = max(self._keep.get(tag, 0), segment)
        needed = [
            writer.needs() if (writer := self._writers.get(t)) and writer.needs else kept
            for t, kept in self._keep.items()
        ]
        self.wal.drop_before(min(*needed, self.wal.segment))  # never the one written to

    async def left(self, tag: str) -> None:
        """A writer closed: the log closes after the last one."""
        self._writers.pop(tag, None)
        if not self._writers:
            await self.wal.close()
        else:
            await self.wal.flush()


class LogWriter:
    """One writer's view of a :class:`SharedLog`: what a participant and a decision log call
    on a ``WriteAheadLog`` of their own."""

    def __init__(self, shared: SharedLog, tag: str, records: list[dict[str, Any]]) -> None:
        self.shared = shared
        self.tag = tag
        self._replay: list[dict[str, Any]] | None = records
        self.closed_to_writes: str | None = None
        # The oldest segment the writer needs, asked at each drop (a decision log knows it
        # from its commits); None: the segment it last released (a participant's checkpoint).
        self.needs: Callable[[], int] | None = None

    @property
    def directory(self) -> Path:
        return self.shared.directory

    @property
    def lsn(self) -> int:
        return self.shared.wal.lsn

    @property
    def segment(self) -> int:
        return self.shared.wal.segment

    def replay(self) -> Iterator[dict[str, Any]]:
        """This writer's records, oldest first (once: the log keeps no copy)."""
        records, self._replay = self._replay or [], None
        yield from records

    def number_above(self, lsn: int) -> None:
        self.shared.wal.number_above(lsn)

    def write(self, record: dict[str, Any], *, flush: bool = True) -> int:
        if self.closed_to_writes:
            raise errors.FailedPrecondition(self.closed_to_writes)
        return self.shared.wal.write(record, flush=flush, tag=self.tag)

    async def append(self, record: dict[str, Any]) -> int:
        if self.closed_to_writes:
            raise errors.FailedPrecondition(self.closed_to_writes)
        return await self.shared.wal.append(record, self.tag)

    def flush(self) -> asyncio.Future[None]:
        return self.shared.wal.flush()

    def switch(self, carry: list[dict[str, Any]]) -> int:
        return self.shared.wal.switch(carry, self.tag)

    async def rotate(self, carry: list[dict[str, Any]]) -> int:
        return await self.shared.wal.rotate(carry, self.tag)

    def drop_before(self, segment: int) -> None:
        self.shared.release(self.tag, segment)

    def size(self) -> int:
        return self.shared.wal.size()

    def segments(self) -> list[int]:
        return self.shared.wal.segments()

    async def close(self, clean: bool = False) -> None:
        """``clean``: the writer needs none of its records any more (all stored, nothing
        undecided), which a mark says: a later start that does not host it may ignore them."""
        if clean:
            self.shared.wal.write({"kind": CLOSED, "ts": 0}, flush=False, tag=self.tag)
        await self.shared.left(self.tag)


def split(directory: Path, own: dict[str, Path], *, fsync: bool = True) -> None:
    """Copies a shared log's records, if any, into each writer's own log (``own``: where
    each writer's is), LSNs included, and numbers every writer's later records above all the
    shared log gave (what the store holds carries them, even once no record is left), then
    removes it: a member that starts copying its logs to other members logs each partition
    on its own."""
    if not any(directory.glob("*.wal")):
        return
    shared = WriteAheadLog(directory, fsync=fsync)
    by_tag: dict[str, list[dict[str, Any]]] = {tag: [] for tag in own}
    for record in shared.replay():
        if record.get("log") is not None and record["kind"] != "mark":
            for tag, mine in as_replayed(record):
                by_tag.setdefault(tag, []).append(mine)
    strays = set(by_tag) - set(own)
    if strays:
        shared.close_now()
        raise _not_hosted(directory, strays)
    for tag, records in by_tag.items():
        target = WriteAheadLog(own[tag], fsync=fsync)
        held = {r["lsn"] for r in target.replay()}
        _copy_into(target, records, shared.lsn, None, held)
        target.close_now()
    shared.close_now()
    _remove_segments(shared)
    log.info("the shared log in %s was split into its writers' own logs", directory)


def as_replayed(record: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A tagged record as its writers replay it, (tag, record) each. A decision record that
    is its participants' commit record too (``with``: their writers' tags, written where
    every participant of a transaction writes to the decision log's log) is a commit record
    of each participant, at its LSN, and nothing the decision log needs: there is nothing
    left to deliver."""
    also = record.get("with")
    if also is None:
        yield record["log"], record
        return
    for tag in also:
        yield tag, {"kind": "commit", "ts": record["ts"], "lsn": record["lsn"], "log": tag}


def _copy_into(
    target: WriteAheadLog,
    records: list[dict[str, Any]],
    above: int,
    tag: str | None,
    held: set[int],
) -> list[dict[str, Any]]:
    """Copies ``records`` (``tag``: as whose, None: untagged) into ``target`` unless it holds
    their LSN already (``held``: a copy redone after a crash), numbering its later records
    above ``above``; syncs and returns what it copied. ``target`` runs no thread yet."""
    copied = []
    for record in records:
        if record["lsn"] not in held:
            mine = {k: v for k, v in record.items() if k != "log"}
            copied.append(mine if tag is None else {**mine, "log": tag})
    target.copy([*copied, {"kind": "mark", "ts": 0, "lsn": above}])
    target.write_now()
    return copied


def _not_hosted(directory: Path, tags: set[str]) -> errors.FailedPrecondition:
    return errors.FailedPrecondition(
        f"{directory} holds records of {', '.join(sorted(tags))}, which this member does not "
        "host: start it in the layout it last ran in"
    )


def shared_log_of(wal: WriteAheadLog | LogWriter) -> SharedLog | None:
    """The member's one log that ``wal`` writes to, if it is one's writer."""
    return wal.shared if isinstance(wal, LogWriter) else None


def _remove_segments(wal: WriteAheadLog) -> None:
    """Removes a log's segment files, oldest first, its directory synced after each."""
    wal.drop_before(wal.segment + 1)
