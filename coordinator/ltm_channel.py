"""The coordinator's line to one LTM: one long-lived stream that carries prepares, reads and
batched decisions of all concurrent transactions, each answered on its own, so throughput is
not one RPC per transaction per participant."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc

from aggview import errors
from aggview.frames import FramedCall
from aggview.net import GRPC_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata, member_secret
from aggview.status import error_from_rpc
from aggview.streams import AskEach
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from ltm.store import ownership

# A stream message costs the coordinator about as much CPU as the requests it carries: with
# this many requests awaiting answers, a write waits LINGER seconds for more to join it (32
# closed-loop clients, 3 LTMs, 3-row transactions: a median of about 600 tx/s instead of 480
# over six alternating runs); lightly loaded, it goes at once.
BUSY = 3
LINGER = 0.002
# A peer that is starting or restarting is waited for this long before a request to it fails
# as unavailable: gRPC puts a channel that dialled it too early into reconnect backoff (up to
# a second), and members start one by one.
CONNECT_GRACE = 2.0

Item = TypeVar("Item")
Result = TypeVar("Result")


class Batcher(Generic[Item, Result]):
    """Collects items submitted while a call is in flight and sends them in the next call.

    A call goes out at once when none is in flight; otherwise items wait for the call in
    flight to return, but never longer than ``linger`` seconds: a prepare that waits at the LTM
    for an older transaction's decision must not hold back other messages for long, so no
    wait can form a cycle through a full pipeline."""

    def __init__(
        self,
        send: Callable[[list[Item]], AsyncIterator[tuple[int, Result]]],
        *,
        linger: float = 0.002,
    ) -> None:
        self._send = send
        self._linger = linger
        self._queue: list[tuple[Item, asyncio.Future[Result]]] = []
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._scheduled = False
        self.calls = 0
        self.items = 0

    def submit(self, item: Item) -> asyncio.Future[Result]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._queue.append((item, future))
        if self._in_flight == 0:
            if not self._scheduled:  # what else this loop turn submits joins the call
                self._scheduled = True
                loop.call_soon(self._drain)
        elif self._timer is None:
            self._timer = loop.call_later(self._linger, self._drain)
        return future

    def _drain(self) -> None:
        self._scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._queue = self._queue, []
        if batch:
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._deliver(batch))

    async def _deliver(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        """Results may come back one by one (a stream): each caller resumes on its own."""
        self.calls += 1
        self.items += len(batch)
        try:
            async for position, result in self._send([item for item, _ in batch]):
                future = batch[position][1]
                if not future.done():
                    future.set_result(result)
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # a caller that gave up must not log "never retrieved"
        finally:
            self._call_done()
            for _, future in batch:
                if not future.done():
                    future.set_exception(errors.Unavailable("no answer for this item"))
                    future.exception()

    def _call_done(self) -> None:
        self._in_flight -= 1
        if self._queue and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)


class LtmChannel:
    in_process = False  # a stream to another process (``LocalLtm`` is the other kind)

    def __init__(
        self,
        index: int,
        address: str,
        watermarks: Callable[[], tuple[int, int]],
        tls: TlsDir | None = None,
        *,
        owner: int | None = None,
        epoch: int = 0,
        exchanges: list[str] | None = None,
    ) -> None:
        """``owner``, ``epoch``: who serves the partition, as its ownership record says
        (default: its own LTM, at epoch 0). ``exchanges``: where each partition's member
        serves framed TCP (``aggview.frames``), which then carries the stream instead of
        gRPC."""
        self.index = index  # the partition
        self._watermarks = watermarks
        self._tls = tls
        self._exchanges = exchanges or []
        self._ssl = tls.member_client_ssl if tls is not None and exchanges else None
        # whether the member serving LTM ``owner`` fell silent to this member's prober
        # (``coordinator.quorum``): requests then fail at once instead of waiting for TCP
        self.silent: Callable[[int], bool] = lambda owner: False
        self.point(address, owner=index if owner is None else owner, epoch=epoch)
        self.decisions: Batcher[pb.Decision, None] = Batcher(self._send_decisions)
        # the long-lived Exchange call, opened on first use (on the current owner's stub)
        self.stream: AskEach[pb.LtmRequest, pb.LtmReply] = AskEach(
            self._open_stream,
            lambda requests: pb.LtmRequests(requests=requests),
            self._unavailable,
            busy=BUSY,
            linger=LINGER,
        )

    def point(self, address: str, owner: int, epoch: int) -> None:
        """Where the partition is served (set at start from the store's ownership record)."""
        self.address = address
        self.owner = owner  # the LTM serving the partition (another one after a failover)
        self.epoch = epoch
        # mutual TLS plus the cluster secret when the cluster is secure (LTMs serve members only)
        self._channel = member_channel(address, self._tls, GRPC_OPTIONS)
        self._metadata = (
            *member_metadata(self._tls),
            *ownership.partition_metadata(self.index, epoch),
        )
        self.stub = pb_grpc.LtmStub(self._channel)

    def _open_stream(self) -> Any:
        if not self._exchanges:
            return self.stub.Exchange(metadata=self._metadata)
        hello = pb.ExchangeHello(
            secret=member_secret(self._tls),
            partition=self.index,
            epoch=self.epoch,
        )
        return FramedCall(
            self._exchanges[self.owner],
            hello.SerializeToString(),
            pb.LtmReplies.FromString,
            self._ssl,
        )

    async def retarget(self, address: str, owner: int, epoch: int) -> None:
        """Talks to the partition's owner at ``epoch`` from now on (failover); whatever was
        waiting on the old owner fails as unavailable (and is retried or aborted)."""
        old = self._channel
        self.stream.abandon()  # no await before point(): nothing may start on the old peer
        self.point(address, owner, epoch)
        await old.close()

    def owner_silent(self) -> None:
        """The owner's member fell silent: what waits on the stream fails now as unavailable
        (a prepare's vote is then missing and its coordinator decides abort, as when TCP
        gives up seconds later); requests fail at once until it answers again."""
        self.stream.abandon()

    async def _send_decisions(
        self, decisions: list[pb.Decision]
    ) -> AsyncIterator[tuple[int, None]]:
        low, _ = self._watermarks()
        await self._exchange(
            pb.LtmRequest(decide=pb.DecideRequest(decisions=decisions, low_watermark=low))
        )
        for i in range(len(decisions)):
            yield i, None

    async def _exchange(self, request: pb.LtmRequest, timeout: float = 30.0) -> pb.LtmReply:
        """Sends one request on the stream and waits for its own answer."""
        if not self._exchanges and self._channel.get_state() is not grpc.ChannelConnectivity.READY:
            await self._connected(min(timeout, CONNECT_GRACE))
        # checked after the wait for a connection, with no await before the ask: silence
        # heard during that wait abandoned a stream this request was not on yet
        if self.silent(self.owner):
            raise errors.Unavailable(
                f"LTM {self.index} at {self.address} is unavailable: its member does not "
                "answer probes"
            )
        reply = await self.stream.ask(
            request,
            timeout,
            lambda: errors.Unavailable(
                f"LTM {self.index} at {self.address} did not answer within {timeout:g}s"
            ),
        )
        if reply.HasField("error"):
            if reply.error_reason == errors.identity(errors.NotServed).reason:
                raise errors.NotServed(f"LTM {self.index}: {reply.error}")
            raise errors.Unavailable(f"LTM {self.index}: {reply.error}")
        return reply

    async def _connected(self, grace: float) -> None:
        """Waits up to ``grace`` seconds for the channel to connect; the request then goes
        (to the owner of the moment), and fails as unavailable if the peer is still down.
        A channel closed meanwhile (the partition moved: ``retarget``) ends the wait too."""
        with contextlib.suppress(TimeoutError, grpc.aio.UsageError):
            await asyncio.wait_for(self._channel.channel_ready(), grace)

    def _unavailable(self, exc: BaseException | None) -> errors.AggviewError:
        """What waiters hear when the stream ends (the LTM restarted, the network failed), or
        is refused because the partition is not served there (it moved: ``NotServed``)."""
        refused = error_from_rpc(exc) if isinstance(exc, grpc.aio.AioRpcError) else exc
        if isinstance(refused, errors.NotServed):
            return errors.NotServed(f"LTM {self.index} at {self.address}: {refused}")
        detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else repr(exc)
        return errors.Unavailable(f"LTM {self.index} at {self.address} is unavailable: {detail}")

    async def _call(self, method, request, timeout: float):  # type: ignore[no-untyped-def]
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise self._error(exc) from None

    def _error(self, exc: grpc.aio.AioRpcError) -> errors.AggviewError:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return errors.Unavailable(
                f"LTM {self.index} at {self.address} is unavailable: {exc.details()}"
            )
        return error_from_rpc(exc)

    async def prepare(self, sub: pb.SubTransaction) -> pb.Vote:
        """One call per sub-transaction, never batched: a batch answers when its slowest
        vote is ready, and a vote waiting for an older transaction's decision could then hold
        back the very votes that decision waits for (a cycle through batches). Decisions never
        wait, so they are batched."""
        low, issued = self._watermarks()
        request = pb.PrepareRequest(subs=[sub], low_watermark=low, issued=issued)
        try:
            reply = await self._exchange(pb.LtmRequest(prepare=request))
        except errors.AggviewError as exc:
            return pb.Vote(ts=sub.ts, outcome=pb.Vote.UNAVAILABLE, message=str(exc))
        return reply.vote

    async def decide(self, ts: int, commit: bool) -> None:
        await self.decisions.submit(pb.Decision(ts=ts, commit=commit))

    async def read(self, request: pb.ReadRequest) -> pb.ReadReply:
        return (await self._exchange(pb.LtmRequest(read=request))).rows

    async def drop_table(self, table_id: str) -> None:
        await self._call(self.stub.DropTable, pb.DropTableRequest(table=table_id), timeout=30)

    async def status(self) -> pb.StatusReply:
        return await self._call(self.stub.Status, pb.StatusRequest(), timeout=5)

    async def close(self) -> None:
        await self.stream.close()
        await self._channel.close()
