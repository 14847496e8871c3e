"""A member's serve loop: its parts started in order, the gRPC and framed servers, and
the parts stopped in reverse."""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc

from aggview.frames import FramedServer
from aggview.net import (
    GRPC_OPTIONS,
    SERVER_OPTIONS,
    add_health,
    add_reflection,
    run_until_signalled,
)
from aggview.status import add_service
from aggview.wire import client_pb2 as cpb
from aggview.wire import ltm_pb2 as lpb
from coordinator import leader_views, leadership
from coordinator.client_service import AggviewServicer, framed_transactions
from coordinator.clock_service import ClockServicer, FollowerClock
from coordinator.gate import ClientGate
from coordinator.local_ltm import LocalLtm, MemberLtmServicer
from coordinator.ltm_channel import LtmChannel
from coordinator.member_roles import MemberRoles
from coordinator.member_wiring import CoordinatorConfig, build_manager
from coordinator.outcomes import OutcomeServicer
from coordinator.quorum import Prober, Reachability, majority_heard
from coordinator.transactions import TransactionManager
from ltm.server import framed_exchange
from ltm.store import open_store

log = logging.getLogger("coordinator.service")  # the member's log, as before the split


async def read_view(
    manager: TransactionManager, request: lpb.LeaderViewRequest
) -> lpb.LeaderViewReply:
    """At the leader: a cumulus view read a follower forwarded (never forwarded again)."""
    view, conditions, keep, tentative = leader_views.read_of(request)
    rows, ts, tentative = await manager.views.query(
        view, conditions, keep, tentative=tentative, forward=False
    )
    return leader_views.reply(rows, ts, tentative)


async def majority_before_records(
    config: CoordinatorConfig, reach: Reachability, prober: Prober
) -> None:
    """A replicated follower starting waits until it hears a majority before it reads or
    writes its records: serving its partitions rewrites their copies as out of sync, and it
    takes its decision log back. A deposed leader restarts while still cut off; doing that
    then kept the majority from failing its partitions and log over until the cut healed
    (and records read before the wait would be stale after it). The member the record names
    leader does not wait (the followers wait for it to listen), nor one told to take the
    lead."""
    if config.take_lead:
        return
    store = open_store(config.store_url)
    try:
        known = leadership.META_TABLE in await asyncio.to_thread(store.list_tables)
        led_by = (await asyncio.to_thread(leadership.read, store)).member if known else None
    finally:
        store.close()
    if led_by is None or led_by == config.member:
        return  # a new cluster (no records yet), or this member leads
    prober.start()

    def told() -> None:
        log.warning(
            "member %d hears no majority of the %d members (only %s): it waits for one "
            "before it serves its partitions or touches their records",
            config.member,
            len(config.members),
            sorted(reach.reachable()),
        )

    await majority_heard(reach, told)


def member_silent(manager: TransactionManager, member: int) -> None:
    """``member`` fell silent to this member's prober (``coordinator.quorum``): the streams to
    it (its partitions', the clock's if it leads) fail now, as unavailable, rather than when
    TCP gives up seconds later, and calls to it fail at once until it answers again. The
    trace of a cut showed prepares to a cut follower's partition held until its stream's TCP
    timeout (+4.3 s) and a follower's clock stream to a cut leader until +5.3 s."""
    members = len(manager.members) or 1
    for channel in manager.channels:
        if isinstance(channel, LtmChannel) and channel.owner % members == member:
            channel.owner_silent()
    if isinstance(manager.clock, FollowerClock):
        manager.clock.leader_silent(member)


async def serve(config: CoordinatorConfig, ready: asyncio.Event | None = None) -> None:
    """Runs the coordinator until SIGINT/SIGTERM."""
    reach = Reachability(len(config.members), config.member) if config.replicates else None
    prober = Prober(reach, config.members, config.tls) if reach is not None else None
    if reach is not None and prober is not None:
        await majority_before_records(config, reach, prober)
    manager = build_manager(config, reach)
    if prober is not None:
        prober.on_silent.append(functools.partial(member_silent, manager))
    await _start_manager(manager)
    roles = MemberRoles(
        manager,
        config.addresses(manager.partitions),
        failover_after=config.failover_after,
        tls=config.tls,
        replicates=config.replicates,
        lead=manager.lead,
        prober=prober,
    )
    await roles.start()
    gate = ClientGate(
        tokens=config.tokens,
        secret=config.tls.secret if config.tls is not None else None,
        limits=config.limits,
    )
    server, servicer, clock = _grpc_server(config, manager, gate, reach)
    if config.metrics_port is not None:
        port = manager.metrics.serve(config.host, config.metrics_port)
        # before the line the cluster harness waits for (``aggview.processes.Server``)
        print(f"member {config.member} metrics on http://{config.host}:{port}/metrics", flush=True)
    credentials = config.tls.server_credentials(members_only=False) if config.tls else None
    framed = await _framed_server(config, manager, gate, clock) if config.exchanges else None
    await run_until_signalled(
        server, config.host, config.port, f"member {config.member}", ready, credentials=credentials
    )
    if framed is not None:
        await framed.close()
    await roles.stop()
    await servicer.bulk.leases.close()
    await _stop_manager(manager)


