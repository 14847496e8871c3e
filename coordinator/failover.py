"""Failover: when an LTM stops answering for good, its partitions move to their standbys.

The coordinator probes every LTM that serves a partition. One silent for ``after`` seconds is
taken for dead: for each partition it served, a new epoch is recorded in the store with the
in-sync standby as owner, the standby is told to take the partition over (it recovers it from
the store plus its copy of the log), and the partition's channel points there. Transactions
caught mid-way abort (their votes never came) or are re-delivered their commit (the decision
log keeps it). A partition whose standby is not in sync is not moved: it waits for its LTM.

With coordinating members (``--processes P --replicate``) member 0 watches the others: a dead
member's decision log moves first (its copy's holder adopts it and answers for the dead
member's transactions, ``coordinator.member_decisions``), then its partitions, and the clock
stops waiting for it. The other members follow the records (``PartitionFollower``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from aggview.net import CONTROL_OPTIONS
from aggview.partition_map import decision_log_id
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from coordinator.ltm_channel import LtmChannel
from coordinator.quorum import PROBE_EVERY, PROBE_TIMEOUT
from ltm.store import ownership
from ltm.store.base import Store

log = logging.getLogger(__name__)

# A process never heard from yet is still starting (a cluster starts its processes one by
# one, each a second or more under load): it is declared dead only after this long.
START_GRACE = 15.0
# the last, fresh probe of a member silent for the whole delay: a live one on the network
# answers a connect and a Status well within it
LAST_PROBE = 0.3
HAND_BACK_EVERY = 1.0  # seconds between looks for partitions to give back to their home

Follow = Callable[[Any, ownership.Ownership], Awaitable[None]]


async def retarget(channel: Any, address: str, record: ownership.Ownership) -> None:
    """The default way a channel follows a moved partition: to the new owner's address."""
    await channel.retarget(address, record.owner, record.epoch)


