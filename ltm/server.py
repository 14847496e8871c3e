"""The LTM's gRPC face: a thin servicer over :class:`ltm.participant.Participant`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from aggview import errors
from aggview.frames import Answer, Welcome, answering
from aggview.loops import in_thread_to_the_end
from aggview.member_log import SharedLog, partition_tag
from aggview.security import TlsDir, is_secret
from aggview.status import Malformed, abort, grpc_method
from aggview.streams import AnswerEach
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from ltm.participant import OutcomeQuery, Participant, Settings, VoteNo
from ltm.participant.operations import LocalSub
from ltm.replication import Hearing, LogShipper, Mirror, log_dir_of
from ltm.store import ownership
from ltm.store.base import Store

log = logging.getLogger(__name__)


class Hosting:
    """The partitions one LTM process serves (its own, and any it took over as their backup)
    and the logs it mirrors for other LTMs."""

    def __init__(
        self,
        config: LtmConfig,
        store: Store,
        outcome_query: OutcomeQuery | None = None,
        may_drop: Callable[[], bool] = lambda: True,
        silent: Callable[[int], bool] = lambda backup: False,
        hearing: Hearing | None = None,
    ) -> None:
        """``outcome_query``: how an in-doubt participant asks about a transaction (its
        coordinating member, or that member's successor); ``may_drop()``: whether a copy that
        does not answer may be dropped (``LogShipper``), ``silent(backup)`` whether its member
        fell silent (the copy is then dropped without waiting out the timeout), ``hearing``
        the prober's answers (dropped sooner: ``DropRule``)."""
        self.may_drop = may_drop
        self.silent = silent
        self.hearing = hearing
        self.config = config
        self.store = store
        self.me = config.partition
        self.participants: dict[int, Participant] = {}
        self.records: dict[int, ownership.Ownership] = {}
        self.shippers: dict[int, LogShipper] = {}
        self.mirrors: dict[int, Mirror] = {}
        self._outcome_query = outcome_query
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Serves every partition the store's records give this LTM, at their epochs: after
        a failover, a restarted old primary serves nothing of its own partition (fenced)."""
        for partition in range(self.config.partitions):
            record = await asyncio.to_thread(ownership.read, self.store, partition)
            if record.owner != self.me:
                if partition == self.me:
                    log.warning(
                        "partition %d is served by LTM %d at epoch %d: rejoining as a backup",
                        partition,
                        record.owner,
                        record.epoch,
                    )
                continue
            standby = (record.standby, record.standby_address)
            if record.standby is None and partition == self.me and self.config.backup:
                standby = (self._standby(), self.config.backup)
            await self._serve(record, *standby)

    def _standby(self) -> int:
        if self.config.standby is not None:
            return self.config.standby
        return (self.me + 1) % self.config.partitions

    async def _serve(self, record: ownership.Ownership, standby: int | None, address: str) -> None:
        partition = record.partition
        settings = Settings(
            partition=partition,
            partitions=self.config.partitions,
            cache_rows=self.config.cache_rows,
            checkpoint_interval=self.config.checkpoint_interval,
        )
        shared = self.config.shared_log
        participant = Participant(
            self.store,
            log_dir_of(self.config.log_dir, self.me, partition),
            settings,
            fsync=self.config.fsync,
            outcome_query=self._outcome_query,
            ownership=record,
            wal_observe=self.config.wal_observe,
            log=shared.writer(partition_tag(partition)) if shared else None,
        )
        await participant.start()
        if standby is not None and standby != self.me:
            shipper = LogShipper(
                self.store,
                participant.wal,
                record,
                standby,
                address,
                self.config.tls,
                self.may_drop,
                self.silent,
                self.hearing,
            )
            await shipper.start()
            self.shippers[partition] = shipper
        self.records[partition] = record
        self.participants[partition] = participant

    async def take_over(self, request: pb.TakeOverRequest) -> None:
        """The coordinator recorded this LTM as the partition's owner at ``request.epoch``:
        recover the partition from the store plus the mirrored log, and serve it."""
        async with self._lock:
            partition = request.partition
            served = self.records.get(partition)
            if served is not None and served.epoch == request.epoch:
                return  # a retried request
            record = await asyncio.to_thread(
                ownership.check_owner, self.store, partition, request.epoch, self.me
            )
            if partition in self.participants:
                await self._retire(partition)
            mirror = self.mirrors.pop(partition, None)
            if mirror is None and partition != self.me:
                log.warning("taking over partition %d without a mirror this run", partition)
            standby = request.backup if request.backup >= 0 else None
            await self._serve(record, standby, request.backup_address)
            log.warning("took over partition %d at epoch %d", partition, request.epoch)

    async def hand_over(self, request: pb.HandOverRequest) -> ownership.Ownership:
        """Gives a partition this LTM serves to ``request.to``, which holds an in-sync copy of
        its log: fenced first (nothing more is read or prepared here), then every record is
        on the copy's disk, then the new owner is recorded under this owner's own fence, so
        the two never serve it at once. Before that write, a failure leaves it served here."""
        async with self._lock:
            p = request.partition
            record = self.records.get(p)
            participant = self.participants.get(p)
            if record is None or participant is None or participant.fenced:
                raise ownership.Superseded(f"LTM {self.me} does not serve partition {p}")
            if record.epoch != request.epoch:
                raise ownership.Superseded(
                    f"LTM {self.me} serves partition {p} at epoch {record.epoch}, "
                    f"not {request.epoch}"
                )
            shipper = self.shippers.get(p)
            if shipper is None or shipper.backup != request.to:
                raise errors.FailedPrecondition(
                    f"partition {p}'s log is not copied to LTM {request.to} here"
                )
            reason = f"partition {p} is handed over to LTM {request.to}"
            participant.fenced = reason  # nothing more is asked of it
            participant.wal.closed_to_writes = reason  # nor written by what was asked before
            moved = ownership.Ownership(
                p,
                record.epoch + 1,
                request.to,
                standby=self.me,
                standby_address=request.from_address,
            )
            try:
                await participant.wal.flush()  # shipped to the copy before it returns
                if not shipper.in_sync:
                    raise errors.FailedPrecondition(f"partition {p}'s copy is out of sync")
                await asyncio.to_thread(ownership.hand_over, self.store, record, moved)
            except ownership.Superseded:
                raise  # someone else moved it: fenced it stays
            except BaseException:
                if participant.fenced == reason:
                    participant.fenced = participant.wal.closed_to_writes = None
                raise
            await self._retire(p)
            log.warning(
                "handed partition %d over to LTM %d at epoch %d", p, moved.owner, moved.epoch
            )
            return moved

    def served(self) -> list[int]:
        """The partitions this hosting serves now (not fenced off)."""
        return sorted(p for p, x in self.participants.items() if not x.fenced)

    def participant(self, metadata: dict[str, str]) -> Participant:
        partition = int(metadata.get(ownership.PARTITION_HEADER, self.me))
        epoch = metadata.get(ownership.EPOCH_HEADER)
        if epoch is not None:
            self._hosted(partition)
            if int(epoch) != self.records[partition].epoch:
                raise errors.FailedPrecondition(
                    f"LTM {self.me} serves partition {partition} at epoch "
                    f"{self.records[partition].epoch}, not {epoch}"
                )
        return self.participant_of(partition)

    def participant_of(self, partition: int) -> Participant:
        """The participant of ``partition`` if this hosting serves it now (a caller in this
        process names no epoch: ``coordinator.local_ltm``)."""
        participant = self._hosted(partition)
        if participant.fenced:
            raise errors.NotServed(participant.fenced)
        return participant

    def _hosted(self, partition: int) -> Participant:
        participant = self.participants.get(partition)
        if participant is None:
            raise errors.NotServed(f"LTM {self.me} does not serve partition {partition}")
        return participant

    async def replicate(self, request: pb.ReplicateRequest) -> None:
        """A flush (or resync) of another LTM's log, into our copy; never while a takeover
        recovers from that copy (a flush landing after recovery read it would count as
        durable at the old primary, yet be unknown here)."""
        async with self._lock:
            served = self.participants.get(request.partition)
            if served is not None and not served.fenced:
                raise ownership.Superseded(
                    f"LTM {self.me} serves partition {request.partition} itself "
                    f"(epoch {self.records[request.partition].epoch}), it is nobody's backup"
                )
            if served is not None:  # fenced: its log directory becomes the mirror
                await self._retire(request.partition)
            mirror = self.mirrors.get(request.partition)
            if mirror is None:
                mirror = Mirror(
                    log_dir_of(self.config.log_dir, self.me, request.partition),
                    request.partition,
                    fsync=self.config.fsync,
                )
                self.mirrors[request.partition] = mirror
            # a cancelled stream's flush still finishes before the next one is applied
            await in_thread_to_the_end(mirror.apply, request)

    async def _retire(self, partition: int) -> None:
        """Stops a superseded copy of a partition before its log directory is reused."""
        shipper = self.shippers.pop(partition, None)
        if shipper is not None:
            await shipper.close()
        participant = self.participants.pop(partition)
        participant.fenced = participant.fenced or f"partition {partition} moved on"
        reason = errors.FailedPrecondition(participant.fenced)
        for state in participant.rows.values():  # no waiter may hang on a stopped copy
            state.abandon(reason)
        await participant.stop()  # fenced: no checkpoint
        del self.records[partition]

    async def stop(self) -> None:
        for shipper in self.shippers.values():
            await shipper.close()
        for participant in self.participants.values():
            await participant.stop()


class LtmServicer(pb_grpc.LtmServicer):
    def __init__(self, hosting: Hosting) -> None:
        self.hosting = hosting

    async def Exchange(
        self, messages: AsyncIterator[pb.LtmRequests | Malformed], context: object
    ) -> AsyncIterator[pb.LtmReplies]:
        """The coordinator's stream for one partition: every request handled concurrently,
        every answer sent when ready, the answers ready together in one message (a message
        costs far less than a call, and nothing waits for a batch)."""
        try:
            participant = self.hosting.participant(_metadata(context))
        except errors.AggviewError as exc:
            await abort(context, exc)  # type: ignore[arg-type]

        async for message in exchange(participant).serve(messages):
            yield message

    @grpc_method
    async def DropTable(self, request: pb.DropTableRequest, context: object) -> pb.DropTableReply:
        await self.hosting.participant(_metadata(context)).drop_table(request.table)
        return pb.DropTableReply()

    @grpc_method
    async def Status(self, request: pb.StatusRequest, context: object) -> pb.StatusReply:
        """The LTM process; the figures are those of the partition asked for (by default its
        own) if it serves it, else zero."""
        hosting = self.hosting
        partition = int(_metadata(context).get(ownership.PARTITION_HEADER, hosting.me))
        return status_reply(hosting, partition)

    @grpc_method
    async def Replicate(self, request: pb.ReplicateRequest, context: object) -> pb.ReplicateReply:
        await self._replicate(request)
        return pb.ReplicateReply()

    async def ReplicateStream(
        self, requests: AsyncIterator[pb.ReplicateRequest | Malformed], context: Any
    ) -> AsyncIterator[pb.ReplicateReply]:
        """Each flush applied in order and answered once on disk; the first one refused ends
        the stream with its status (the primary then counts the copy out of sync)."""
        async for request in requests:
            if isinstance(request, Malformed):
                await abort(context, errors.InvalidArgument(f"malformed request: {request.reason}"))
            try:
                await self._replicate(request)
            except errors.AggviewError as exc:
                await abort(context, exc)
            yield pb.ReplicateReply()

    async def _replicate(self, request: pb.ReplicateRequest) -> None:
        await self.hosting.replicate(request)

    @grpc_method
    async def TakeOver(self, request: pb.TakeOverRequest, context: object) -> pb.TakeOverReply:
        await self.hosting.take_over(request)
        return pb.TakeOverReply()

    @grpc_method
    async def HandOver(self, request: pb.HandOverRequest, context: object) -> pb.HandOverReply:
        moved = await self.hosting.hand_over(request)
        return pb.HandOverReply(epoch=moved.epoch)


def exchange(participant: Participant) -> AnswerEach[pb.LtmRequest | Malformed, pb.LtmReply]:
    """A coordinator's stream to ``participant`` (gRPC or framed): every request handled
    concurrently, the answers ready together in one message; a request that did not parse is
    answered with an error and the stream goes on."""

    async def handle(request: pb.LtmRequest | Malformed) -> pb.LtmReply:
        if isinstance(request, Malformed):
            return pb.LtmReply(error=f"malformed: {request.reason}")
        try:
            if request.HasField("prepare"):
                prepare = request.prepare
                participant.observe(prepare.low_watermark, prepare.issued)
                votes = [await prepare_one(participant, sub) for sub in prepare.subs]
                return pb.LtmReply(id=request.id, vote=votes[0] if votes else pb.Vote())
            if request.HasField("read"):
                rows = await read_reply(participant, request.read)
                return pb.LtmReply(id=request.id, rows=rows)
            decide = request.decide
            participant.observe(decide.low_watermark, 0)
            await asyncio.gather(*(participant.decide(d.ts, d.commit) for d in decide.decisions))
            return pb.LtmReply(id=request.id, decided=pb.DecideReply())
        except errors.AggviewError as exc:  # e.g. not ours, or no more (handed over)
            return pb.LtmReply(id=request.id, error=str(exc), error_reason=exc.reason)
        except VoteNo as exc:  # e.g. a row held too long
            return pb.LtmReply(id=request.id, error=str(exc))
        except Exception as exc:  # the stream and the server stay up
            log.exception("request %d on the stream failed", request.id)
            return pb.LtmReply(id=request.id, error=repr(exc))

    return AnswerEach(
        lambda m: [m] if isinstance(m, Malformed) else m.requests,
        handle,
        lambda replies: pb.LtmReplies(replies=replies),
    )


def framed_exchange(
    participant_of: Callable[[dict[str, str]], Participant],
    secret: str | None,
    streams: dict[str, Callable[[pb.ExchangeHello], Answer]] | None = None,
    client_streams: frozenset[str] = frozenset(),
) -> Welcome:
    """What a member's framed-TCP server (``aggview.frames.FramedServer``) does with a
    connection: its hello names the partition and epoch (``participant_of`` refuses a wrong
    one, as for a gRPC stream's metadata) or another of the member's ``streams`` (the clock).
    In a secure cluster a member's stream needs the members' certificate and the secret; one
    of ``client_streams`` (an application's) checks the hello's token itself."""
    streams = streams or {}

    def welcome(hello_bytes: bytes, certified: bool) -> Answer:
        try:
            hello = pb.ExchangeHello.FromString(hello_bytes)
        except DecodeError as exc:
            raise errors.InvalidArgument(f"malformed hello: {exc}") from None
        if hello.stream in client_streams and hello.stream in streams:
            return streams[hello.stream](hello)
        if secret is not None and not is_secret(hello.secret, secret):
            raise errors.PermissionDenied("a member's stream without the cluster secret")
        if secret is not None and not certified:
            raise errors.PermissionDenied("a member's stream without the members' certificate")
        if hello.stream:
            if hello.stream not in streams:
                raise errors.InvalidArgument(f"no stream {hello.stream!r} here")
            return streams[hello.stream](hello)
        participant = participant_of(
            dict(ownership.partition_metadata(hello.partition, hello.epoch))
        )
        return answering(pb.LtmRequests.FromString, exchange(participant).serve, direct=True)

    return welcome


def status_reply(hosting: Hosting, partition: int) -> pb.StatusReply:
    """The LTM process; the figures are those of ``partition`` if it serves it, else zero."""
    reply = pb.StatusReply(
        index=hosting.me,
        partitions=hosting.config.partitions,
        replicas=sorted(hosting.mirrors),
        serving=hosting.served(),
    )
    p = hosting.participants.get(partition)
    if p is not None:
        shipper = hosting.shippers.get(partition)
        reply.cached_rows = len(p.rows)
        reply.dirty_rows = p.dirty_rows()
        reply.prepared = len(p.prepared)
        reply.checkpoints = p.checkpoints
        reply.log_bytes = p.wal.size()
        reply.epoch = hosting.records[partition].epoch
        reply.replicated = shipper is not None and shipper.in_sync
    return reply


def _metadata(context: object) -> dict[str, str]:
    return dict(context.invocation_metadata() or ())  # type: ignore[attr-defined]


async def read_reply(participant: Participant, request: pb.ReadRequest) -> pb.ReadReply:
    resume = b""
    if request.page:
        rows, resume = await participant.read_page(request)
    else:
        rows = await participant.read(request)
    return pb.ReadReply(rows=[pb.KeyValue(key=k, row=v) for k, v in rows], resume=resume)


async def prepare_one(
    participant: Participant, sub: pb.SubTransaction | LocalSub, *, durable: bool = True
) -> pb.Vote:
    try:
        return await participant.prepare(sub, durable=durable)
    except errors.InvalidArgument as exc:  # malformed operations (never the coordinator's)
        return pb.Vote(ts=sub.ts, outcome=pb.Vote.INVALID, message=str(exc))
    except errors.AggviewError as exc:
        return pb.Vote(ts=sub.ts, outcome=pb.Vote.UNAVAILABLE, message=str(exc))
    except Exception as exc:  # e.g. the store is down: this transaction aborts, we serve on
        log.exception("prepare of %d failed", sub.ts, extra={"ts": sub.ts})
        return pb.Vote(ts=sub.ts, outcome=pb.Vote.UNAVAILABLE, message=repr(exc))


@dataclass
class LtmConfig:
    log_dir: Path
    partition: int
    partitions: int
    fsync: bool = True
    cache_rows: int = 1_000_000
    checkpoint_interval: float = 2.0
    tls: TlsDir | None = None  # None: plaintext and no member check (``--insecure``)
    backup: str = ""  # the next LTM's address: this partition's log is replicated there
    standby: int | None = None  # the LTM (partition) at ``backup``; default: the next one
    # called with each flush's seconds by the partitions' logs (a member's metrics)
    wal_observe: Callable[[float], None] | None = None
    # the member's one log, which its partitions write to (unreplicated, in process)
    shared_log: SharedLog | None = None
