"""A member's wiring: its configuration and ``build_manager``, which makes the transaction
manager with its clock, hosted partitions, decision log copies and partition channels."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.member_log import DECISIONS, SharedLog, partition_tag, split
from aggview.metrics import MemberState, Metrics, NoMetrics, ViewState
from aggview.security import TlsDir, Token
from coordinator import leadership
from coordinator.catalog import Catalog
from coordinator.clock import Clock
from coordinator.clock_service import FollowerClock
from coordinator.convert import Limits
from coordinator.decision_log import DecisionLog
from coordinator.leadership import Leadership, Lease
from coordinator.local_ltm import LocalLtm, LocalPartitions
from coordinator.ltm_channel import LtmChannel
from coordinator.member_clock import InFlight, LeaderClock, MemberClock
from coordinator.member_decisions import MemberDecisions
from coordinator.member_roles import declared_dead
from coordinator.outcomes import ask_outcomes, outcome_stub
from coordinator.quorum import Reachability
from coordinator.timestamp_oracle import TimestampOracle
from coordinator.transactions import Membership, TransactionManager
from coordinator.views import ViewManager
from ltm.store import open_store, ownership
from ltm.store.base import Store


@dataclass
class CoordinatorConfig:
    store_url: str
    log_dir: Path
    partitions: int  # how many the cluster has; this process hosts its share of them
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True
    limits: Limits = Limits()
    tls: TlsDir | None = None  # None: plaintext (``--insecure``)
    tokens: dict[str, Token] | None = None  # None: no authentication (``--insecure``)
    failover_after: float = 0.0  # seconds an LTM may stay silent before failover; 0: never
    checkpoint_interval: float = 2.0  # of the local partitions
    cache_rows: int = 1_000_000
    # Several coordinating members (``--processes P``): every member's address, in order;
    # member 0 keeps the clock and the catalog. Partition p is hosted by member p % P.
    members: list[str] = field(default_factory=list)
    member: int = 0
    take_lead: bool = False  # replicated: this member leads (every member is starting)
    # Where each member serves the members' streams on framed TCP (``aggview.frames``), in
    # member order, and the port this one listens on; none: the streams go over gRPC.
    exchanges: list[str] = field(default_factory=list)
    exchange_port: int = 0
    # Where /metrics is served (``--metrics-port``; 0: a free port); None: not served. The
    # series are kept either way (a counter's increment costs next to nothing).
    metrics_port: int | None = None
    metrics: bool = True  # False (``--no-metrics``): no series kept (``NoMetrics``)

    @property
    def replicates(self) -> bool:
        """Members copy their logs to one another when they fail over (``--replicate``)."""
        return len(self.members) >= 2 and self.failover_after > 0

    def addresses(self, partitions: int) -> list[str]:
        """Where each partition is hosted (none in one process: every one is here)."""
        return _per_partition(self.members, partitions)

    def exchange_addresses(self, partitions: int) -> list[str]:
        """Where each partition's member serves framed TCP (none: gRPC carries the streams)."""
        return _per_partition(self.exchanges, partitions)

    def hosted(self, partitions: int) -> list[int] | None:
        """The partitions this process hosts (None: every one)."""
        if not self.members:
            return None
        return [p for p in range(partitions) if p % len(self.members) == self.member]


def _per_partition(by_member: list[str], partitions: int) -> list[str]:
    """Partition p's entry of a per-member list: member p % members hosts it."""
    return [by_member[p % len(by_member)] for p in range(partitions)] if by_member else []


