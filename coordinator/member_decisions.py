"""A member's decision log, replicated as a partition's log is (``ltm.replication``), so that
when the member dies another one answers for its transactions and delivers its commits.

Member m's log is copied to the member hosting partition ``standby_of(m)``, under the ownership
record ``decision_log_id(m)``: the same fence, in-sync flag and failover rule as a partition's
(a commit counts as logged once the copy has it too, or once the record says the copy is out
of sync, and then nobody takes the log over). On failover member 0 records the copy's holder
as owner and tells it ``TakeOver``: it replays its copy into a ``DecisionLog`` that the
transaction manager answers from and delivers (``TransactionManager.adopt``). A holder that
restarts adopts again what the record gives it. A restarted member takes its log back under
a new epoch. Its own log holds everything the holder's copy does, and maybe more: commits
written here that the copy refused because the log had been taken over. The holder records
which commits its copy held (``ownership.write_adopted``) and the member forgets the others
(``DecisionLog.reconcile``), so the two never answer differently."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from aggview import failpoints
from aggview.loops import in_thread_to_the_end
from aggview.partition_map import decision_log_id, standby_of
from aggview.security import TlsDir
from aggview.wire import ltm_pb2 as pb
from coordinator.decision_log import DecisionLog
from ltm.replication import Hearing, LogShipper, Mirror
from ltm.store import ownership
from ltm.store.base import Store

log = logging.getLogger(__name__)

WATCH_EVERY = 1.0  # how often a member reads its own log's record


class MemberDecisions:
    def __init__(
        self,
        store: Store,
        decisions: DecisionLog,
        member: int,
        members: list[str],
        partitions: int,
        directory: Path,
        adopt: Callable[[DecisionLog], None],
        *,
        tls: TlsDir | None = None,
        fsync: bool = True,
        on_superseded: Callable[[ownership.Superseded], None] | None = None,
        may_drop: Callable[[], bool] = lambda: True,
        silent: Callable[[int], bool] = lambda standby: False,
        hearing: Hearing | None = None,
    ) -> None:
        """``on_superseded``: told when another member took this member's log over (it was
        declared dead while alive, and can commit nothing any more); ``may_drop()``: whether
        a copy that does not answer may be dropped (``LogShipper``), ``silent(standby)``
        whether the copy's member fell silent (dropped then without waiting out the timeout),
        ``hearing`` the prober's answers (dropped sooner: ``ltm.replication.DropRule``)."""
        self.store = store
        self._hearing = hearing
        self._may_drop = may_drop
        self._silent = silent
        self.decisions = decisions
        self.member = member
        self.members = members
        self.partitions = partitions
        self.directory = directory  # copies of other members' logs, and those adopted
        self._adopt = adopt
        self._tls = tls
        self._fsync = fsync
        self._on_superseded = on_superseded
        self.mirrors: dict[int, Mirror] = {}  # record id -> another member's log, copied here
        # dead members' logs adopted here, as (member, log), older adoptions of one member
        # included (their deliveries may still run); and the epoch of each member's newest
        self.adopted: list[tuple[int, DecisionLog]] = []
        self._epochs: dict[int, int] = {}  # record id -> epoch adopted at
        self.shipper: LogShipper | None = None
        self._watch: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def is_log(self, record_id: int) -> bool:
        """Whether an ownership record id names a member's decision log (not a partition)."""
        return record_id >= self.partitions

    def _member_of(self, record_id: int) -> int:
        return record_id - self.partitions

    def _hosts(self, owner: int) -> bool:
        return owner < self.partitions and owner % len(self.members) == self.member

    async def start(self) -> None:
        """Takes this member's log back if another adopted it, ships it to its standby, and
        adopts what the records give this member (a takeover it missed, or one before its
        restart)."""
        own = decision_log_id(self.member, self.partitions)
        for m in range(len(self.members)):
            record_id = decision_log_id(m, self.partitions)
            record = await asyncio.to_thread(ownership.read, self.store, record_id)
            if m != self.member and self._hosts(record.owner) and record.epoch > 0:
                await self.take_over(record_id, record.epoch)
        record = await asyncio.to_thread(ownership.read, self.store, own)
        if record.owner != self.member:  # never written yet, or adopted while we were away
            back = ownership.Ownership(own, record.epoch + 1, self.member)
            # a compare-and-set: fails (and this start with it) if the leader moves it meanwhile
            await asyncio.to_thread(ownership.move, self.store, record, back)
            record = await asyncio.to_thread(ownership.read, self.store, own)
        await self._reconcile(own)
        standby = standby_of(self.member, self.partitions, len(self.members))
        self.shipper = LogShipper(
            self.store,
            self.decisions.wal,
            record,
            standby,
            self.members[standby % len(self.members)],
            self._tls,
            self._may_drop,
            self._silent,
            self._hearing,
        )
        await self.shipper.start()
        if self._on_superseded is not None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_own_log(record))

    async def _reconcile(self, own: int) -> None:
        """After another member adopted this log: forgets the commits its copy did not hold.
        They were written here but refused by the copy (this member had been declared dead
        while alive), never acknowledged, and the adopter answered "aborted" for them. Read
        after this member's own record is written, so no adoption can follow unseen."""
        adopted = await asyncio.to_thread(ownership.read_adopted, self.store, own)
        if adopted is None:
            return
        epoch, copied = adopted
        forgotten = await self.decisions.reconcile(epoch, copied)
        if forgotten:
            log.warning(
                "forgot %d commits of member %d that its copy never held (adopted at epoch "
                "%d, which answered aborted for them): %s",
                len(forgotten),
                self.member,
                epoch,
                forgotten[:5],
            )

    async def _watch_own_log(self, mine: ownership.Ownership) -> None:
        """Every second, whether another member took this member's log over: it may have
        declared this one dead while it was only slow, and an idle member would not find
        out from a flush."""
        assert self._on_superseded is not None
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                now = await asyncio.to_thread(ownership.read, self.store, mine.partition)
            except Exception as exc:  # noqa: BLE001 - the store is back soon; ask again
                log.warning("reading member %d's log record failed: %s", self.member, exc)
                continue
            if (now.owner, now.epoch) != (mine.owner, mine.epoch):
                if failpoints.ARMED:
                    failpoints.hit(failpoints.COORDINATOR_SUPERSEDED)
                self._on_superseded(
                    ownership.Superseded(
                        f"member {self.member}'s decision log is owned by LTM {now.owner} at "
                        f"epoch {now.epoch} now, not by this member at epoch {mine.epoch}"
                    )
                )
                return

    async def replicate(self, request: pb.ReplicateRequest) -> None:
        """Another member's log flush (or resync), into our copy of it; never while the copy
        is being adopted (a flush landing after the adoption read it would count as logged at
        its member, yet be unknown here)."""
        async with self._lock:
            mirror = self.mirrors.get(request.partition)
            if mirror is None:
                mirror = Mirror(
                    self._mirror_dir(request.partition), request.partition, fsync=self._fsync
                )
                self.mirrors[request.partition] = mirror
            # a cancelled stream's flush still finishes before the next one is applied
            await in_thread_to_the_end(mirror.apply, request)

    async def take_over(self, record_id: int, epoch: int) -> None:
        """The record names this member the log's owner at ``epoch``: replay our copy and
        adopt it. Idempotent for a retried request."""
        async with self._lock:
            if self._epochs.get(record_id) == epoch:
                return
            record = await asyncio.to_thread(ownership.read, self.store, record_id)
            if record.epoch != epoch or not self._hosts(record.owner):
                raise ownership.Superseded(
                    f"decision log of member {self._member_of(record_id)} is owned by LTM "
                    f"{record.owner} at epoch {record.epoch}, not here at epoch {epoch}"
                )
            adopted_dir = self.directory / f"adopted-{record_id}-e{epoch}"
            if not adopted_dir.exists():
                mirror = self.mirrors.pop(record_id, None)
                source = self._mirror_dir(record_id)
                if mirror is None and not source.exists():
                    log.warning(
                        "adopting member %d's decisions without a copy",
                        self._member_of(record_id),
                    )
                    source.mkdir(parents=True, exist_ok=True)
                await asyncio.to_thread(source.rename, adopted_dir)
            decisions = await asyncio.to_thread(DecisionLog, adopted_dir, fsync=self._fsync)
            try:  # before answering for the member: it will forget any commit not here
                await asyncio.to_thread(
                    ownership.write_adopted, self.store, record, set(decisions.committed)
                )
            except BaseException:
                await decisions.close()
                raise
            self._epochs[record_id] = epoch
            self.adopted.append((self._member_of(record_id), decisions))
            self._adopt(decisions)
            log.warning(
                "adopted member %d's decision log at epoch %d: %d commits to deliver",
                self._member_of(record_id),
                epoch,
                len(decisions.committed),
            )

    async def answering_for(self) -> list[int]:
        """The members whose decision log this member holds *now*: adopted, and not taken
        back since. A member back from the dead takes its log back under a new epoch, and
        only it knows the transactions it coordinates from then on: an adopter still
        answering for it would call them aborted while they commit."""
        adopted = sorted({member for member, _ in self.adopted})
        if not adopted:
            return []
        ids = [decision_log_id(member, self.partitions) for member in adopted]
        records = await asyncio.to_thread(lambda: [ownership.read(self.store, i) for i in ids])
        return [
            member
            for member, record in zip(adopted, records, strict=True)
            if record.epoch == self._epochs.get(record.partition) and self._hosts(record.owner)
        ]

    def _mirror_dir(self, record_id: int) -> Path:
        return self.directory / f"copy-{record_id}"

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        if self.shipper is not None:
            await self.shipper.close()
        for _, decisions in self.adopted:
            await decisions.close()
            if not decisions.committed:  # everything delivered: nothing to answer any more
                await asyncio.to_thread(shutil.rmtree, decisions.wal.directory, True)
