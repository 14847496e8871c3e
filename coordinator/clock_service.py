"""The cluster clock between processes: the leader's ``Clock`` service and a follower
member's ``FollowerClock``, one ordered stream per follower.

A follower asks for as many timestamps as it has transactions waiting, one request at a time
(what arrives while one is out goes in the next: a batch per round trip under load), and
reports what it holds once per event-loop step in which that changed, or, while a request is
out, with the message that follows its grant (under load, the next request). A reply carries the
watermarks; the leader also sends them unasked once they reach what the follower waits for,
and the catalog of a newer epoch before the first grant under it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from aggview import errors
from aggview.frames import Answer, FramedCall, Send, answering
from aggview.net import GRPC_OPTIONS
from aggview.retry import RetryPolicy, retry_on
from aggview.security import TlsDir, member_channel, member_metadata, member_secret
from aggview.status import Malformed, abort, grpc_method
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from coordinator.clock import Grant, Marks, Notice, Writes
from coordinator.member_clock import InFlight, LeaderClock, MemberClock

log = logging.getLogger(__name__)

START_RETRY_FIRST = 0.2  # seconds before a starting member asks an unreachable leader again
START_RETRY_LAST = 1.0
# doubling from the first to the last, no jitter, for as long as it takes
START_RETRY = RetryPolicy(
    attempts=None,
    first_delay=START_RETRY_FIRST,
    max_delay=START_RETRY_LAST,
    spread=(1.0, 1.0),
    retryable=retry_on(errors.Unavailable),
)

# A follower's timestamp requests out at once. With one, a transaction arriving while it was
# out waited for its grant and then a round trip of its own; with two, about one round trip.
ASKS_OUT = 2


def _reply(marks: Marks, grant: Grant | None = None) -> pb.ClockReply:
    reply = pb.ClockReply(
        issued=marks.issued, decided=marks.decided, low=marks.low, epoch=marks.epoch
    )
    if grant is not None:
        reply.seq, reply.first, reply.count = grant.seq, grant.first, grant.count
        reply.read_ts, reply.epoch = grant.read_ts, grant.epoch
    return reply


class _Stream:
    """One follower's stream at the leader: what it was sent, what it waits for."""

    def __init__(self, leader: LeaderClock, direct: Send | None = None) -> None:
        self.leader = leader
        self.direct = direct  # writes a reply to the connection now, if it can
        self.member = -1
        self.wait = 0  # tell it the watermarks unasked once decided reaches this
        self.epoch = -1  # the newest catalog epoch it was sent
        self.notices: list[Notice] = []  # other members' writes, for its next reply
        self.replies: asyncio.Queue[pb.ClockReply | None] = asyncio.Queue()

    def send(self, reply: pb.ClockReply) -> None:
        if reply.epoch > self.epoch:  # the follower runs nothing under an unknown epoch
            reply.configuration = self.leader.clock.configuration
            self.epoch = reply.epoch
        if self.notices:  # ahead of the grant in this reply, and of any later one
            reply.notices.extend(_wire_notice(n) for n in self.notices)
            self.notices.clear()
        if self.direct is not None and self.replies.empty() and self.direct(reply):
            return  # written now, after every reply before it (none waits in the queue)
        self.replies.put_nowait(reply)

    def notify(self, origin: int, notice: Notice) -> None:
        """Another member's grant writes cached rows: sent now, so an idle follower's
        cache also stops answering for them."""
        if origin != self.member:
            self.notices.append(notice)
            self.send(_reply(self.leader.clock.marks()))

    def told(self, marks: Marks) -> None:
        """New watermarks: sent if the follower waits for them; and a new catalog epoch at
        once, so that an idle follower runs its share of the async refreshers (and answers
        view reads) under the views as they are, not as they were at its last grant."""
        if self.wait and marks.decided >= self.wait:
            self.wait = 0
            self.send(_reply(marks))
        elif marks.epoch > self.epoch:
            self.send(_reply(marks))

    def handle(self, request: pb.ClockRequest | Malformed) -> None:
        clock = self.leader.clock
        if isinstance(request, Malformed):
            raise errors.InvalidArgument(f"malformed clock request: {request.reason}")
        member = request.member
        if not 0 <= member < clock.members or member == clock.leader:
            raise errors.InvalidArgument(
                f"member {member} is not a follower of this {clock.members}-member cluster "
                f"(led by member {clock.leader})"
            )
        if self.member != member:
            if self.member != -1:
                raise errors.InvalidArgument("one clock stream serves one member")
            clock.connected(member)
            self.leader.back(member)
            self.member = member
        if request.report:
            clock.report(member, request.seen, request.undecided or None, request.reading or None)
            self.leader.changed()
        if request.wait:
            self.wait = request.wait
            self.leader.changed()
        if request.count or request.read:
            self.leader.check_lease()
            writes = None
            if request.HasField("write_epoch"):
                rows = tuple((r.table, r.key) for r in request.write_rows)
                writes = Writes(rows, tuple(request.write_tables), request.write_epoch)
            grant = clock.grant(member, request.count, request.read, writes)
            if grant.notice is not None:
                self.leader.noticed(member, grant.notice)
            self.send(_reply(clock.marks(), grant))