def build_manager(
    config: CoordinatorConfig, reach: Reachability | None = None
) -> TransactionManager:
    """``reach``: whether this member reaches a majority (replicated clusters), which it
    needs to drop an unreachable copy of its logs."""
    store = open_store(config.store_url)
    catalog = Catalog(store)
    count = config.partitions
    _check_partitions(catalog, count)
    metrics = Metrics() if config.metrics else NoMetrics()
    shared = _shared_log(config, count, metrics)
    decisions = DecisionLog(
        config.log_dir,
        fsync=config.fsync,
        observe=metrics.wal_observer("decisions"),
        log=shared.writer(DECISIONS) if shared else None,
    )
    may_drop = reach.has_majority if reach is not None else lambda: True
    in_flight = InFlight()
    if shared is not None and len(config.members) <= 1:
        # Every partition is here, so this member's transactions are all its log serves: a
        # flush they all wait for (or a lone one's) runs on the loop's thread, which has
        # nothing else to do meanwhile.
        shared.wal.flush_here = in_flight.alone
    read_at = time.monotonic()  # a lease runs from the start of the read that gave it
    leader, lead = _leadership(config, store)
    if lead is not None:  # this member leads a replicated cluster: guarded, with a lease
        catalog.guard = lambda: leadership.guard(store, lead)
    # the follower clock calls back into the manager, made below with the clock
    clock = _member_clock(
        config, store, catalog, in_flight, reach, leader, lead, read_at, lambda: manager
    )
    membership = Membership(list(config.members), config.member, list(config.exchanges))
    leads = leader == config.member
    ltm_silent = _ltm_silent(config, reach)
    # made before the manager, which takes them; what they call on it is looked up when called
    local = _local_partitions(
        config, store, lambda: manager, metrics, ltm_silent, may_drop, reach, shared
    )
    replication = None
    if config.replicates:
        replication = MemberDecisions(
            store,
            decisions,
            config.member,
            config.members,
            count,
            config.log_dir / "decision-copies",
            lambda adopted: manager.adopt(adopted),
            tls=config.tls,
            fsync=config.fsync,
            on_superseded=declared_dead,
            may_drop=may_drop,
            silent=ltm_silent,
            hearing=reach,
        )
    channels = _partition_channels(config, store, local, lambda: manager._watermarks(), ltm_silent)
    manager = TransactionManager(
        catalog,
        clock,
        decisions,
        limits=config.limits,
        metrics=metrics,
        membership=membership,
        leader_member=leader,
        leader=None if leads else config.members[leader],
        lead=lead,
        epoch=catalog.first_epoch() if leads else 0,
        ltm_silent=ltm_silent,
        silent_members=None if reach is None else reach.silent_members,
        local=local,
        replication=replication,
        channels=channels,
    )
    metrics.watch(functools.partial(member_state, manager))
    views = ViewManager(manager, runtime_dir=config.log_dir / "cumulus", tls=config.tls)
    manager.views = manager.view_hooks = views  # the service's; and every transaction's hooks
    return manager


def _shared_log(config: CoordinatorConfig, count: int, metrics: Metrics) -> SharedLog | None:
    """The member's one log for its partitions and decisions (``aggview.member_log``), with
    the records of their own logs copied in; None for a member that copies its logs to
    others (each partition's log moves on its own), whose shared log is split back."""
    directory = config.log_dir / "member"
    hosted = config.hosted(count)
    own = {DECISIONS: config.log_dir} | {
        partition_tag(p): config.log_dir / "partitions" / partition_tag(p)
        for p in (range(count) if hosted is None else hosted)
    }
    if config.replicates:
        split(directory, own, fsync=config.fsync)
        return None
    return SharedLog(directory, fsync=config.fsync, observe=metrics.wal_observer("member"), own=own)


def _ltm_silent(config: CoordinatorConfig, reach: Reachability | None) -> Callable[[int], bool]:
    """Whether the member serving LTM ``ltm`` fell silent to this one's prober (with no
    prober, unreplicated: never), so that calls to it fail at once."""
    if reach is None:
        return lambda ltm: False
    return lambda ltm: reach.silent(ltm % len(config.members))


def _check_partitions(catalog: Catalog, count: int) -> None:
    """The data's number of partitions is fixed when it is first written."""
    partitions = catalog.meta("partitions")
    if partitions is None:
        catalog.set_meta("partitions", str(count))
    elif int(partitions) != count:
        raise errors.FailedPrecondition(
            f"this data was written by {partitions} LTMs; start with {partitions} "
            f"(got {count}): repartitioning is not supported"
        )


def _member_clock(
    config: CoordinatorConfig,
    store: Store,
    catalog: Catalog,
    in_flight: InFlight,
    reach: Reachability | None,
    leader: int,
    lead: Leadership | None,
    read_at: float,
    manager_of: Callable[[], TransactionManager],
) -> MemberClock:
    """The leader's clock here, or a follower's stream to it. ``manager_of()``: the manager,
    once it exists (the follower clock calls back into it)."""
    if leader == config.member:
        oracle = TimestampOracle(catalog.meta, catalog.set_meta)
        lease = None
        if lead is not None:
            lease = Lease()
            lease.confirmed(read_at)  # renewed from the record once serving
        return LeaderClock(
            Clock(oracle, max(1, len(config.members)), leader=leader), in_flight, lease
        )

    async def locate() -> tuple[int, str] | None:
        """Where the clock is now (after the leader's stream failed)."""
        record = await asyncio.to_thread(leadership.read, store)
        if record.member == config.member:
            return None  # this member is taking the lead
        manager = manager_of()
        manager.leader = config.members[record.member]
        manager.leader_member = record.member
        return record.member, config.members[record.member]

    clock = FollowerClock(
        config.member,
        in_flight,
        config.members[leader],
        config.tls,
        lambda epoch, configuration: manager_of().views.install(epoch, configuration),
        locate if config.replicates else None,
        leader_member=leader,
        exchanges=config.exchanges,
    )
    if reach is not None:
        clock.silent = reach.silent
    return clock


