"""A coordinating member's side of the cluster clock (``coordinator.clock``).

It gives the member's transactions their timestamps and its reads theirs, each counted in the
member's in-flight set in the very step it arrives (so no report can miss it), and wakes those
waiting until the cluster has decided everything up to a timestamp. ``LeaderClock`` holds the
clock itself (member 0, and the only member of a one-coordinator cluster): every call is a
direct one. ``FollowerClock`` (``coordinator.clock_service``) asks the leader over a stream.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from aggview import errors
from coordinator.clock import Clock, Marks, Notice, RowKey, Writes
from coordinator.leadership import Lease


class InFlight:
    """This member's timestamps handed out and not yet decided, and its active reads."""

    def __init__(self) -> None:
        self._undecided: dict[int, None] = {}  # insertion order is timestamp order
        self._active_reads: dict[int, int] = {}
        # undecided ones past their decision point, whose record is queued in the loop's next
        # pass or being made durable: nothing of theirs is left to run here but that
        # (``deciding``)
        self._deciding: set[int] = set()
        self.changed: Callable[[], None] = lambda: None  # its oldest of either may have moved
        # a timestamp was decided: this member's switch may release what it held back
        self.released: Callable[[], None] = lambda: None

    def add(self, ts: int) -> None:
        self._undecided[ts] = None

    def __contains__(self, ts: int) -> bool:
        return ts in self._undecided

    def oldest(self) -> int | None:
        return next(iter(self._undecided), None)

    def deciding(self, ts: int) -> None:
        """``ts`` has reached its decision point: its record is queued in the loop's next
        pass, and it then only waits for the flush."""
        if ts in self._undecided:
            self._deciding.add(ts)

    def alone(self) -> bool:
        """What this member does next is its undecided transactions' decisions: at most one
        transaction undecided, or every one deciding, and no read under way (see
        ``WriteAheadLog.flush_here``). Eight clients' commits, each waiting for the same
        flush, so save the log's thread and the loop a wake-up each."""
        undecided = len(self._undecided)
        return (undecided <= 1 or undecided == len(self._deciding)) and not self._active_reads

    def oldest_read(self) -> int | None:
        return min(self._active_reads, default=None)

    def decided(self, ts: int) -> None:
        self._deciding.discard(ts)
        if self._undecided.pop(ts, 0) is None:
            self.changed()
            self.released()

    def start_reading(self, ts: int) -> None:
        self._active_reads[ts] = self._active_reads.get(ts, 0) + 1

    def stop_reading(self, ts: int) -> None:
        if self._active_reads[ts] == 1:
            del self._active_reads[ts]
            self.changed()
        else:
            self._active_reads[ts] -= 1

    @contextmanager
    def reading(self, ts: int) -> Iterator[None]:
        self.start_reading(ts)
        try:
            yield
        finally:
            self.stop_reading(ts)


class WriteRegistry(Protocol):
    """Who must hear, in the step a timestamp is granted, what its transaction writes (the
    member's lookup cache, ``coordinator.lookup_cache``)."""

    def writing(self, ts: int, rows: Iterable[RowKey], tables: Iterable[str] = ()) -> None: ...

    def opaque(self, ts: int) -> None: ...

    def remote(self, notice: Notice) -> None: ...

    def decided(self, decided: int) -> None: ...

    def start_over(self, issued: int) -> None: ...


class _Nobody:
    def writing(self, ts: int, rows: Iterable[RowKey], tables: Iterable[str] = ()) -> None:
        pass

    def opaque(self, ts: int) -> None:
        pass

    def remote(self, notice: Notice) -> None:
        pass

    def decided(self, decided: int) -> None:
        pass

    def start_over(self, issued: int) -> None:
        pass


