"""The ``aggview`` commands that run servers: a member (``ltm``), a local cluster (``start``), a
Cumulus DW node, and a development HBase.
"""

from __future__ import annotations

import argparse
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aggcli.options import (
    check_metrics_options,
    refuse_taken_port,
    say,
    server_tls_dir,
    tokens_path,
)
from aggview import errors, loops


def _register_view_hosts() -> None:
    """Cumulus views may run their DW nodes on Spark (``host = 'spark'``): the Spark layer is
    imported only when one does."""
    from coordinator import cumulus_hosts

    def spark(*args: Any) -> Any:
        from aggspark.view_host import SparkStageNodes

        return SparkStageNodes(*args)

    cumulus_hosts.EXTRA_HOSTS["spark"] = spark


def run_ltm(args: argparse.Namespace) -> None:
    """A coordinating LTM: hosts its share of the partitions (all of them alone) and
    coordinates the transactions sent to it."""
    from aggview.security import TlsDir, load_tokens
    from coordinator.convert import Limits
    from coordinator.member_wiring import CoordinatorConfig
    from coordinator.service import serve

    _register_view_hosts()
    if args.member_exchange and len(args.member_exchange) != len(args.member_address):
        raise errors.InvalidArgument(
            f"{len(args.member_exchange)} --member-exchange for "
            f"{len(args.member_address)} --member-address: give one per member, or none"
        )
    if len(args.member_address) == 1:  # one member: the whole cluster in this process
        # (its --member-exchange, if any, stays: clients' transactions come there)
        args.member_address = []
    if args.member_address and not 0 <= args.member < len(args.member_address):
        raise errors.InvalidArgument(
            f"--member {args.member} is not one of the {len(args.member_address)} members"
        )
    if args.partitions < 1:
        raise errors.InvalidArgument("--partitions must be at least 1")
    exchange_port = args.exchange_port
    if exchange_port is None and args.member_exchange:
        from aggview.frames import host_port

        own = args.member_exchange[args.member]
        try:
            _, exchange_port = host_port(own)
        except ValueError:
            raise errors.InvalidArgument(f"--member-exchange {own!r} is not host:port") from None
    tls_dir = server_tls_dir(args)
    tokens = tokens_path(args, tls_dir)
    check_metrics_options(args)
    refuse_taken_port(args.host, args.port)
    if args.metrics_port is not None:
        refuse_taken_port(args.host, args.metrics_port)
    config = CoordinatorConfig(
        store_url=args.store,
        log_dir=Path(args.log_dir),
        partitions=args.partitions,
        host=args.host,
        port=args.port,
        fsync=not args.no_fsync,
        limits=Limits.parse(args.limit),
        tls=TlsDir.load(tls_dir) if tls_dir is not None else None,
        tokens=load_tokens(tokens) if tokens is not None else None,
        failover_after=args.failover_after,
        checkpoint_interval=args.checkpoint_interval,
        cache_rows=args.cache_rows,
        members=args.member_address,
        member=args.member,
        exchanges=args.member_exchange,
        exchange_port=exchange_port or 0,
        take_lead=args.take_lead,
        metrics_port=args.metrics_port,
        metrics=not args.no_metrics,
    )
    loops.run(serve(config))