def _local_partitions(
    config: CoordinatorConfig,
    store: Store,
    manager_of: Callable[[], TransactionManager],
    metrics: Metrics,
    ltm_silent: Callable[[int], bool],
    may_drop: Callable[[], bool],
    reach: Reachability | None = None,
    shared: SharedLog | None = None,
) -> LocalPartitions:
    """The partitions this member hosts, in process; they ask the other members about the
    transactions they coordinated (``manager_of()``: the manager, once it exists) and write
    to the member's ``shared`` log, if it has one."""
    others = [
        (m, outcome_stub(address, config.tls))
        for m, address in enumerate(config.members)
        if m != config.member
    ]
    count = config.partitions
    return LocalPartitions(
        store,
        config.log_dir / "partitions",
        count,
        lambda timestamps: ask_outcomes(manager_of(), others, timestamps),
        fsync=config.fsync,
        cache_rows=config.cache_rows,
        checkpoint_interval=config.checkpoint_interval,
        hosted=config.hosted(count),
        members=config.members if config.replicates else None,
        tls=config.tls,
        may_drop=may_drop,
        silent=ltm_silent,
        wal_observe=metrics.wal_observer("partition"),
        hearing=reach,
        shared_log=shared,
    )


def _partition_channels(
    config: CoordinatorConfig,
    store: Store,
    local: LocalPartitions,
    watermarks: Callable[[], tuple[int, int]],
    ltm_silent: Callable[[int], bool],
) -> list[Any]:
    """Each partition's channel: in process if this member serves it, else to the member the
    ownership record names (after a failover, a partition lives elsewhere)."""
    count = config.partitions
    addresses = config.addresses(count)
    channels: list[Any] = []
    for p in range(count):
        record = ownership.read(store, p)
        if record.owner in local.hostings:
            channels.append(LocalLtm(p, local.hostings[record.owner], watermarks, record.epoch))
            continue
        channel = LtmChannel(
            p,
            addresses[record.owner],
            watermarks,
            config.tls,
            owner=record.owner,
            epoch=record.epoch,
            exchanges=config.exchange_addresses(count),
        )
        channel.silent = ltm_silent
        channels.append(channel)
    return channels


def member_state(manager: TransactionManager) -> MemberState:
    """What the member is now, for a scrape of its metrics (on the HTTP server's thread: the
    containers are copied before they are walked, and a walk that met a change is redone)."""
    for _ in range(10):
        try:
            return _member_state(manager)
        except RuntimeError:  # changed size during iteration: the loop moved on meanwhile
            continue
    return _member_state(manager)


def _member_state(manager: TransactionManager) -> MemberState:
    hostings = list(manager.local.hostings.values()) if manager.local is not None else []
    views = list(manager.views.views.values()) if manager.views is not None else []
    clock = getattr(manager.clock, "clock", None)  # a leader's pure clock
    copies: dict[int, bool] = {}
    for hosting in hostings:
        for partition, shipper in list(hosting.shippers.items()):
            copies[partition] = bool(shipper.in_sync)
    return MemberState(
        member=manager.member,
        leader=manager.leader is None,
        term=manager.lead.term if manager.lead is not None else 0,
        partitions=sum(len(hosting.served()) for hosting in hostings),
        lookup_hits=manager.lookups.hits,
        lookup_misses=manager.lookups.misses,
        clock_grants=clock.grants if isinstance(clock, Clock) else 0,
        views=[ViewState(v.name, v.plan.mode, v.state, _runtime_counts(manager, v)) for v in views],
        copies_in_sync=copies,
    )


def _runtime_counts(manager: TransactionManager, view: Any) -> dict[str, Any] | None:
    """A cumulus view's runtime counts where its runtime runs (None elsewhere)."""
    runtime = manager.views.runtimes.get(view.name) if manager.views is not None else None
    return dict(runtime.counts()) if runtime is not None else None


def _leadership(config: CoordinatorConfig, store: Store) -> tuple[int, Leadership | None]:
    """Which member leads, and the record this one leads under when it is that member of a
    replicated cluster. Unreplicated, member 0 always leads; replicated, the store's record
    says (``--take-lead``: this member takes it, every member is starting)."""
    if not config.replicates:
        return 0, None
    if config.take_lead:
        return config.member, leadership.take(store, config.member, None)
    record = leadership.read(store)
    if record.member != config.member:
        return record.member, None
    return config.member, leadership.take(store, config.member, record)  # back: a new term
