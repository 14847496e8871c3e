"""What a coordinating member runs as the cluster's leader or as a follower, and the move from
follower to leader when the leader dies (``coordinator.leadership`` has the rules).

- The leader keeps the clock and the catalog, runs the view manager's leader duties (cumulus
  runtimes, initializations, a dead member's refreshers) and, replicated, watches the other
  members (``Failover``) and renews its lease.
- A follower follows the partitions' records (``PartitionFollower``); the leader's successor
  also probes the leader, and after ``failover_after`` seconds of silence takes over: it
  writes the new term, waits out the old leader's lease, builds a leader clock above every
  timestamp the old one could have granted (the store's reservation), publishes the catalog
  at the new term's first epoch, and starts the leader's duties. Its ``Failover`` then finds
  the old leader dead like any member: the old leader's decision log and partitions move,
  and only then does the clock stop waiting for its transactions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc

from aggview.net import CONTROL_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from coordinator import leadership
from coordinator.clock import Clock
from coordinator.clock_service import FollowerClock
from coordinator.failover import Failover, PartitionFollower
from coordinator.leadership import Leadership, Lease
from coordinator.local_ltm import LocalLtm
from coordinator.ltm_channel import LtmChannel
from coordinator.member_clock import LeaderClock
from coordinator.quorum import PROBE_EVERY, PROBE_TIMEOUT, Prober, Reachability
from coordinator.timestamp_oracle import TimestampOracle
from coordinator.transactions import TransactionManager
from ltm.store import ownership

log = logging.getLogger(__name__)

DEPOSED_EXIT = 87  # a leader that finds another member's term in the record stops at once
# a member whose decision log another member took over (declared dead while alive) stops
DECLARED_DEAD_EXIT = 88
MIN_PROBE = 0.05  # the shortest probe of a silent leader (the failover delay's last moment)


class MemberRoles:
    def __init__(
        self,
        manager: TransactionManager,
        addresses: list[str],
        *,
        failover_after: float,
        tls: TlsDir | None,
        replicates: bool,
        lead: Leadership | None,
        prober: Prober | None = None,
    ) -> None:
        """``addresses``: where each partition index is hosted; ``lead``: the record this
        member leads under (a replicated cluster's leader), else None; ``prober``: feeds which
        members answer this one (replicated: it leads, deposes and fails over only with a
        majority; started already if the member waited for one at start)."""
        self.manager = manager
        self.addresses = addresses
        self.after = failover_after
        self.tls = tls
        self.replicates = replicates
        self.lead = lead
        self.store = manager.catalog.store
        self.failover: Failover | None = None
        self.follower: PartitionFollower | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.reach: Reachability | None = prober.reach if prober is not None else None
        self._prober = prober
        self._minority_told = False
        self._lost: set[int] = set()  # lost while taking the lead, before the leader clock

    def has_majority(self) -> bool:
        """Whether this member may act on others' silence (see ``coordinator.quorum``)."""
        majority = self.reach is None or self.reach.has_majority()
        if not majority and not self._minority_told:
            log.warning(
                "member %d reaches no majority of the %d members: it deposes nobody, moves "
                "nothing and drops no copy of its logs until it does",
                self.manager.member,
                self.members,
            )
        self._minority_told = not majority
        return majority

    @property
    def members(self) -> int:
        return len(self.manager.members)

    async def start(self) -> None:
        if self._prober is not None:
            self._prober.start()
        if self.manager.leader is None:
            await self._leader_duties(dead_since=None)
        elif self.replicates:
            self.follower = PartitionFollower(
                self.manager.channels, self.store, self.addresses, follow=self._follow
            )
            self.follower.start()
            self._spawn(self._watch_leader())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for duty in (self.failover, self.follower, self._prober):
            if duty is not None:
                await duty.stop()

    def _spawn(self, work: Any) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(work))

    async def _leader_duties(self, dead_since: tuple[int, float] | None) -> None:
        manager = self.manager
        await manager.views.start() if dead_since is None else await manager.views.lead()
        if self.after > 0 and self.failover is None:
            self._start_failover(dead_since)
        if self.lead is not None:
            self._spawn(self._keep_lease(self.lead))

    def _start_failover(self, dead_since: tuple[int, float] | None) -> None:
        """Watches the other members (``Failover``). A successor starts it as soon as its
        term is written, with the old leader ``dead_since``: moving the old leader's decision
        log and partitions needs no lease (the records' compare-and-sets and fences make it
        as safe as a follower's failover), so it overlaps the wait for the old lease. A
        member it loses before this member's leader clock exists is forgotten by that clock
        when it is built (``_lost``)."""
        self.failover = Failover(
            self.manager.channels,
            self.store,
            self.addresses,
            self.tls,
            self.after,
            members=self.members,
            lose_member=self._lose,
            follow=self._follow,
            hand_back=self.replicates,  # members only: a restarted one gets its own back
            may_act=self.has_majority,
            silent_to_majority=self.silent_to_majority,
        )
        if dead_since is not None:  # already silent that long: no second wait
            self.failover.silent_since(*dead_since)
        self.failover.start()

    def _lose(self, member: int) -> None:
        """A member's decision log was adopted: the leader clock stops waiting for it (the
        one built after the lease wait, if this member is still waiting)."""
        clock = self.manager.clock
        if isinstance(clock, LeaderClock):
            clock.lose(member)
        else:
            self._lost.add(member)

    async def _follow(self, channel: Any, record: ownership.Ownership) -> None:
        """Points partition ``channel.index`` where ``record`` says: direct calls when a
        hosting of this member serves it now, else the serving member's stream."""
        manager, p = self.manager, channel.index
        local = manager.local
        hosting = local.hostings.get(record.owner) if local is not None else None
        new: LocalLtm | LtmChannel
        if hosting is not None:
            new = LocalLtm(p, hosting, manager._watermarks, record.epoch)
        elif isinstance(channel, LtmChannel):
            await channel.retarget(self.addresses[record.owner], record.owner, record.epoch)
            return
        else:
            new = LtmChannel(
                p,
                self.addresses[record.owner],
                manager._watermarks,
                self.tls,
                owner=record.owner,
                epoch=record.epoch,
            )
            new.silent = manager.ltm_silent
        manager.channels[p] = new
        await channel.close()

    def silent_to_majority(self, member: int) -> bool:
        """Whether most members do not hear ``member`` either (then it may be declared dead
        or deposed; else only a link of this member's is cut)."""
        return self.reach is None or self.reach.silent_to_majority(member)

    # ------------------------------------------------------------------ the leader

    async def _keep_lease(self, lead: Leadership) -> None:
        """Renews the lease from the record; finding another term there, stops the process
        at once (its grants already stopped when the lease ran out)."""
        clock = self.manager.clock
        assert isinstance(clock, LeaderClock) and clock.lease is not None
        reader = ThreadPoolExecutor(1, thread_name_prefix="lease")
        try:
            await self._renew(lead, clock.lease, reader)
        finally:
            reader.shutdown(wait=False)

    async def _renew(self, lead: Leadership, lease: Lease, reader: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = time.monotonic()
            try:
                now = await loop.run_in_executor(reader, leadership.read, self.store)
            except Exception as exc:
                log.warning("reading the leadership record failed: %s", exc)
                now = lead
            else:
                if now != lead:
                    _deposed(now, self.manager.member)
                lease.confirmed(started)
            await asyncio.sleep(leadership.RENEW_EVERY)

    # ------------------------------------------------------------------ a follower

    async def _watch_leader(self) -> None:
        """At the leader's successor: takes the lead once the leader is silent for
        ``after`` seconds."""
        metadata = member_metadata(self.tls)
        silent_since: float | None = None
        watched = -1
        stub: Any = None
        channel: Any = None
        try:
            while True:
                await asyncio.sleep(PROBE_EVERY)
                clock = self.manager.clock
                assert isinstance(clock, FollowerClock)
                leader = clock.leader_member
                if leadership.successor(leader, self.members) != self.manager.member:
                    silent_since = None
                    continue
                if leader != watched:
                    if channel is not None:
                        await channel.close()
                    channel = member_channel(
                        self.manager.members[leader], self.tls, CONTROL_OPTIONS
                    )
                    stub, watched, silent_since = pb_grpc.LtmStub(channel), leader, None
                sent = time.monotonic()
                # a probe of a leader already silent ends when the failover delay does, so
                # the takeover does not wait for the probe's own timeout past it
                timeout = PROBE_TIMEOUT
                if silent_since is not None:
                    timeout = min(timeout, max(MIN_PROBE, silent_since + self.after - sent))
                try:
                    await stub.Status(pb.StatusRequest(), timeout=timeout, metadata=metadata)
                    silent_since = None
                    continue
                except grpc.aio.AioRpcError:
                    now = time.monotonic()
                    # silent since the first probe it left unanswered was sent, not since
                    # that probe timed out (a second of the failover delay, waited twice)
                    silent_since = silent_since or sent
                    if now - silent_since < self.after or not self.silent_to_majority(leader):
                        continue
                try:
                    await self._take_lead(leader, silent_since)
                    return
                except Exception:
                    log.exception("taking the lead from member %d failed", leader)
                    silent_since = None
        finally:
            if channel is not None:
                await channel.close()

    async def _take_lead(self, dead: int, silent_since: float) -> None:
        manager = self.manager
        was = await asyncio.to_thread(leadership.read, self.store)
        if was.member != dead:
            raise leadership.Deposed(f"member {was.member} leads already (term {was.term})")
        lead = await asyncio.to_thread(leadership.take, self.store, manager.member, was)
        log.warning(
            "member %d is silent: member %d takes the lead (term %d)",
            dead,
            manager.member,
            lead.term,
        )
        lease = Lease()
        old = manager.clock
        assert isinstance(old, FollowerClock)
        await old.close()  # what waited for a timestamp fails: its clients try again
        if self.follower is not None:  # this member moves partitions now
            await self.follower.stop()
            self.follower = None
        if self.after > 0 and self.failover is None:
            self._start_failover(dead_since=(dead, silent_since))
        await asyncio.sleep(leadership.LEASE)  # the old leader's lease has run out
        started = time.monotonic()  # this lease starts with a read after the wait
        now = await asyncio.to_thread(leadership.read, self.store)
        if now != lead:  # its follower clock is closed: start again, as a follower
            _deposed(now, manager.member)
        lease.confirmed(started)
        manager.catalog.guard = lambda: leadership.guard(self.store, lead)
        oracle = TimestampOracle(manager.catalog.meta, manager.catalog.set_meta)
        clock = LeaderClock(
            Clock(oracle, self.members, leader=manager.member), manager.in_flight, lease
        )
        clock.succeed(old)
        manager.clock = clock
        manager.views.follow_clock()
        for member in sorted(self._lost):  # its log was adopted during the lease wait
            clock.lose(member)
        self._lost.clear()
        manager.leader, manager.leader_member = None, manager.member
        manager.epoch = manager.catalog.first_epoch()
        self.lead = manager.lead = lead
        await self._leader_duties(dead_since=(dead, silent_since))
        log.warning("member %d leads (term %d)", manager.member, lead.term)


def declared_dead(exc: Exception) -> NoReturn:
    """Another member took this member's decision log over: this process can commit nothing
    any more, so it stops; started again (``aggview start --replicate`` does), it takes its log
    back and serves what the ownership records give it."""
    log.error("this member was declared dead while alive (%s): it stops", exc)
    logging.shutdown()
    os._exit(DECLARED_DEAD_EXIT)


def _deposed(now: Leadership, member: int) -> NoReturn:
    """Another member leads: this process stops at once (started again, it follows)."""
    log.error("member %d took the lead (term %d): member %d stops", now.member, now.term, member)
    logging.shutdown()
    os._exit(DEPOSED_EXIT)