class Failover:
    def __init__(
        self,
        channels: list[LtmChannel],
        store: Store,
        addresses: list[str],
        tls: TlsDir | None,
        after: float,
        *,
        members: int = 0,
        lose_member: Callable[[int], None] = lambda member: None,
        follow: Follow | None = None,
        hand_back: bool = False,
        may_act: Callable[[], bool] = lambda: True,
        silent_to_majority: Callable[[int], bool] = lambda member: True,
    ) -> None:
        """``addresses``: where each LTM (partition index) is served; ``members``: how many
        coordinating members host them (0: one LTM per process), ``lose_member`` hears of a
        member whose decision log was adopted; ``follow(channel, record)`` points a channel
        where the record says; ``hand_back``: partitions go back to their home LTM once it
        is up again with an in-sync copy; ``may_act()``: whether this member reaches a
        majority (a minority declares nobody dead: its view of who is alive is its own);
        ``silent_to_majority(member)``: whether most members do not hear it either (a link cut
        between two members moves nothing)."""
        self.channels = channels
        self.may_act = may_act
        self.silent_to_majority = silent_to_majority
        self.follow: Follow = follow or (
            lambda channel, record: retarget(channel, self.addresses[record.owner], record)
        )
        self.hand_back = hand_back
        self._unserved: dict[int, ownership.Ownership] = {}  # handed back, not yet taken
        self._next_hand_back = 0.0
        self.handovers = 0
        self.members = members
        self.lose_member = lose_member
        self.store = store
        self.addresses = addresses
        self.after = after
        self._metadata = member_metadata(tls)
        self._tls = tls
        self._channels = [member_channel(a, tls, CONTROL_OPTIONS) for a in addresses]
        self._stubs = [pb_grpc.LtmStub(channel) for channel in self._channels]
        self._down_since: dict[int, float] = {}
        self._heard: set[int] = set()  # LTMs that answered a probe at least once
        self._task: asyncio.Task[None] | None = None
        self._stuck: set[int] = set()  # partitions already reported as waiting for their LTM
        # member -> the epoch of its decision log's record when it fell silent (or when we
        # moved it): a newer one means it restarted since (it takes its log back first)
        self._log_epochs: dict[int, int] = {}
        self.failovers = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def silent_since(self, member: int, since: float) -> None:
        """``member`` has not answered since ``since`` (seen by another: a leader that took
        over from it), so it is not given ``after`` seconds more."""
        for ltm in range(len(self.addresses)):
            if self.members and ltm % self.members == member:
                self._down_since[ltm] = since
                self._heard.add(ltm)  # the member that saw it heard it

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for channel in self._channels:
            await channel.close()

    async def _alive(self, ltm: int) -> bool:
        """Once ``ltm`` left a probe unanswered, it is probed on a new connection each time
        (``_answers_afresh``), so the probe that finds it silent long enough is one already:
        a last probe after the delay cost a second more on a cut host."""
        since = self._down_since.get(ltm)
        if since is None:
            return await self._answers(self._stubs[ltm])
        # silent for the whole delay already (a leader that took over from it said so): the
        # last probe is a short one, else the failover waits a probe's timeout more
        overdue = time.monotonic() - since >= self.after and ltm in self._heard
        return await self._answers_afresh(ltm, LAST_PROBE if overdue else PROBE_TIMEOUT)

    async def _answers(self, stub: pb_grpc.LtmStub, timeout: float = PROBE_TIMEOUT) -> bool:
        try:
            await stub.Status(pb.StatusRequest(), timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY)
            # with members, each member too (hosting m is member m's): one that serves no
            # partition any more still coordinates, and its decision log may need a new home
            owners = sorted({channel.owner for channel in self.channels} | set(range(self.members)))
            sent = time.monotonic()
            alive = await asyncio.gather(*(self._alive(ltm) for ltm in owners))
            now = time.monotonic()
            if not self.may_act():
                self._down_since.clear()  # silence seen from a minority proves nothing
                continue
            if self.hand_back and now >= self._next_hand_back:
                self._next_hand_back = now + HAND_BACK_EVERY
                answering = {
                    self.addresses[ltm] for ltm, up in zip(owners, alive, strict=True) if up
                }
                try:
                    await self._give_back(answering)
                except Exception:
                    log.exception("handing partitions back failed")
            for ltm, up in zip(owners, alive, strict=True):
                if up:
                    self._down_since.pop(ltm, None)
                    self._heard.add(ltm)
                    continue
                if ltm not in self._down_since:
                    # silent since the first probe it left unanswered was sent, not since
                    # that probe timed out (as the leader's successor counts)
                    self._down_since[ltm] = sent
                    if self.members:
                        await self._note_log_epoch(ltm % self.members)
                    continue  # the next probe goes on a new connection (``_alive``)
                since = self._down_since[ltm]
                if now - since < (self.after if ltm in self._heard else START_GRACE):
                    continue
                if self.members and not self.silent_to_majority(ltm % self.members):
                    continue  # others hear it: a link of ours is cut, not the member
                if self.members and not await self._member_gone(ltm % self.members):
                    self._down_since[ltm] = now  # it is starting again: give it time
                    continue
                for channel in self.channels:
                    if channel.owner == ltm:
                        try:
                            await self.fail_over(channel)
                        except Exception:
                            log.exception("failover of partition %d failed", channel.index)

    async def _note_log_epoch(self, member: int) -> None:
        record_id = decision_log_id(member, len(self.addresses))
        try:
            record = await asyncio.to_thread(ownership.read, self.store, record_id)
        except Exception as exc:
            log.warning("reading member %d's decision log record failed: %s", member, exc)
            return
        self._log_epochs[member] = record.epoch

    async def _answers_afresh(self, ltm: int, timeout: float) -> bool:
        """A last probe on a new connection before declaring ``ltm`` dead: a connection cut
        by the network may still be waiting out a connect attempt after the member is back."""
        channel = member_channel(self.addresses[ltm], self._tls, CONTROL_OPTIONS)  # its own
        try:
            return await self._answers(pb_grpc.LtmStub(channel), timeout)
        finally:
            await channel.close()

    async def _member_gone(self, member: int) -> bool:
        """Before its partitions: the dead member's decision log goes to its copy's holder,
        which then answers for its transactions; only then may the clock forget it. False: it
        took its log back since it fell silent (or since we last moved it), so it is starting
        again (it does that before it listens)."""
        record_id = decision_log_id(member, len(self.addresses))
        try:
            record = await asyncio.to_thread(ownership.read, self.store, record_id)
            if record.owner % self.members == member:
                if record.epoch > self._log_epochs.get(member, record.epoch):
                    self._log_epochs[member] = record.epoch
                    return False
                moved = await self._move(record_id)
                if moved is None:
                    return True  # no copy in sync: its transactions wait for it
                self._log_epochs[member] = moved.epoch
                await self._take_over(moved)
            self.lose_member(member)
        except Exception:
            log.exception("moving member %d's decision log failed", member)
        return True

    async def fail_over(self, channel: LtmChannel) -> bool:
        moved = await self._move(channel.index)
        if moved is None:
            return False
        # The channel moves even if the call fails: the standby serves the partition on its
        # next start anyway, since the record names it.
        await self.follow(channel, moved)
        self._down_since.pop(moved.owner, None)
        await self._take_over(moved)
        self.failovers += 1
        return True

    async def _give_back(self, answering: set[str]) -> None:
        """Each partition served away from its home LTM (it died, and came back as the
        backup) goes home once both answer and the copy is in sync: the owner hands it over
        (``Hosting.hand_over``), then the home takes it, then the channels follow. A take
        that failed is tried again each round."""
        records = await asyncio.to_thread(
            lambda: [ownership.read(self.store, p) for p in range(len(self.channels))]
        )
        for record in records:
            p = record.partition
            moved = self._unserved.pop(p, None)
            if moved is None and record.owner == p and record.epoch != self.channels[p].epoch:
                # Home already, by a hand-over whose reply was lost (or whose take failed
                # before it was remembered): the take and the channels' move are still due.
                if self.addresses[p] not in answering or record.standby is None:
                    continue
                moved = record
            elif moved is None:
                if record.owner == p or record.standby != p or not record.in_sync:
                    continue
                if not {self.addresses[p], self.addresses[record.owner]} <= answering:
                    continue
                try:
                    reply = await self._stubs[record.owner].HandOver(
                        pb.HandOverRequest(
                            partition=p,
                            epoch=record.epoch,
                            to=p,
                            from_address=self.addresses[record.owner],
                        ),
                        timeout=30,
                        metadata=self._metadata,
                    )
                except grpc.aio.AioRpcError as exc:
                    log.warning("partition %d stays at LTM %d: %s", p, record.owner, exc.details())
                    continue
                moved = ownership.Ownership(
                    p,
                    reply.epoch,
                    p,
                    standby=record.owner,
                    standby_address=self.addresses[record.owner],
                )
                self.handovers += 1
            elif record.epoch != moved.epoch:
                continue  # moved on since
            try:
                await self._take_over(moved)
            except grpc.aio.AioRpcError as exc:
                log.warning("partition %d: LTM %d did not take it yet: %s", p, p, exc.details())
                self._unserved[p] = moved
            await self.follow(self.channels[p], moved)

    async def _move(self, partition: int) -> ownership.Ownership | None:
        """Records the in-sync standby as the owner at the next epoch (None: there is none)."""
        record = await asyncio.to_thread(ownership.read, self.store, partition)
        target = record.failover_target
        if target is None or target == record.owner:
            if partition not in self._stuck:
                self._stuck.add(partition)
                log.warning(
                    "LTM %d is down and partition %d has no in-sync standby: waiting for it",
                    record.owner,
                    partition,
                )
            return None
        self._stuck.discard(partition)
        moved = ownership.Ownership(
            partition,
            record.epoch + 1,
            target,
            standby=record.owner,  # resynced when it comes back
            standby_address=self.addresses[record.owner],
        )
        try:
            await asyncio.to_thread(ownership.move, self.store, record, moved)
        except ownership.Moved as exc:
            log.warning("partition %d not moved: %s", partition, exc)
            return None
        log.warning(
            "partition %d: LTM %d is down, LTM %d takes over at epoch %d",
            partition,
            record.owner,
            target,
            moved.epoch,
        )
        return moved

    async def _take_over(self, moved: ownership.Ownership) -> None:
        assert moved.standby is not None
        await self._stubs[moved.owner].TakeOver(
            pb.TakeOverRequest(
                partition=moved.partition,
                epoch=moved.epoch,
                backup=moved.standby,
                backup_address=moved.standby_address,
            ),
            timeout=120,
            metadata=self._metadata,
        )


class PartitionFollower:
    """At a member other than 0: points its channels wherever the store's records say each
    partition is served now (member 0 moved it), checking every ``every`` seconds."""

    def __init__(
        self,
        channels: list[Any],
        store: Store,
        addresses: list[str],
        every: float = 0.5,
        follow: Follow | None = None,
    ) -> None:
        self.channels = channels
        self.store = store
        self.addresses = addresses
        self.every = every
        self.follow: Follow = follow or (
            lambda channel, record: retarget(channel, self.addresses[record.owner], record)
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _records(self, partitions: list[int]) -> list[ownership.Ownership]:
        return [ownership.read(self.store, p) for p in partitions]

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            channels = list(self.channels)  # a served one moves too when handed back home
            try:
                records = await asyncio.to_thread(self._records, [c.index for c in channels])
            except Exception:
                log.exception("reading the partitions' records failed")
                continue
            for channel, record in zip(channels, records, strict=True):
                if record.epoch != channel.epoch:
                    log.warning(
                        "partition %d: now at LTM %d, epoch %d",
                        channel.index,
                        record.owner,
                        record.epoch,
                    )
                    await self.follow(channel, record)