def run_start(args: argparse.Namespace) -> None:
    from agglauncher.cluster import LocalCluster, Restarts, checked_processes

    if args.ltms < 1:
        raise errors.InvalidArgument("--ltms must be at least 1")
    args.processes = checked_processes(args.ltms, args.processes, args.replicate)
    check_metrics_options(args)
    from aggview.security import TlsDir, load_tokens
    from coordinator.convert import Limits

    tls_dir = server_tls_dir(args)
    tokens = tokens_path(args, tls_dir)
    limits = Limits.parse(args.limit)  # checked here: a bad flag fails before anything starts
    refuse_taken_port("127.0.0.1", args.port)
    if args.metrics_port:  # member m serves on metrics_port + m
        for m in range(min(args.processes, args.ltms)):
            refuse_taken_port("127.0.0.1", args.metrics_port + m)
    if tls_dir is not None:
        TlsDir.load(tls_dir)
        load_tokens(tokens or tls_dir / "tokens")
    # Plain lists, not a threading.Event: a handler runs between two bytecodes of the main
    # thread, and Event.set() there deadlocks when the main thread is inside Event.wait()
    # holding the Event's lock (it hung `aggview start` once in a few hundred stops).
    signalled: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: signalled.append(signum))
    # USR1's default action ends a process, and the members (which die with it) went too
    dumps: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, _: dumps.append(signum))
    cluster = LocalCluster(
        Path(args.data),
        store=args.store,
        ltms=args.ltms,
        port=args.port,
        fsync=not args.no_fsync,
        tls_dir=tls_dir,
        tokens=tokens,
        limits={k: v for k, v in asdict(limits).items() if v != asdict(Limits())[k]},
        replicate=args.replicate,
        processes=args.processes,
        metrics_port=args.metrics_port,
        metrics=not args.no_metrics,
        verbose=args.verbose,
        log_format=args.log_format,
    )
    try:
        cluster.start()
    except RuntimeError as exc:  # a server that did not start: its log's tail says why
        raise errors.Unavailable(str(exc)) from None
    try:
        print(f"aggview listening on {cluster.address}", flush=True)
        for m, url in enumerate(cluster.metrics_urls):
            if url:
                print(f"member {m} metrics on {url}", flush=True)
        restarts = Restarts(cluster.servers, say=say)
        while not signalled:
            time.sleep(0.2)
            if dumps:
                del dumps[:]
                logs = ", ".join(str(log) for log in cluster.dump_stacks())
                say(f"SIGUSR1 passed on: each server writes where its tasks wait to {logs}")
            if not signalled:
                restarts.tend()  # a dead member comes back on its data (with --replicate too)
    finally:
        cluster.stop()
    print("aggview stopped", flush=True)


def run_hbase_start(args: argparse.Namespace) -> None:
    from ltm.store.hbase_server import HBASE_VERSION, StandaloneHBase, cache_directory

    print(f"HBase {HBASE_VERSION}: jars in {cache_directory()} (resolved by Maven the first time)")
    running = StandaloneHBase(Path(args.dir), port=args.port).start()
    print(f"HBase running from {args.dir}: {running.url}")


def run_hbase_stop(args: argparse.Namespace) -> None:
    from ltm.store.hbase_server import StandaloneHBase

    if not StandaloneHBase(Path(args.dir)).stop():
        raise errors.FailedPrecondition(f"no HBase runs from {args.dir}")
    print(f"HBase from {args.dir} stopped")


def run_cumulus_node(args: argparse.Namespace) -> None:
    from aggview.security import TlsDir
    from cumulus.runtime.dw_server import NodeConfig, NodePool, serve, serve_pool

    tls_dir = server_tls_dir(args)
    tls = TlsDir.load(tls_dir) if tls_dir is not None else None
    if args.program is None:
        given = [f"--{k}" for k in ("number", "nodes") if getattr(args, k) is not None]
        if given:
            raise errors.InvalidArgument(f"{' and '.join(given)} need --program")
        refuse_taken_port(args.host, args.port)
        loops.run(serve_pool(NodePool(args.host, args.port, tls)))
        return
    if args.number is None or args.nodes is None:
        raise errors.InvalidArgument("--program needs --number and --nodes")
    try:
        program_text = Path(args.program).read_text()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read --program {args.program}: {exc}") from None
    config = NodeConfig(
        program_text,
        number=args.number,
        nodes=args.nodes,
        switches=args.switches,
        mode=args.mode,
        log_limit=args.log_limit,
        per_switch=args.per_switch,
        host=args.host,
        port=args.port,
        tls=tls,
    )
    loops.run(serve(config))
