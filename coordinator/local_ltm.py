"""Partitions served inside the coordinator's process (``--processes 1``): each partition's
participant is called directly, with the very protobuf objects the gRPC path would have sent, so
a transaction costs no message between processes, no serialization and no second event loop.

Votes are written to the participant's log without waiting for the disk: a transaction with one
participant commits with one durable write (its prepare and commit records flushed together, no
decision record), one with several flushes their prepares before its decision is logged.

``LocalLtm`` answers the calls the transaction manager makes on an ``LtmChannel``; decisions are
still collected per partition (one batch in flight, what arrives meanwhile in the next), so the
participant's log groups them as it does behind a stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.status import grpc_method
from aggview.wire import ltm_pb2 as pb
from coordinator.ltm_channel import Batcher
from ltm.participant import OutcomeQuery, Participant, VoteNo
from ltm.server import (
    Hosting,
    LtmConfig,
    LtmServicer,
    prepare_one,
    read_reply,
    status_reply,
)
from ltm.store import Store, ownership


class LocalPartitions:
    """The partitions hosted in this process: every one of the cluster (``--processes 1``),
    or a member's share (no backups in either layout yet)."""

    def __init__(
        self,
        store: Store,
        log_dir: Path,
        partitions: int,
        outcome_query: OutcomeQuery,
        *,
        fsync: bool = True,
        cache_rows: int = 1_000_000,
        checkpoint_interval: float = 2.0,
        hosted: list[int] | None = None,
    ) -> None:
        self.hostings = {
            p: Hosting(
                LtmConfig(
                    store_url="",
                    log_dir=log_dir / f"partition-{p}",  # each partition's log on its own
                    partition=p,
                    partitions=partitions,
                    fsync=fsync,
                    cache_rows=cache_rows,
                    checkpoint_interval=checkpoint_interval,
                ),
                store,
                outcome_query,
            )
            for p in (range(partitions) if hosted is None else hosted)
        }

    def participant(self, metadata: dict[str, str]) -> Participant:
        """The participant a member's stream or call names (``ltm.server.LtmServicer``)."""
        partition = int(metadata.get(ownership.PARTITION_HEADER, -1))
        hosting = self.hostings.get(partition)
        if hosting is None:
            raise errors.FailedPrecondition(f"partition {partition} is not hosted here")
        return hosting.participant(metadata)

    async def start(self) -> None:
        for hosting in self.hostings.values():
            await hosting.start()

    async def stop(self) -> None:
        for hosting in self.hostings.values():
            await hosting.stop()


class LocalLtm:
    """One partition, in process, behind the ``LtmChannel`` calls."""

    address = "in-process"

    def __init__(
        self, index: int, hosting: Hosting, watermarks: Callable[[], tuple[int, int]]
    ) -> None:
        self.index = self.owner = index
        self.epoch = 0
        self.hosting = hosting
        self._watermarks = watermarks
        self.decisions: Batcher[pb.Decision, None] = Batcher(self._send_decisions)

    @property
    def participant(self) -> Participant:
        return self.hosting.participant({})

    def point(self, address: str, owner: int, epoch: int) -> None:
        """Nothing moves in one process: kept for the channel's interface."""

    async def prepare(self, sub: pb.SubTransaction) -> pb.Vote:
        """The vote is not durable yet: the transaction manager makes it so, with the commit
        record of a one-partition transaction, or by ``flush`` before logging its decision."""
        participant = self.participant
        low, issued = self._watermarks()
        participant.observe(low, issued)
        return await prepare_one(participant, sub, durable=False)

    async def flush(self) -> None:
        """Every prepare record so far is durable."""
        await self.participant.wal.flush()

    async def _send_decisions(
        self, decisions: list[pb.Decision]
    ) -> AsyncIterator[tuple[int, None]]:
        participant = self.participant
        participant.observe(self._watermarks()[0], 0)
        await asyncio.gather(*(participant.decide(d.ts, d.commit) for d in decisions))
        for i in range(len(decisions)):
            yield i, None

    async def decide(self, ts: int, commit: bool) -> None:
        await self.decisions.submit(pb.Decision(ts=ts, commit=commit))

    async def read(self, request: pb.ReadRequest) -> pb.ReadReply:
        try:
            return await read_reply(self.participant, request)
        except VoteNo as exc:  # e.g. a row held too long: what the stream would have said
            raise errors.Unavailable(f"LTM {self.index}: {exc}") from None

    async def drop_table(self, table_id: str) -> None:
        await self.participant.drop_table(table_id)

    async def status(self) -> pb.StatusReply:
        return status_reply(self.hosting, self.index)

    async def close(self) -> None:
        """The participants stop with ``LocalPartitions.stop``."""


class MemberLtmServicer(LtmServicer):
    """Other members' streams and calls to the partitions this member hosts."""

    def __init__(self, local: LocalPartitions, manager: Any) -> None:
        super().__init__(local)  # type: ignore[arg-type]  # participant() is all it needs
        self.local = local
        self.manager = manager  # the member's TransactionManager

    @grpc_method
    async def Status(self, request: pb.StatusRequest, context: object) -> pb.StatusReply:
        metadata = dict(context.invocation_metadata() or ())  # type: ignore[attr-defined]
        partition = int(metadata.get(ownership.PARTITION_HEADER, -1))
        if partition == -1:  # the member itself
            clock = self.manager.clock
            return pb.StatusReply(
                coordinated=self.manager.committed,
                clock_requests=getattr(clock, "requests", 0),
                clock_replies=getattr(clock, "replies", 0),
                refreshes=self.manager.refreshes,
            )
        hosting = self.local.hostings.get(partition)
        if hosting is None:
            raise errors.FailedPrecondition(f"partition {partition} is not hosted here")
        return status_reply(hosting, partition)

    @grpc_method
    async def Replicate(self, request: pb.ReplicateRequest, context: object) -> pb.ReplicateReply:
        raise errors.FailedPrecondition("members do not replicate their partitions yet")

    @grpc_method
    async def TakeOver(self, request: pb.TakeOverRequest, context: object) -> pb.TakeOverReply:
        raise errors.FailedPrecondition("members do not take partitions over yet")
