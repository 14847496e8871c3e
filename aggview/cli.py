"""The ``aggview`` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tempfile
import threading
from pathlib import Path

from aggview import errors


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--no-fsync", action="store_true", help="skip fsync of logs (tests and demos only)"
    )


def _run_ltm(args: argparse.Namespace) -> None:
    from ltm.server import LtmConfig, serve

    config = LtmConfig(
        store_url=args.store,
        log_dir=Path(args.log_dir),
        partition=args.partition,
        partitions=args.partitions,
        coordinator=args.coordinator,
        host=args.host,
        port=args.port,
        fsync=not args.no_fsync,
        cache_rows=args.cache_rows,
        checkpoint_interval=args.checkpoint_interval,
    )
    asyncio.run(serve(config))


def _run_coordinator(args: argparse.Namespace) -> None:
    from coordinator.service import CoordinatorConfig, serve

    config = CoordinatorConfig(
        store_url=args.store,
        log_dir=Path(args.log_dir),
        ltms=args.ltm,
        host=args.host,
        port=args.port,
        fsync=not args.no_fsync,
    )
    asyncio.run(serve(config))


def _run_start(args: argparse.Namespace) -> None:
    from aggview.cluster import LocalCluster

    if args.ltms < 1:
        raise errors.InvalidArgument("--ltms must be at least 1")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = LocalCluster(Path(args.data), ltms=args.ltms, port=args.port, fsync=not args.no_fsync)
    with cluster:
        print(f"aggview listening on {cluster.address}", flush=True)
        while not stop.wait(0.5):
            dead = [s.role for s in cluster.servers if not s.running()]
            if dead:
                print(f"aggview: {', '.join(dead)} exited; stopping", file=sys.stderr)
                break
    print("aggview stopped", flush=True)


def _run_sql(args: argparse.Namespace) -> None:
    from coordinator.client import Client

    with Client(args.address) as client:
        for statement in args.statements:
            rows = client.sql(statement)
            if rows.columns:
                print("\t".join(rows.columns))
                for row in rows:
                    print(
                        "\t".join("NULL" if row[c] is None else str(row[c]) for c in rows.columns)
                    )
            print(rows.message)


def _run_demo(args: argparse.Namespace) -> None:
    from aggview.demo import run_demo

    if args.data:
        run_demo(Path(args.data), ltms=args.ltms)
    else:
        with tempfile.TemporaryDirectory(prefix="aggview-demo-") as data:
            run_demo(Path(data), ltms=args.ltms)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aggview", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start", help="run a coordinator and N LTMs on the embedded store")
    start.add_argument("--data", required=True, help="data directory (created if missing)")
    start.add_argument("--ltms", type=int, default=3)
    start.add_argument("--port", type=int, default=0, help="the coordinator's port")
    start.add_argument("--no-fsync", action="store_true")
    start.set_defaults(run=_run_start)

    ltm = sub.add_parser("ltm", help="run one local transaction manager")
    ltm.add_argument("--store", required=True, help="sqlite:///path or hbase://host:port")
    ltm.add_argument("--log-dir", required=True)
    ltm.add_argument("--partition", type=int, required=True)
    ltm.add_argument("--partitions", type=int, required=True)
    ltm.add_argument("--coordinator", help="address asked about undecided transactions")
    ltm.add_argument("--cache-rows", type=int, default=1_000_000)
    ltm.add_argument("--checkpoint-interval", type=float, default=2.0)
    _add_common(ltm)
    ltm.set_defaults(run=_run_ltm)

    coordinator = sub.add_parser("coordinator", help="run the coordinator")
    coordinator.add_argument("--store", required=True)
    coordinator.add_argument("--log-dir", required=True)
    coordinator.add_argument("--ltm", action="append", required=True, help="LTM address, in order")
    _add_common(coordinator)
    coordinator.set_defaults(run=_run_coordinator)

    sql = sub.add_parser("sql", help="run SQL statements against a cluster")
    sql.add_argument("address")
    sql.add_argument("statements", nargs="+")
    sql.set_defaults(run=_run_sql)

    demo = sub.add_parser("demo", help="the main job: a local cluster, a workload, a report")
    demo.add_argument("--data", help="keep the cluster's data here (default: a temp dir)")
    demo.add_argument("--ltms", type=int, default=3)
    demo.set_defaults(run=_run_demo)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        args.run(args)
    except errors.AggviewError as exc:
        print(f"aggview: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
