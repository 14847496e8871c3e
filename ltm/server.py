"""The LTM's gRPC face: a thin servicer over :class:`ltm.participant.Participant`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from aggview import errors
from aggview.net import GRPC_OPTIONS, SERVER_OPTIONS, add_health, run_until_signalled
from aggview.security import MemberGate, TlsDir, member_channel, member_metadata
from aggview.status import Malformed, add_service, grpc_method
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from ltm.participant import Participant, Settings, VoteNo
from ltm.store import open_store

log = logging.getLogger(__name__)


class LtmServicer(pb_grpc.LtmServicer):
    def __init__(self, participant: Participant) -> None:
        self.participant = participant

    async def Exchange(
        self, messages: AsyncIterator[pb.LtmRequests | Malformed], context: object
    ) -> AsyncIterator[pb.LtmReplies]:
        """The coordinator's stream: every request handled concurrently, every answer sent
        when ready, the answers ready together in one message (a message costs far less than a
        call, and nothing waits for a batch)."""
        replies: asyncio.Queue[pb.LtmReply | None] = asyncio.Queue()
        handlers: set[asyncio.Task[None]] = set()

        async def handle(request: pb.LtmRequest) -> None:
            try:
                if request.HasField("prepare"):
                    prepare = request.prepare
                    self.participant.observe(prepare.low_watermark, prepare.issued)
                    votes = [await self._prepare_one(sub) for sub in prepare.subs]
                    reply = pb.LtmReply(id=request.id, vote=votes[0] if votes else pb.Vote())
                elif request.HasField("read"):
                    resume = b""
                    if request.read.page:
                        rows, resume = await self.participant.read_page(request.read)
                    else:
                        rows = await self.participant.read(request.read)
                    reply = pb.LtmReply(
                        id=request.id,
                        rows=pb.ReadReply(
                            rows=[pb.KeyValue(key=k, row=v) for k, v in rows], resume=resume
                        ),
                    )
                else:
                    decide = request.decide
                    self.participant.observe(decide.low_watermark, 0)
                    await asyncio.gather(
                        *(self.participant.decide(d.ts, d.commit) for d in decide.decisions)
                    )
                    reply = pb.LtmReply(id=request.id, decided=pb.DecideReply())
            except (errors.AggviewError, VoteNo) as exc:  # e.g. a row held too long, not ours
                reply = pb.LtmReply(id=request.id, error=str(exc))
            except Exception as exc:  # the stream and the server stay up
                log.exception("request %d on the stream failed", request.id)
                reply = pb.LtmReply(id=request.id, error=repr(exc))
            replies.put_nowait(reply)

        async def read() -> None:
            async for message in messages:
                if isinstance(message, Malformed):
                    replies.put_nowait(pb.LtmReply(error=f"malformed: {message.reason}"))
                    continue
                for request in message.requests:
                    task = asyncio.ensure_future(handle(request))
                    handlers.add(task)
                    task.add_done_callback(handlers.discard)
            if handlers:
                await asyncio.gather(*handlers, return_exceptions=True)
            replies.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (reply := await replies.get()) is not None:
                batch = pb.LtmReplies(replies=[reply])
                while not replies.empty():
                    more = replies.get_nowait()
                    if more is None:
                        replies.put_nowait(None)
                        break
                    batch.replies.append(more)
                yield batch
        finally:
            reader.cancel()

    async def _prepare_one(self, sub: pb.SubTransaction) -> pb.Vote:
        try:
            return await self.participant.prepare(sub)
        except errors.InvalidArgument as exc:  # malformed operations (never the coordinator's)
            return pb.Vote(ts=sub.ts, outcome=pb.Vote.INVALID, message=str(exc))
        except errors.AggviewError as exc:
            return pb.Vote(ts=sub.ts, outcome=pb.Vote.UNAVAILABLE, message=str(exc))
        except Exception as exc:  # e.g. the store is down: this transaction aborts, we serve on
            log.exception("prepare of %d failed", sub.ts)
            return pb.Vote(ts=sub.ts, outcome=pb.Vote.UNAVAILABLE, message=repr(exc))

    @grpc_method
    async def DropTable(self, request: pb.DropTableRequest, context: object) -> pb.DropTableReply:
        await self.participant.drop_table(request.table)
        return pb.DropTableReply()

    @grpc_method
    async def Status(self, request: pb.StatusRequest, context: object) -> pb.StatusReply:
        p = self.participant
        return pb.StatusReply(
            index=p.settings.partition,
            partitions=p.settings.partitions,
            cached_rows=len(p.rows),
            dirty_rows=p.dirty_rows(),
            prepared=len(p.prepared),
            checkpoints=p.checkpoints,
            log_bytes=p.wal.size(),
        )


@dataclass
class LtmConfig:
    store_url: str
    log_dir: Path
    partition: int
    partitions: int
    coordinator: str | None = None  # asked about transactions left undecided
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True
    cache_rows: int = 1_000_000
    checkpoint_interval: float = 2.0
    tls: TlsDir | None = None  # None: plaintext and no member check (``--insecure``)


def _outcome_query(address: str, tls: TlsDir | None):  # type: ignore[no-untyped-def]
    channel = member_channel(address, tls, GRPC_OPTIONS)
    stub = pb_grpc.TransactionOutcomeStub(channel)
    metadata = member_metadata(tls)

    async def query(timestamps: list[int]) -> list[bool | None]:
        reply = await stub.Query(pb.OutcomeRequest(ts=timestamps), timeout=5, metadata=metadata)
        by_code = {pb.OutcomeReply.COMMITTED: True, pb.OutcomeReply.ABORTED: False}
        return [by_code.get(o) for o in reply.outcomes]

    return query


async def serve(config: LtmConfig, ready: asyncio.Event | None = None) -> None:
    """Runs one LTM until SIGINT/SIGTERM, then checkpoints and exits."""
    store = open_store(config.store_url)
    settings = Settings(
        partition=config.partition,
        partitions=config.partitions,
        cache_rows=config.cache_rows,
        checkpoint_interval=config.checkpoint_interval,
    )
    participant = Participant(
        store,
        config.log_dir,
        settings,
        fsync=config.fsync,
        outcome_query=(
            _outcome_query(config.coordinator, config.tls) if config.coordinator else None
        ),
    )
    await participant.start()
    # secure: mutual TLS (members' certificate) and the cluster secret on every call
    gates = [MemberGate(config.tls.secret)] if config.tls is not None else []
    server = grpc.aio.server(interceptors=gates or None, options=[*GRPC_OPTIONS, *SERVER_OPTIONS])
    add_service(server, pb.DESCRIPTOR.services_by_name["Ltm"], LtmServicer(participant))
    add_health(server)
    credentials = config.tls.server_credentials(members_only=True) if config.tls else None
    await run_until_signalled(
        server, config.host, config.port, f"ltm {config.partition}", ready, credentials
    )
    await participant.stop()
    store.close()
    log.info("ltm %d stopped", config.partition)