async def _start_manager(manager: TransactionManager) -> None:
    """The member's parts, in the order each needs the one before."""
    await manager.local.start()
    if manager.replication is not None:  # before re-delivery: it may adopt a log to deliver
        await manager.replication.start()
    if isinstance(manager.clock, FollowerClock):
        await manager.clock.start()  # its first answer brings the catalog
    await manager.start()
    for channel in manager.channels:  # before anyone else's message: see Participant.observe
        if isinstance(channel, LocalLtm):
            channel.participant.observe(*manager._watermarks())


def _grpc_server(
    config: CoordinatorConfig,
    manager: TransactionManager,
    gate: ClientGate,
    reach: Reachability | None,
) -> tuple[grpc.aio.Server, AggviewServicer, ClockServicer | None]:
    """The member's gRPC server with its services: clients', outcome questions, and with
    other members the partitions' and (where a member may lead) the clock's."""
    server = grpc.aio.server(
        interceptors=[gate],
        options=[  # first: gRPC takes the first of two values of one option
            ("grpc.max_receive_message_length", config.limits.max_request_bytes),
            *GRPC_OPTIONS,
            *SERVER_OPTIONS,
        ],
    )
    servicer = AggviewServicer(manager, config.store_url)
    add_service(server, cpb.DESCRIPTOR.services_by_name["Aggview"], servicer)
    add_service(
        server, lpb.DESCRIPTOR.services_by_name["TransactionOutcome"], OutcomeServicer(manager)
    )
    clock: ClockServicer | None = None
    services = [
        cpb.DESCRIPTOR.services_by_name["Aggview"],
        lpb.DESCRIPTOR.services_by_name["TransactionOutcome"],
    ]
    if config.members:  # other members' streams to our partitions
        add_service(
            server,
            lpb.DESCRIPTOR.services_by_name["Ltm"],
            MemberLtmServicer(manager.local, manager, manager.replication, reach),
        )
        services.append(lpb.DESCRIPTOR.services_by_name["Ltm"])
        if manager.leader is None or config.replicates:  # a follower may take the lead
            clock = ClockServicer(
                lambda: manager.clock,
                functools.partial(read_view, manager),
                manager.views.switch_stream,
            )
            add_service(server, lpb.DESCRIPTOR.services_by_name["Clock"], clock)
            services.append(lpb.DESCRIPTOR.services_by_name["Clock"])
    add_health(server)
    add_reflection(server, [service.full_name for service in services])
    return server, servicer, clock


async def _framed_server(
    config: CoordinatorConfig,
    manager: TransactionManager,
    gate: ClientGate,
    clock: ClockServicer | None,
) -> FramedServer:
    """Other members' streams to our partitions on framed TCP, with the followers' clock
    streams and clients' transactions."""
    streams = {}
    if clock is not None:
        streams["clock"] = lambda hello: clock.framed()
    if manager.transact_addresses:  # see build_manager
        streams["transact"] = functools.partial(framed_transactions, manager, gate)
    welcome = framed_exchange(
        manager.local.participant,
        config.tls.secret if config.tls else None,
        streams,
        client_streams=frozenset({"transact"}),
    )
    return await FramedServer(welcome, config.tls.frames_server_ssl if config.tls else None).start(
        config.host, config.exchange_port
    )


async def _stop_manager(manager: TransactionManager) -> None:
    for channel in manager.channels:
        log.info(
            "LTM %d: %d decisions in %d calls",
            channel.index,
            channel.decisions.items,
            channel.decisions.calls,
        )
    await manager.views.stop()
    await manager.close()
    if isinstance(manager.clock, FollowerClock):
        await manager.clock.close()
    if manager.replication is not None:
        await manager.replication.stop()
    await manager.local.stop()
    await manager.decisions.close()
    manager.catalog.store.close()
    manager.metrics.close()
