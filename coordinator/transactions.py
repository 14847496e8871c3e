"""The two-phase-commit driver and snapshot reads.

A one-shot transaction gets a timestamp, is split by partition into sub-transactions, and is
prepared at every participant; the votes carry row images. Between the votes and the decision
the transaction may grow (``ViewHooks.maintain``: view maintenance adds sub-transactions there).
A commit decision is durable in the decision log before anyone hears of it; phase two is then
delivered in the background until every participant has acknowledged it.

Reads never abort writers: a read takes the youngest issued timestamp t, waits until every
transaction at or below t is decided, and reads at t. So it sees exactly the transactions
committed before it started (strict serializability for reads too).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aggview import errors
from aggview.metrics import Metrics
from coordinator.catalog import Catalog
from coordinator.commits import Transaction
from coordinator.convert import Limits
from coordinator.decision_log import DecisionLog
from coordinator.leadership import Leadership
from coordinator.lookup_cache import LookupCache
from coordinator.member_clock import MemberClock
from coordinator.snapshot_reads import SnapshotReads
from coordinator.system_transactions import SystemTransactions
from coordinator.view_hooks import NO_VIEWS, ViewHooks

log = logging.getLogger(__name__)

__all__ = ["Membership", "Transaction", "TransactionManager"]


@dataclass(frozen=True)
class Membership:
    """What a member knows of the cluster's members from its start on (none: just this one)."""

    members: list[str] = field(default_factory=list)  # every coordinating member's address
    member: int = 0  # this one's index among them
    transact_addresses: list[str] = field(default_factory=list)  # their framed ports for clients


class TransactionManager(SystemTransactions, SnapshotReads):
    """Two-phase commit and snapshot reads for the transactions sent to this member: its state
    and life; the commit path, phase two, the retried transactions and the reads are base
    classes in modules of their own."""

    def __init__(
        self,
        catalog: Catalog,
        clock: MemberClock,
        decisions: DecisionLog,
        limits: Limits | None = None,
        metrics: Metrics | None = None,
        membership: Membership | None = None,
        *,
        leader_member: int = 0,
        leader: str | None = None,
        lead: Leadership | None = None,
        epoch: int = 0,
        ltm_silent: Callable[[int], bool] | None = None,
        silent_members: Callable[[], list[int]] | None = None,
        local: Any = None,
        replication: Any = None,
        channels: list[Any] | None = None,
    ) -> None:
        """``leader_member``, ``leader``, ``lead`` and ``epoch`` as this member starts (a
        takeover changes them later); ``ltm_silent`` and ``silent_members`` from the prober
        (``coordinator.quorum``; replicated clusters), None: nobody is silent. ``local``,
        ``replication`` and ``channels``: see below (``member_wiring.build_manager`` makes
        them; a unit test may go without)."""
        self.catalog = catalog
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.in_flight = clock.in_flight
        self.decisions = decisions
        self.limits = limits or Limits()
        # Each partition's participant: hosted here (``LocalLtm``) or at another member
        # (``LtmChannel``).
        self.channels: list[Any] = channels if channels is not None else []
        self.local: Any = local  # the partitions hosted in this process
        self.replication: Any = replication  # members' decision logs copied (``--replicate``)
        # What the transaction path calls on views: change capture before the first prepare,
        # maintenance after every round of yes votes, which tables need row images, which are
        # looked up by key (cached here): the view manager once one is attached, else nothing.
        self.view_hooks: ViewHooks = NO_VIEWS
        self.epoch = epoch  # bumped when views change; maintenance refuses an older transaction
        # the view manager, once one is attached (``member_wiring.build_manager``): for the
        # service's DDL, reads and refreshes; the transaction path calls ``view_hooks``
        self.views: Any = None
        self.lookups = LookupCache(
            lambda: self.view_hooks.lookup_tables(),
            lambda: self.epoch,
            lambda: self.clock.issued(),  # the clock object changes on a takeover
            warm=self._warm,
        )
        clock.cache = self.lookups  # it hears what each timestamp writes as it is granted
        self._warming: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._committing: set[asyncio.Task[None]] = set()  # decided, not yet durable
        # Commits whose decision record failed to be logged (its log taken over, a disk
        # error): undecided until a restart replays the log, or the log's adopter answers.
        self.unlogged: set[int] = set()
        self.committed = 0
        self.aborted = 0
        self.leader = leader  # the leader's address, when this member is not it
        self.leader_member = leader_member  # which member leads (keeps the clock and the catalog)
        self.lead = lead  # the leadership record this member leads under (replicated)
        self.membership = membership or Membership()  # fixed at start: passed in, not set
        # whether the member serving LTM ``ltm`` fell silent to this one's prober
        # (``coordinator.quorum``; replicated clusters): calls to it then fail at once
        self.ltm_silent: Callable[[int], bool] = ltm_silent or (lambda ltm: False)
        # the members silent to this one's prober, told to clients with their answers
        self.silent_members: Callable[[], list[int]] = silent_members or (lambda: [])
        self.refreshes = 0  # async-view refreshes committed here

    def at_leader(self, what: str) -> None:
        """Refuses, at a follower member, what only the leader runs (it keeps the catalog)."""
        if self.leader is not None:
            raise errors.FailedPrecondition(
                f"{what} runs at the cluster's leader, member {self.leader_member} "
                f"({self.leader}); send it there (the Python client does)"
            )

    def bump_epoch(self, configuration: dict[str, Any]) -> None:
        """Views, indexes or tables changed: a new epoch for what is timestamped from now."""
        self.epoch += 1
        self.clock.publish(self.epoch, configuration)

    @property
    def members(self) -> list[str]:
        return self.membership.members

    @property
    def member(self) -> int:
        return self.membership.member

    @property
    def transact_addresses(self) -> list[str]:
        return self.membership.transact_addresses

    @property
    def partitions(self) -> int:
        return len(self.channels)

    def _watermarks(self) -> tuple[int, int]:
        return self.clock.marks.low, self.clock.issued()

    async def start(self) -> None:
        """Re-delivers commit decisions that participants had not acknowledged before a restart."""
        for ts, participants in list(self.decisions.committed.items()):
            self._deliver_later(ts, participants)

    async def close(self) -> None:
        if self.lookups.hits or self.lookups.misses:
            log.info("lookup cache: %d hits, %d misses", self.lookups.hits, self.lookups.misses)
        if self._warming is not None:
            self._warming.cancel()
        if self._deliveries:
            await asyncio.wait(self._deliveries, timeout=5)
        for channel in self.channels:
            await channel.close()

    async def drop_table(self, table_id: str) -> None:
        await asyncio.gather(*(ch.drop_table(table_id) for ch in self.channels))
