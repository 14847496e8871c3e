"""Partitions served inside the coordinator's process (``--processes 1``): each partition's
participant is called directly, with the very protobuf objects the gRPC path would have sent, so
a transaction costs no message between processes, no serialization and no second event loop.

Votes are written to the participant's log without waiting for the disk: a transaction with one
participant commits with one durable write (its prepare and commit records flushed together, no
decision record), one with several flushes their prepares before its decision is logged.

``LocalLtm`` answers the calls the transaction manager makes on an ``LtmChannel``. Decisions go
to the participant at once: its log's group commit puts what arrives during a flush into the
next one. (They used to be batched here as for a stream, one batch in flight; that only added a
wait between one flush and the next, about 0.5 ms of a one-partition commit's 2-3 ms at 8
clients.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.member_log import SharedLog, shared_log_of
from aggview.partition_map import standby_of
from aggview.security import TlsDir
from aggview.status import grpc_method
from aggview.wire import ltm_pb2 as pb
from coordinator.member_decisions import MemberDecisions
from coordinator.quorum import Reachability
from ltm.participant import OutcomeQuery, Participant, VoteNo
from ltm.participant.operations import LocalSub
from ltm.replication import Hearing
from ltm.server import (
    Hosting,
    LtmConfig,
    LtmServicer,
    prepare_one,
    read_reply,
    status_reply,
)
from ltm.store import Store, ownership


class DirectDecisions:
    """What a ``Batcher`` of decisions offers the transaction manager (``submit``, counts),
    each decision delivered on its own: an in-process participant's log groups them. A
    decision's future is the log's flush, with no task of its own
    (``Participant.decide_at_once``)."""

    def __init__(self, ltm: LocalLtm) -> None:
        self._ltm = ltm
        self.calls = self.items = 0

    def submit(self, decision: pb.Decision) -> asyncio.Future[None]:
        self.calls += 1
        self.items += 1
        try:
            durable = self._ltm.decide_at_once(decision.ts, decision.commit)
        except Exception as exc:  # noqa: BLE001 - e.g. fenced: the delivery hears it
            durable = asyncio.get_running_loop().create_future()
            durable.set_exception(exc)
        return durable


class LocalPartitions:
    """The partitions hosted in this process: every one of the cluster (``--processes 1``),
    or a member's share. Each is a ``Hosting`` named by its home partition; with ``members``
    (the members' addresses, ``--replicate``) each copies its log to the member of
    ``standby_of`` its partition, and may take others over when their member dies."""

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
        members: list[str] | None = None,
        tls: TlsDir | None = None,
        may_drop: Callable[[], bool] = lambda: True,
        silent: Callable[[int], bool] = lambda ltm: False,
        wal_observe: Callable[[float], None] | None = None,
        hearing: Hearing | None = None,
        shared_log: SharedLog | None = None,
    ) -> None:
        """``may_drop()``: whether a copy that does not answer may be dropped (only while
        this member reaches a majority: ``coordinator.quorum``); ``silent(ltm)``: whether
        the member hosting LTM ``ltm`` fell silent to this member's prober; ``hearing``:
        that prober's answers (a copy is dropped sooner: ``ltm.replication.DropRule``);
        ``shared_log``: the member's one log, which every partition here writes to."""
        self.store = store
        self.partitions = partitions
        self.members = members or []

        def config(p: int) -> LtmConfig:
            standby = standby_of(p, partitions, len(self.members)) if self.members else None
            return LtmConfig(
                log_dir=log_dir / f"partition-{p}",  # each partition's log on its own
                partition=p,
                partitions=partitions,
                fsync=fsync,
                cache_rows=cache_rows,
                checkpoint_interval=checkpoint_interval,
                tls=tls,
                backup="" if standby is None else self.members[standby % len(self.members)],
                standby=standby,
                wal_observe=wal_observe,
                shared_log=shared_log,
            )

        self.hostings = {
            p: Hosting(config(p), store, outcome_query, may_drop, silent, hearing)
            for p in (range(partitions) if hosted is None else hosted)
        }

    def serving(self, partition: int) -> Hosting | None:
        """The hosting that serves ``partition`` now (its own, or one that took it over)."""
        for hosting in self.hostings.values():
            if partition in hosting.participants:
                return hosting
        return None

    def participant(self, metadata: dict[str, str]) -> Participant:
        """The participant a member's stream or call names (``ltm.server.LtmServicer``)."""
        partition = int(metadata.get(ownership.PARTITION_HEADER, -1))
        hosting = self.serving(partition)
        if hosting is None:
            raise errors.NotServed(f"partition {partition} is not served here")
        return hosting.participant(metadata)

    def copying(self, partition: int) -> Hosting:
        """Where another member's log flush for ``partition`` goes: the hosting of that
        partition itself if it is here (an old owner, back as its backup), else the one the
        chain names."""
        hosting = self.hostings.get(partition)
        if hosting is None and self.members:
            hosting = self.hostings.get(standby_of(partition, self.partitions, len(self.members)))
        if hosting is None:
            raise errors.FailedPrecondition(f"partition {partition}'s log is not copied here")
        return hosting

    async def start(self) -> None:
        for hosting in self.hostings.values():
            await hosting.start()

    async def stop(self) -> None:
        for hosting in self.hostings.values():
            await hosting.stop()


class LocalLtm:
    """One partition, in process, behind the ``LtmChannel`` calls."""

    address = "in-process"
    in_process = True  # called directly: see ``Commits._prepare_round``

    def __init__(
        self,
        index: int,
        hosting: Hosting,
        watermarks: Callable[[], tuple[int, int]],
        epoch: int = 0,
    ) -> None:
        self.index = index
        self.owner = hosting.me  # the hosting serving it (another's, after a failover)
        self.epoch = epoch  # its ownership record's
        self.hosting = hosting
        self._watermarks = watermarks
        self.decisions = DirectDecisions(self)

    @property
    def participant(self) -> Participant:
        return self.hosting.participant_of(self.index)

    def point(self, address: str, owner: int, epoch: int) -> None:
        """Nothing moves in one process: kept for the channel's interface."""

    async def prepare(self, sub: pb.SubTransaction | LocalSub) -> pb.Vote:
        """The vote is not durable yet: the transaction manager makes it so, with the commit
        record of a one-partition transaction, or by ``flush`` before logging its decision."""
        participant = self.participant
        low, issued = self._watermarks()
        participant.observe(low, issued)
        return await prepare_one(participant, sub, durable=False)

    async def flush(self) -> None:
        """Every prepare record so far is durable."""
        await self.participant.flush_prepared()

    @property
    def log(self) -> SharedLog | None:
        """The member's one log, if the partition writes to it."""
        return shared_log_of(self.participant.wal)

    def logged_with_decision(self, ts: int) -> None:
        """Its prepares are durable: they precede ``ts``'s durable decision in ``log``."""
        self.participant.logged_with_decision(ts)

    def decision_logged(self, ts: int, lsn: int) -> None:
        """Applied now: the decision record at ``lsn`` is durable."""
        participant = self.participant
        participant.observe(self._watermarks()[0], 0)
        participant.decision_logged(ts, lsn)

    async def decide(self, ts: int, commit: bool) -> None:
        participant = self.participant
        participant.observe(self._watermarks()[0], 0)
        await participant.decide(ts, commit)

    def decide_at_once(self, ts: int, commit: bool) -> asyncio.Future[None]:
        """:meth:`decide` applied now (``Participant.decide_at_once``)."""
        participant = self.participant
        participant.observe(self._watermarks()[0], 0)
        return participant.decide_at_once(ts, commit)

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


def view_statuses(manager: Any) -> list[pb.ViewStatus]:
    """Each view's mode and state, and how long ago this member last refreshed it."""
    lags = manager.metrics.lags()
    views = manager.views.views.values() if manager.views is not None else []
    return [
        pb.ViewStatus(name=v.name, mode=v.plan.mode, state=v.state, lag_seconds=lags.get(v.name))
        for v in sorted(views, key=lambda v: v.name)
    ]


class MemberLtmServicer(LtmServicer):
    """Other members' streams and calls to the partitions this member hosts."""

    def __init__(
        self,
        local: LocalPartitions,
        manager: Any,
        decisions: MemberDecisions | None = None,
        reach: Reachability | None = None,
    ) -> None:
        """``reach``: the members this one hears (told in its status, for their quorum)."""
        super().__init__(local)  # type: ignore[arg-type]  # participant() is all it needs
        self.reach = reach
        self.local = local
        self.manager = manager  # the member's TransactionManager
        self.decisions = decisions  # its decision log's replication (``--replicate``)

    @grpc_method
    async def Status(self, request: pb.StatusRequest, context: object) -> pb.StatusReply:
        metadata = dict(context.invocation_metadata() or ())  # type: ignore[attr-defined]
        partition = int(metadata.get(ownership.PARTITION_HEADER, -1))
        if partition == -1:  # the member itself
            clock = self.manager.clock
            hostings = self.local.hostings.values()
            return pb.StatusReply(
                serving=sorted(p for h in hostings for p in h.served()),
                replicas=sorted(p for h in hostings for p in h.mirrors),
                coordinated=self.manager.committed,
                clock_requests=getattr(clock, "requests", 0),
                clock_replies=getattr(clock, "replies", 0),
                refreshes=self.manager.refreshes,
                reaches=sorted(self.reach.reachable()) if self.reach is not None else [],
                leader=self.manager.leader_member,
                term=self.manager.lead.term if self.manager.lead is not None else 0,
                views=view_statuses(self.manager),
                metrics_port=self.manager.metrics.metrics_port,
            )
        hosting = self.local.serving(partition) or self.local.hostings.get(partition)
        if hosting is None:
            raise errors.FailedPrecondition(f"partition {partition} is not hosted here")
        return status_reply(hosting, partition)

    def _replicated(self) -> MemberDecisions:
        if self.decisions is None:
            raise errors.FailedPrecondition("this member does not replicate (no --replicate)")
        return self.decisions

    async def _replicate(self, request: pb.ReplicateRequest) -> None:
        decisions = self._replicated()
        if decisions.is_log(request.partition):
            await decisions.replicate(request)
        else:
            await self.local.copying(request.partition).replicate(request)

    @grpc_method
    async def TakeOver(self, request: pb.TakeOverRequest, context: object) -> pb.TakeOverReply:
        decisions = self._replicated()
        if decisions.is_log(request.partition):
            await decisions.take_over(request.partition, request.epoch)
            return pb.TakeOverReply()
        record = await asyncio.to_thread(ownership.read, self.local.store, request.partition)
        hosting = self.local.hostings.get(record.owner)
        if hosting is None:
            raise ownership.Superseded(
                f"partition {request.partition} is owned by LTM {record.owner} at epoch "
                f"{record.epoch}, which is not hosted here"
            )
        await hosting.take_over(request)
        return pb.TakeOverReply()

    @grpc_method
    async def HandOver(self, request: pb.HandOverRequest, context: object) -> pb.HandOverReply:
        hosting = self.local.serving(request.partition)
        if hosting is None:
            raise ownership.Superseded(f"partition {request.partition} is not served here")
        moved = await hosting.hand_over(request)
        return pb.HandOverReply(epoch=moved.epoch)
