"""A coordinating member's switch for cumulus views (issue #42): its own commits' changes,
dispatched as they commit, in its commit-timestamp order, to the member holding the views'
runtimes (the leader), and its EPOCH ENDs after them.

``MemberSwitch`` is the pure part: a commit waits only until this member has no older
timestamp undecided (so the stream is in timestamp order without waiting for anyone else);
batches are numbered and kept until acknowledged (sent again on a new stream); an epoch cut T
is answered once everything this member committed at or below T went out before the answer.
``SwitchLink`` is its I/O: one ``Clock.Switch`` stream to the leader, or calls in process
when this member leads.

Timestamps in the runtime: ``(stamp(ts, i), member)``, i the update's place in its
transaction; an epoch at T closes at ``cut_of(T)``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from aggview.net import GRPC_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc

log = logging.getLogger("coordinator.views")

SHIFT = 20  # updates of one transaction per view, at most 2^20
CHUNK = 10_000  # row images per batch at most (a bigger transaction goes in parts)
# Test builds: "M:SECONDS" holds member M's batches that long before they go out (reordering
# between members' switches, on cue); EARLY_END sends a member's EPOCH END ahead of its held
# batches (the mutation the differential tests must catch).
DELAY_ENV = "AGGVIEW_SWITCH_DELAY"
EARLY_END_ENV = "AGGVIEW_SWITCH_EARLY_END"


def stamp(ts: int, i: int) -> int:
    """The runtime's timestamp counter of the i-th update of the transaction at ``ts``."""
    if i >> SHIFT:
        raise ValueError(f"more than {1 << SHIFT} updates of one view in one transaction")
    return (ts << SHIFT) | i


def cut_of(ts: int) -> int:
    """The runtime's cut holding every update of the transactions at or below ``ts``."""
    return ((ts + 1) << SHIFT) - 1


class MemberSwitch:
    def __init__(self, member: int) -> None:
        self.member = member
        self.fresh = True  # no stream of this process reached the leader yet
        self._held: list[tuple[int, list[pb.RowImage]]] = []  # committed, not released
        self._seq = 0
        self.unacked: dict[int, pb.SwitchRequest] = {}  # by batch number, in order
        self._asked: list[int] = []  # cuts asked and not answered
        # a commit's outcome is unknown: no cut is answered until the runtimes load again
        self.broken: int | None = None

    def committed(self, ts: int, images: list[pb.RowImage]) -> None:
        heapq.heappush(self._held, (ts, images))

    def release(self, oldest: int | None) -> list[pb.SwitchRequest]:
        """What can go out now that this member's oldest undecided timestamp is ``oldest``
        (None: none): the held commits below it, in timestamp order, as one batch, then the
        answers to the cuts it covers."""
        batches: list[list[pb.SwitchCommit]] = []
        size = CHUNK
        while self._held and (oldest is None or self._held[0][0] < oldest):
            ts, images = heapq.heappop(self._held)
            for start in range(0, len(images), CHUNK):
                part = images[start : start + CHUNK]
                if size + len(part) > CHUNK:
                    batches.append([])
                    size = 0
                more = start + CHUNK < len(images)
                batches[-1].append(pb.SwitchCommit(ts=ts, changes=part, more=more))
                size += len(part)
        out = []
        for commits in batches:
            self._seq += 1
            batch = pb.SwitchRequest(member=self.member, seq=self._seq, commits=commits)
            self.unacked[self._seq] = batch
            out.append(batch)
        held = self._held[0][0] if self._held else None
        for cut in [] if self.broken is not None else list(self._asked):
            if (oldest is None or oldest > cut) and (held is None or held > cut):
                self._asked.remove(cut)
                out.append(pb.SwitchRequest(member=self.member, epoch_end=cut))
        return out

    def ask(self, cut: int, oldest: int | None) -> list[pb.SwitchRequest]:
        """The leader opened an epoch at ``cut``: the answer goes after this member's last
        dispatch at or below it."""
        if cut not in self._asked:
            self._asked.append(cut)
        return self.release(oldest)

    def outcome_unknown(self, ts: int) -> None:
        """The transaction at ``ts`` may have committed, and is not sent: no cut is answered
        (so no epoch past it closes) until ``reloaded``; the cuts asked are dropped, the
        reloaded runtimes ask theirs again."""
        self.broken = ts if self.broken is None else min(self.broken, ts)
        self._asked.clear()

    def reloaded(self) -> None:
        """The runtimes this switch feeds load again from a snapshot taken after now."""
        self.broken = None

    def acked(self, seq: int) -> None:
        for number in [n for n in self.unacked if n <= seq]:
            del self.unacked[number]


def _delay_for(member: int) -> float:
    spec = os.environ.get(DELAY_ENV, "")
    who, _, seconds = spec.partition(":")
    return float(seconds) if who and int(who) == member else 0.0


Deliver = Callable[[int, pb.SwitchRequest], Awaitable[None]]