class MemberClock:
    """What a transaction manager asks of the clock, whichever member it runs on."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight
        self.marks = Marks(0, 0, 0, 0)
        self.cache: WriteRegistry = _Nobody()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    async def next(self, writes: Writes | None = None) -> tuple[int, int]:
        """A timestamp for a transaction, and the catalog epoch it runs under; the timestamp
        is in the in-flight set until the caller reports it decided. ``writes``: what it
        writes in cached tables (None: a system transaction, which writes none)."""
        raise NotImplementedError

    def _register(self, ts: int, epoch: int, writes: Writes | None) -> None:
        """In the step ``ts`` is granted: the cache learns what it writes. Picked under an
        older epoch, the set of cached tables may have grown: it blocks every cached row
        until the transaction registers again under the new one (or ends)."""
        if writes is None:
            return
        if writes.epoch != epoch:
            self.cache.opaque(ts)
        elif writes:
            self.cache.writing(ts, writes.rows, writes.tables)

    async def read_timestamp(self) -> int:
        """The youngest timestamp issued, counted as an active read until ``stop_reading``."""
        raise NotImplementedError

    def issued(self) -> int:
        """The youngest timestamp this member knows to be issued."""
        return self.marks.issued

    def publish(self, epoch: int, configuration: dict[str, Any]) -> None:
        """The catalog changed (only the leader changes it)."""
        raise errors.FailedPrecondition("tables, views and indexes change at member 0 only")

    async def wait_decided(self, ts: int) -> None:
        """Returns once every transaction at or below ``ts`` is decided, cluster-wide."""
        if self.marks.decided >= ts:
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (ts, next(self._sequence), waiter))
        self._waiting(self._waiters[0][0])
        await waiter

    def _waiting(self, ts: int) -> None:
        """Someone here waits until ``ts`` is decided (a follower tells the leader)."""

    def _marked(self, marks: Marks) -> None:
        self.marks = marks
        self.cache.decided(marks.decided)
        while self._waiters and self._waiters[0][0] <= marks.decided:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)


class LeaderClock(MemberClock):
    """The leader (member 0, or who took over): the clock is here. Watermarks are recomputed
    once per event-loop step in which anything changed, here or in a follower's report, and
    followers waiting for them are told (``listeners``). With a ``lease`` (a replicated
    cluster, ``coordinator.leadership``) it grants only while the lease holds."""

    def __init__(self, clock: Clock, in_flight: InFlight, lease: Lease | None = None) -> None:
        super().__init__(in_flight)
        self.clock = clock
        self.member = clock.leader
        self.lease = lease
        self._seq = 0
        self._scheduled = False
        self.listeners: set[Callable[[Marks], None]] = set()  # the followers' streams
        # the followers' streams again: (origin member, notice) to pass on
        self.notice_listeners: set[Callable[[int, Notice], None]] = set()
        self.lost: set[int] = set()  # followers found dead whose decision log is adopted
        self.lost_changed: Callable[[], None] = lambda: None  # (their async views move here)
        in_flight.changed = self.changed
        self._recompute()

    async def next(self, writes: Writes | None = None) -> tuple[int, int]:
        return self.take(writes)

    def succeed(self, follower: MemberClock) -> None:
        """This member took the lead: what its follower clock had (the lookup cache, those
        waiting until a timestamp is decided) is this clock's now."""
        self.cache = follower.cache
        for waiter in follower._waiters:
            heapq.heappush(self._waiters, waiter)
        follower._waiters = []
        self.changed()

    def check_lease(self) -> None:
        """Raises (unavailable) unless this member surely still leads."""
        if self.lease is not None:
            self.lease.check(self.member)

    def take(self, writes: Writes | None = None) -> tuple[int, int]:
        self.check_lease()
        grant = self.clock.grant(self.member, 1, writes=writes)
        self._seq = grant.seq
        self.in_flight.add(grant.first)
        self._register(grant.first, grant.epoch, writes)
        if grant.notice is not None:
            self.noticed(self.member, grant.notice)
        return grant.first, grant.epoch

    def noticed(self, origin: int, notice: Notice) -> None:
        """``origin``'s grant writes cached rows: every other member hears it before any
        later grant (the followers on their streams, this member's cache now)."""
        if origin != self.member:
            self.cache.remote(notice)
        for listener in list(self.notice_listeners):
            listener(origin, notice)

    async def read_timestamp(self) -> int:
        self.check_lease()
        ts = self.clock.oracle.current()
        self.in_flight.start_reading(ts)
        return ts

    def issued(self) -> int:
        return self.clock.oracle.current()

    def publish(self, epoch: int, configuration: dict[str, Any]) -> None:
        self.clock.publish(epoch, json.dumps(configuration).encode())
        self.changed()  # the followers hear of it in the next step, asked or not

    def lose(self, member: int) -> None:
        """A follower is dead and its decision log adopted (``coordinator.failover``)."""
        if member in self.lost:
            return
        self.clock.forget(member)
        self.lost.add(member)
        self.lost_changed()
        self.changed()

    def back(self, member: int) -> None:
        """A new stream from ``member``: whatever it was, it is alive."""
        if member in self.lost:
            self.lost.discard(member)
            self.lost_changed()

    def changed(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._recompute)

    def _waiting(self, ts: int) -> None:
        self.changed()  # this member's own grants may be what holds the watermark

    def _recompute(self) -> None:
        self._scheduled = False
        in_flight = self.in_flight
        self.clock.report(self.member, self._seq, in_flight.oldest(), in_flight.oldest_read())
        marks = self.clock.marks()
        self._marked(marks)
        for listener in list(self.listeners):
            listener(marks)