ViewReader = Callable[[pb.LeaderViewRequest], Awaitable[pb.LeaderViewReply]]
SwitchStream = Callable[[AsyncIterator[pb.SwitchRequest]], AsyncIterator[pb.SwitchReply]]


class ClockServicer(pb_grpc.ClockServicer):
    """At the leader: one stream per follower member. ``clock()`` is this member's clock,
    which leads only at the leader (a follower may take the lead later); ``read_view``
    answers the cumulus view reads followers forward (``coordinator.leader_views``);
    ``switch`` takes a member's switch stream (``coordinator.view_switches``)."""

    def __init__(
        self,
        clock: Callable[[], MemberClock],
        read_view: ViewReader | None = None,
        switch: SwitchStream | None = None,
    ) -> None:
        self.clock = clock
        self.read_view = read_view
        self.switch = switch

    async def Switch(
        self, requests: AsyncIterator[pb.SwitchRequest], context: Any
    ) -> AsyncIterator[pb.SwitchReply]:
        try:
            if self.switch is None or not isinstance(self.clock(), LeaderClock):
                raise errors.Unavailable("this member does not lead the cluster (yet)")
            async for reply in self.switch(requests):
                yield reply
        except errors.AggviewError as exc:
            await abort(context, exc)

    @grpc_method
    async def ReadView(self, request: pb.LeaderViewRequest, context: Any) -> pb.LeaderViewReply:
        if self.read_view is None or not isinstance(self.clock(), LeaderClock):
            raise errors.Unavailable("this member does not lead the cluster (yet)")
        return await self.read_view(request)

    async def Tick(
        self, requests: AsyncIterator[pb.ClockRequest | Malformed], context: Any
    ) -> AsyncIterator[pb.ClockReply]:
        try:
            async for reply in self.tick(requests):
                yield reply
        except errors.AggviewError as exc:  # bad input ends this stream, with its reason
            await abort(context, exc)

    def framed(self) -> Answer:
        """The same stream on the member's framed-TCP port (``aggview.frames``)."""
        return answering(pb.ClockRequest.FromString, self.tick, direct=True)

    async def tick(
        self, requests: AsyncIterator[pb.ClockRequest | Malformed], send: Send | None = None
    ) -> AsyncIterator[pb.ClockReply]:
        """A follower's stream: its requests in, grants and watermarks out; ends with the
        error of a request that makes no sense. With ``send`` (on frames), a reply is
        written as soon as it is made, unless earlier ones still wait to be yielded."""
        leader = self.clock()
        if not isinstance(leader, LeaderClock):
            raise errors.Unavailable("this member does not lead the cluster (yet)")
        stream = _Stream(leader, send)

        async def read() -> None:
            try:
                async for request in requests:
                    stream.handle(request)
            finally:
                stream.replies.put_nowait(None)

        leader.listeners.add(stream.told)
        leader.notice_listeners.add(stream.notify)
        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (reply := await stream.replies.get()) is not None:
                yield reply
            await reader
        finally:
            leader.listeners.discard(stream.told)
            leader.notice_listeners.discard(stream.notify)
            reader.cancel()


def _wire_notice(notice: Notice) -> pb.WriteNotice:
    return pb.WriteNotice(
        first=notice.first,
        last=notice.last,
        rows=[pb.CachedRow(table=t, key=k) for t, k in notice.rows],
        tables=notice.tables,
        everything=notice.everything,
    )


