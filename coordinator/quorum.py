"""Whether this member reaches a majority of the cluster's members.

A member cut off from the others can often still reach the shared store (the embedded store's
file, or an HBase the others cannot reach). Fencing by the store alone would then let it act on
a stale view: declare the healthy members dead, take the lead from a healthy leader, drop the
copy of its log and commit alone. So every such act needs a majority: the member must have
heard, within ``window`` seconds, from enough other members that with itself they are more than
half. A minority deposes nobody, moves nothing and keeps its copy, so it commits nothing that
needs one; a follower that starts (a deposed leader's restart, still cut off) writes no
record before it hears a majority (``majority_heard``). Grants need no such rule: the
store's term and lease fence them (``coordinator.leadership``).

``Reachability`` is the rule, pure; ``Prober`` feeds it from Status calls to every other member.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

import grpc

from aggview.net import CONTROL_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc

PROBE_EVERY = 0.2  # every member's probes: this rule's and the failover's
PROBE_TIMEOUT = 1.0  # a busy member may answer slowly; a dead one refuses at once
WINDOW = 1.0  # an answer older than this no longer counts


class Reachability:
    """Which members answered this one lately (pure: the caller says who answered when)."""

    def __init__(
        self,
        members: int,
        me: int,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.members = members
        self.me = me
        self.window = window
        self._now = clock
        self._heard: dict[int, float] = {}
        self._failed: dict[int, float] = {}  # member -> when its last unanswered probe went
        self._reports: dict[int, frozenset[int]] = {}  # whom each member said it reaches

    def heard(
        self, member: int, at: float | None = None, reaches: Iterable[int] | None = None
    ) -> None:
        """``member`` answered a probe sent at ``at``, saying it reaches ``reaches`` (None:
        it did not say)."""
        at = self._now() if at is None else at
        if at >= self._heard.get(member, 0.0):
            self._heard[member] = at
            if reaches is not None:
                self._reports[member] = frozenset(reaches)

    def failed(self, member: int, at: float | None = None) -> None:
        """A probe sent to ``member`` at ``at`` went unanswered (timed out or refused)."""
        at = self._now() if at is None else at
        self._failed[member] = max(at, self._failed.get(member, 0.0))

    def silent(self, member: int) -> bool:
        """Whether ``member`` fell silent to this one: it answered once, not within the
        window, and a probe sent after its last answer went unanswered. A member never heard
        (still starting) is not silent: calls to it keep their own grace. Streams and calls
        to a silent member fail at once instead of waiting for TCP to give up (seconds more);
        that is safe as any failed call (a coordinator missing a vote decides abort)."""
        heard = self._heard.get(member)
        if heard is None or member == self.me:
            return False
        return self._failed.get(member, 0.0) > heard and heard < self._now() - self.window

    def answered_since(self, member: int, since: float) -> bool:
        """Whether ``member`` answered a probe sent at or after ``since``."""
        return self._heard.get(member, float("-inf")) >= since

    def unanswered_since(self, member: int, since: float) -> bool:
        """Whether a probe sent to ``member`` at or after ``since`` went unanswered."""
        return self._failed.get(member, float("-inf")) >= since

    def majority_since(self, since: float, without: int) -> bool:
        """Whether this member and the members other than ``without`` that answered a probe
        sent at or after ``since`` are a majority: the network around this member was whole
        after ``since``, so what ``without`` leaves unanswered is its own silence, not this
        member's isolation. Two members: always (the store arbitrates, as ``has_majority``)."""
        if self.members <= 2:
            return True
        heard = 1 + sum(
            1
            for m in range(self.members)
            if m not in (self.me, without) and self.answered_since(m, since)
        )
        return 2 * heard > self.members

    def silent_members(self) -> list[int]:
        """The members silent to this one (``silent``), in order."""
        return [m for m in range(self.members) if self.silent(m)]

    def reported(self, member: int) -> frozenset[int]:
        """Whom ``member`` said it hears, in its last answer (empty: it never said)."""
        return self._reports.get(member, frozenset())

    def reachable(self) -> set[int]:
        """Members heard within the window, this one included."""
        since = self._now() - self.window
        return {self.me} | {m for m, at in self._heard.items() if at >= since}

    def silent_to_majority(self, target: int) -> bool:
        """Whether a majority of the members, this one included, does not hear ``target``:
        this one, and each member it hears whose last report leaves ``target`` out (a member
        that never reported counts as not hearing it). One member's silence alone (a link
        cut between two members, the rest of the network whole) moves nothing."""
        if self.members <= 2:
            return True  # see has_majority
        reachable = self.reachable()
        if target in reachable:
            return False
        silent = [m for m in reachable if m == self.me or target not in self.reported(m)]
        return 2 * len(silent) > self.members

    def has_majority(self) -> bool:
        """With two members, half is not a majority and neither could ever act alone: there
        the store's compare-and-sets arbitrate (no copy is lost, but a partition between two
        members can stop one of them needlessly; three members are needed to ride it out)."""
        if self.members <= 2:
            return True
        return 2 * len(self.reachable()) > self.members


async def majority_heard(
    reach: Reachability, told: Callable[[], None] = lambda: None, every: float = 0.05
) -> None:
    """Returns once ``reach`` (fed by a ``Prober``) has a majority; ``told()`` once if the
    first probes' answers did not bring one. A follower starting calls it before it serves
    its partitions or takes its decision log back: both write the records (its copies "out of
    sync", its log's owner), and a member cut off from the others would thereby stop the
    majority from failing them over to their in-sync copies until the cut heals."""
    started = time.monotonic()
    waiting = False
    while not reach.has_majority():
        if not waiting and time.monotonic() - started >= PROBE_TIMEOUT + PROBE_EVERY:
            waiting = True
            told()
        await asyncio.sleep(every)


class Prober:
    """Probes every other member's Status every ``PROBE_EVERY`` seconds, each on a control
    channel and a task of its own (a silent member's timeouts must not delay the others'
    answers past the window), and tells ``reach`` who answered, as of when the probe was sent:
    an answer proves the member was up then."""

    def __init__(self, reach: Reachability, addresses: list[str], tls: TlsDir | None) -> None:
        self.reach = reach
        # told ``member`` once each time it falls silent (``Reachability.silent``)
        self.on_silent: list[Callable[[int], None]] = []
        self._silent: set[int] = set()
        self._metadata = member_metadata(tls)
        self._channels = {
            m: member_channel(a, tls, CONTROL_OPTIONS)
            for m, a in enumerate(addresses)
            if m != reach.me
        }
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        if self._tasks:
            return  # started already (before the member's records: ``majority_heard``)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._probe(m, c)) for m, c in self._channels.items()]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()

    async def _probe(self, member: int, channel: grpc.aio.Channel) -> None:
        stub = pb_grpc.LtmStub(channel)
        while True:
            sent = time.monotonic()
            try:
                reply = await stub.Status(
                    pb.StatusRequest(), timeout=PROBE_TIMEOUT, metadata=self._metadata
                )
            except grpc.aio.AioRpcError:
                self.reach.failed(member, sent)
                if self.reach.silent(member) and member not in self._silent:
                    self._silent.add(member)
                    for told in self.on_silent:
                        told(member)
            else:
                self.reach.heard(member, sent, reply.reaches)
                self._silent.discard(member)
            await asyncio.sleep(max(0.0, PROBE_EVERY - (time.monotonic() - sent)))