class SwitchLink:
    """The member's switch and the stream it goes out on. ``leader()`` names the leader's
    address (None: this member leads, and ``deliver`` takes the requests in process)."""

    def __init__(
        self,
        member: int,
        oldest: Callable[[], int | None],
        leader: Callable[[], str | None],
        deliver: Deliver,
        tls: TlsDir | None,
        reload: Callable[[str], None] = lambda why: None,
    ) -> None:
        """``reload(why)``: when this member leads, makes every runtime it feeds load again
        from a new snapshot (a member that follows asks for that with a fresh stream)."""
        self.switch = MemberSwitch(member)
        self._reload = reload
        self._oldest = oldest
        self._leader = leader
        self._deliver = deliver
        self._tls = tls
        self.delay = _delay_for(member)
        self.early_end = bool(os.environ.get(EARLY_END_ENV))
        # what goes out next, in order, each with the time it may leave (``delay``)
        self._outbox: collections.deque[tuple[float, pb.SwitchRequest]] = collections.deque()
        self._wake = asyncio.Event()
        self._written = 0  # the last batch number written on the current stream
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    def committed(self, ts: int, images: list[pb.RowImage]) -> None:
        self.switch.committed(ts, images)

    def outcome_unknown(self, ts: int) -> None:
        """A commit of this member whose decision's write failed (``MemberSwitch``): the
        runtimes load again, asked here when this member leads, else by a new stream that
        says it is fresh (the leader reloads for a member it saw before)."""
        log.warning("switch: the outcome of %d is unknown; cumulus views load again", ts)
        self.switch.outcome_unknown(ts)
        self.switch.fresh = True
        if self._leader() is None:
            self._reload(f"the outcome of {ts} is unknown")
            self.switch.reloaded()
            self.switch.fresh = False
        else:
            self._wake.set()  # the stream ends and a fresh one begins

    def release(self) -> None:
        """A timestamp of this member was decided: what it held back may go."""
        self._put(self.switch.release(self._oldest()))

    def ask(self, cut: int) -> None:
        self._put(self.switch.ask(cut, self._oldest()))

    def _put(self, requests: list[pb.SwitchRequest]) -> None:
        if not requests:
            return
        due = time.monotonic() + self.delay
        for request in requests:
            if request.epoch_end and self.early_end:
                self._outbox.appendleft((0.0, request))  # the mutation: ahead of the batches
            else:
                self._outbox.append((due, request))
        self._wake.set()

    async def _next(self) -> pb.SwitchRequest:
        while True:
            if self._outbox:
                due, request = self._outbox[0]
                wait = due - time.monotonic()
                if wait <= 0:
                    self._outbox.popleft()
                    return request
                await asyncio.sleep(wait)
                continue
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.5)
            if not self._outbox:
                raise _Idle

    async def _run(self) -> None:
        while True:
            leader = self._leader()
            try:
                if leader is None:
                    await self._in_process()
                else:
                    await self._stream(leader)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("switch stream to %s ended: %s; again", leader or "here", exc)
            await asyncio.sleep(0.2)  # a leader not ready yet is asked again, not hammered

    async def _in_process(self) -> None:
        """This member leads: its requests go straight to the runtimes' side."""
        for seq in sorted(self.switch.unacked):  # written to a stream that is gone
            if seq <= self._written:
                await self._deliver(self.switch.member, self.switch.unacked[seq])
                self.switch.acked(seq)
        self._written = 0
        self.switch.fresh = False
        while self._leader() is None:
            try:
                request = await self._next()
            except _Idle:
                continue
            await self._deliver(self.switch.member, request)
            if request.seq:
                self.switch.acked(request.seq)

    async def _stream(self, leader: str) -> None:
        channel = member_channel(leader, self._tls, GRPC_OPTIONS)
        try:
            call = pb_grpc.ClockStub(channel).Switch(metadata=member_metadata(self._tls))
            fresh = self.switch.fresh
            await call.write(pb.SwitchRequest(member=self.switch.member, fresh=fresh))
            if fresh:  # the leader reloads the runtimes this member fed (one it saw before)
                self.switch.reloaded()
            for seq in sorted(self.switch.unacked):  # written to a stream that is gone
                if seq <= self._written:
                    await call.write(self.switch.unacked[seq])
            reader = asyncio.get_running_loop().create_task(self._replies(call))
            try:
                while self._leader() == leader and not reader.done() and self.switch.broken is None:
                    try:
                        request = await self._next()
                    except _Idle:
                        continue
                    self._written = max(self._written, request.seq)  # sent again if lost
                    await call.write(request)
                if reader.done() and not reader.cancelled() and reader.exception():
                    raise reader.exception()  # type: ignore[misc]
            finally:
                reader.cancel()
                call.cancel()
        finally:
            await channel.close()

    async def _replies(self, call: Any) -> None:
        async for reply in _read(call):
            self.switch.fresh = False
            if reply.acked:
                self.switch.acked(reply.acked)
            if reply.cut:
                self.ask(reply.cut)


class _Idle(Exception):
    """Nothing to send for a while: look at who leads again."""


async def _read(call: Any) -> AsyncIterator[pb.SwitchReply]:
    while True:
        reply = await call.read()
        if reply is grpc.aio.EOF:
            return
        yield reply