def _notice(wire: pb.WriteNotice) -> Notice:
    rows = tuple((r.table, r.key) for r in wire.rows)
    return Notice(wire.first, wire.last, rows, tuple(wire.tables), wire.everything)


class FollowerClock(MemberClock):
    """A follower member's side: its requests and reports on one stream to the leader.
    ``install(epoch, configuration)`` runs, in the step a reply arrives, before any grant
    under a newer catalog epoch is handed out."""

    def __init__(
        self,
        member: int,
        in_flight: InFlight,
        leader: str,
        tls: TlsDir | None,
        install: Callable[[int, dict[str, Any]], None],
        locate: Callable[[], Awaitable[tuple[int, str] | None]] | None = None,
        leader_member: int = 0,
        exchanges: list[str] | None = None,
    ) -> None:
        """``locate``: after the stream fails, where the leader is now (index, address), or
        None when it is this member (it takes the lead; ``coordinator.leadership``).
        ``exchanges``: every member's framed-TCP address, which then carries the stream."""
        super().__init__(in_flight)
        self._exchanges = exchanges or []
        self._ssl = tls.member_client_ssl if tls is not None and exchanges else None
        self._pump: asyncio.Task[None] | None = None
        self.member = member
        self.address = leader
        self.leader_member = leader_member
        self._locate = locate
        self._tls = tls
        self._install = install
        # waiting to be asked for, with what each writes in cached tables
        self._writers: list[tuple[asyncio.Future[tuple[int, int]], Writes | None]] = []
        self._readers: list[asyncio.Future[int]] = []
        self._asked_writes: deque[tuple[asyncio.Future[tuple[int, int]], Writes | None]] = deque()
        self._fresh = True  # no reply yet on this stream
        self.requests = self.replies = 0  # messages on its streams, for the benchmarks
        # one entry per request out (its readers), oldest first: grants come back in order
        self._asked_reads: deque[list[asyncio.Future[int]]] = deque()
        self._scheduled = False
        self._report_due = False
        self._seen = 0
        self._wait_sent = 0
        self._outbox: asyncio.Queue[pb.ClockRequest] = asyncio.Queue()
        self._call: Any = None
        self._closed = False
        self._reader: asyncio.Task[None] | None = None
        # Why the stream is down, from its failure until the next one opens: meanwhile a
        # request would go on the dead stream and wait for a grant that never comes.
        self._down: str | None = None
        # whether a member fell silent to this member's prober (``coordinator.quorum``)
        self.silent: Callable[[int], bool] = lambda member: False
        self._recovering: asyncio.Task[None] | None = None
        in_flight.changed = self._changed

    async def start(self) -> None:
        """Returns once the leader answered (its first grant brings the catalog). A leader
        that cannot be reached (cut off, restarting, or moving to another member) is waited
        for with backoff: a restarting member that exited instead would only be restarted
        into the same wait, or stay down."""
        self._channel = member_channel(self.address, self._tls, GRPC_OPTIONS)
        self._open()

        def waiting(exc: BaseException, failed: int, delay: float) -> None:
            log.warning(
                "waiting for the cluster's leader (member %d at %s): %s; asking again in %.1f s",
                self.leader_member,
                self.address,
                exc,
                delay,
            )

        ts = await START_RETRY.arun(self.read_timestamp, waiting)
        self.in_flight.stop_reading(ts)

    def _open(self) -> None:
        """A new stream; its first message reports what this member holds."""
        stub = pb_grpc.ClockStub(self._channel)
        outbox: asyncio.Queue[pb.ClockRequest] = asyncio.Queue()

        async def outgoing() -> AsyncIterator[pb.ClockRequest]:
            while True:
                yield await outbox.get()

        # Asked on the stream that ended, after its reader failed what it had asked (during
        # the pause before this one): never answered now, so they fail here and their
        # callers ask again. Left in place they waited forever (reads) or took the new
        # stream's grants meant for others (writes).
        gone = errors.Unavailable("the clock stream was reopened before answering; try again")
        for future, _ in self._asked_writes:
            if not future.done():
                future.set_exception(gone)
        for readers in self._asked_reads:
            for reader in readers:
                if not reader.done():
                    reader.set_exception(gone)
        self._asked_writes.clear()
        self._outbox = outbox
        self._seen = 0  # grants are numbered per stream
        self._fresh = True
        self._down = None
        self._asked_reads.clear()
        self._wait_sent = self._waiters[0][0] if self._waiters else 0
        if self._exchanges:
            self._call = self._framed(outbox)
        else:
            self._call = stub.Tick(outgoing(), metadata=member_metadata(self._tls))
        self._reader = asyncio.get_running_loop().create_task(self._read(self._call))
        self._changed()

    def _framed(self, outbox: asyncio.Queue[pb.ClockRequest]) -> FramedCall:
        """The stream on the leader's framed-TCP port; a write that fails ends it (its
        reader then sees the end, as for a gRPC call)."""
        hello = pb.ExchangeHello(secret=member_secret(self._tls), stream="clock")
        call = FramedCall(
            self._exchanges[self.leader_member],
            hello.SerializeToString(),
            pb.ClockReply.FromString,
            self._ssl,
        )

        async def pump() -> None:
            try:
                while True:
                    await call.write(await outbox.get())
            except Exception:  # noqa: BLE001 - the reader reports why the stream ended
                call.cancel()

        if self._pump is not None:
            self._pump.cancel()
        self._pump = asyncio.get_running_loop().create_task(pump())
        return call

    async def close(self) -> None:
        """Stops asking; whatever still waits for a timestamp fails as unavailable."""
        self._closed = True
        if self._pump is not None:
            self._pump.cancel()
        if self._reader is not None:
            self._reader.cancel()
        if self._recovering is not None:
            self._recovering.cancel()
        if self._call is not None:
            self._call.cancel()
        failure = errors.Unavailable("this member's clock stream closed; try again")
        waiting: list[Any] = [*self._writers, *self._asked_writes]
        asked_reads = [future for readers in self._asked_reads for future in readers]
        for future in [*(f for f, _ in waiting), *self._readers, *asked_reads]:
            if not future.done():
                future.set_exception(failure)
        self._writers, self._readers = [], []
        self._asked_writes.clear()
        self._asked_reads.clear()
        await self._channel.close()

    # ------------------------------------------------------------------ asking

    def _check_open(self) -> None:
        if self._closed:
            raise errors.Unavailable("this member's clock stream closed; try again")
        if self._down is not None:
            raise errors.Unavailable(f"{self._down}; reconnecting, try again")

    async def next(self, writes: Writes | None = None) -> tuple[int, int]:
        self._check_open()
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._writers.append((future, writes))
        self._ask_soon()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.in_flight.decided(future.result()[0])  # granted, never used
            raise

    async def read_timestamp(self) -> int:
        self._check_open()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._readers.append(future)
        self._ask_soon()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.in_flight.stop_reading(future.result())
            raise

    def _asking(self) -> bool:
        """As many requests out as may be: what waits goes with the next grant's reply."""
        return len(self._asked_reads) >= ASKS_OUT

    def _ask_soon(self) -> None:
        if not self._asking():
            self._schedule()

    def _changed(self) -> None:
        """The in-flight set changed: a report is due. While the most requests are out it
        waits for a grant and goes with the message that follows it (under load, the next
        request: one message instead of two); the watermarks lag by at most that round trip."""
        self._report_due = True
        if not self._asking():
            self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send)

    def _waiting(self, ts: int) -> None:
        if not self._wait_sent or ts < self._wait_sent:
            self._wait_sent = ts
            self._schedule()

    def _send(self) -> None:
        """One message: a report of what this member holds, and what it waits for; and,
        unless the most requests are out, everything waiting for a timestamp."""
        self._scheduled = False
        self._report_due = False
        request = pb.ClockRequest(
            member=self.member,
            report=True,
            seen=self._seen,
            undecided=self.in_flight.oldest() or 0,
            reading=self.in_flight.oldest_read() or 0,
            wait=self._wait_sent,
        )
        if not self._asking() and (self._writers or self._readers):
            request.count = len(self._writers)
            request.read = bool(self._readers)
            known = [writes for _, writes in self._writers if writes is not None]
            if known:
                request.write_epoch = min(writes.epoch for writes in known)
                rows = dict.fromkeys(row for writes in known for row in writes.rows)
                request.write_rows.extend(pb.CachedRow(table=t, key=k) for t, k in rows)
                request.write_tables.extend(sorted({t for w in known for t in w.tables}))
            self._asked_writes.extend(self._writers)
            self._asked_reads.append(self._readers)
            self._writers, self._readers = [], []
        self.requests += 1
        self._outbox.put_nowait(request)

    # ------------------------------------------------------------------ answers

    async def _read(self, call: Any) -> None:
        """Answers until the stream ends; then whatever waits fails as unavailable and a new
        stream is opened (the leader restarted, or the network failed)."""
        try:
            async for reply in call:
                self._received(reply)
            problem = "the leader ended the clock stream"
        except grpc.aio.AioRpcError as exc:
            problem = f"the clock stream to the leader failed: {exc.details() or exc.code()}"
        except asyncio.CancelledError:
            return
        except (OSError, asyncio.IncompleteReadError, errors.AggviewError) as exc:  # framed
            problem = f"the clock stream to the leader failed: {exc}"
        except Exception as exc:  # a bug here must not leave everything waiting in silence
            log.exception("clock stream reader failed")
            problem = f"the clock stream to the leader failed: {exc!r}"
        await self._reopen(problem)

    def leader_silent(self, member: int) -> None:
        """``member`` fell silent to this member's prober: if it is the leader, the stream
        to it ends now (its waiters fail, their callers try again) rather than when TCP gives
        up, and the next one goes wherever the record says the clock is by then."""
        if member != self.leader_member or self._closed or self._down is not None:
            return
        if self._reader is None or self._reader.done():
            return
        self._reader.cancel()
        if self._pump is not None:
            self._pump.cancel()
        if self._call is not None:
            self._call.cancel()
        problem = f"the leader (member {member}) does not answer probes"
        self._recovering = asyncio.get_running_loop().create_task(self._reopen(problem))

    async def _reopen(self, problem: str) -> None:
        log.warning("%s", problem)
        self._down = problem
        failure = errors.Unavailable(problem)
        asked = [future for future, _ in self._asked_writes]
        asked += [future for readers in self._asked_reads for future in readers]
        asked += [*(future for future, _ in self._writers), *self._readers]
        self._asked_writes.clear()
        self._asked_reads.clear()
        self._writers, self._readers = [], []
        for future in asked:
            if not future.done():
                future.set_exception(failure)
        while True:
            await asyncio.sleep(0.2)
            if self._closed:
                return
            if self._locate is None:
                break
            try:
                leader = await self._locate()
            except Exception:
                log.exception("finding the cluster's leader failed")
                leader = (self.leader_member, self.address)
            if leader is None:
                return  # this member takes the lead: its own clock replaces this one
            if leader[1] != self.address:
                log.warning("the clock is now at member %d (%s)", *leader)
                await self._channel.close()
                self.leader_member, self.address = leader
                self._channel = member_channel(self.address, self._tls, GRPC_OPTIONS)
                break
            if not self.silent(self.leader_member):
                break
            # The record still names a leader that does not answer: a stream to it would
            # wait out a connect attempt; look at the record again instead (a successor
            # writes its term about ``--failover-after`` seconds into the silence).
        self._open()

    def _received(self, reply: pb.ClockReply) -> None:
        self.replies += 1
        if reply.configuration:
            self._install(reply.epoch, json.loads(reply.configuration))
        if self._fresh:  # notices sent on an earlier stream may be lost
            self._fresh = False
            self.cache.start_over(reply.issued)
        for notice in reply.notices:
            self.cache.remote(_notice(notice))
        if reply.seq:
            self._granted(reply)
        self._marked(Marks(reply.issued, reply.decided, reply.low, reply.epoch))
        if self._wait_sent and reply.decided >= self._wait_sent:
            self._wait_sent = 0
            if self._waiters:
                self._waiting(self._waiters[0][0])

    def _granted(self, reply: pb.ClockReply) -> None:
        self._seen = reply.seq
        unused = False
        for ts in range(reply.first, reply.first + reply.count):
            future, writes = self._asked_writes.popleft()
            if future.done():  # its caller went away: the next report releases it
                unused = True
                continue
            self.in_flight.add(ts)
            self._register(ts, reply.epoch, writes)
            future.set_result((ts, reply.epoch))
        # the grant answers the oldest request out, its reads included
        for future in self._asked_reads.popleft() if self._asked_reads else ():
            if future.done():
                unused = True
                continue
            self.in_flight.start_reading(reply.read_ts)
            future.set_result(reply.read_ts)
        if unused or self._writers or self._readers or self._report_due:
            self._schedule()
