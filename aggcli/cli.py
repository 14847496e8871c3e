"""The ``aggview`` command line."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from aggcli.client_commands import equality, run_sql, run_status, run_watch
from aggcli.options import (
    METRICS_HELP,
    NO_METRICS_HELP,
    Parser,
    add_client_security,
    add_common,
    add_member_options,
    add_server_security,
    address_type,
    client_options,
)
from aggcli.server_commands import (
    run_cumulus_node,
    run_hbase_start,
    run_hbase_stop,
    run_ltm,
    run_start,
)
from aggview import errors, logformat, loops
from aggview.processes import die_with_parent

DESCRIPTION = (
    "aggview: transactional aggregate views over key-value stores. Start a cluster (start, "
    "ltm), talk to it (sql, watch, load, views, verify), measure it (bench, demo). "
    "aggview COMMAND --help lists a command's options."
)


def _run_certs(args: argparse.Namespace) -> None:
    from aggview.certs import make_certs

    written = make_certs(Path(args.dir), hosts=args.host, days=args.days, force=args.force)
    for path in written:
        print(path)
    print(
        f"start servers with --tls-dir {args.dir}; clients need {Path(args.dir) / 'ca.pem'} and "
        f"a token from {Path(args.dir) / 'tokens'}"
    )


def _run_docker_build(args: argparse.Namespace) -> None:
    from aggcli import docker_images

    source = Path(args.source) if args.source else docker_images.default_source()
    if args.start_engine:
        engine = docker_images.ensure_engine(log=docker_images.DOCKERD_LOG, install=True)
        if engine.started is not None:
            print(
                f"started dockerd (pid {engine.started.pid}, log {docker_images.DOCKERD_LOG}); "
                "it runs on after this command"
            )
        print(f"compose: {' '.join(docker_images.ensure_compose(install=True))}")
    built = docker_images.build_images(
        source, base=args.base, mirror=args.mirror, install=args.start_engine, output=sys.stdout
    )
    print(
        f"built {docker_images.AGGVIEW_IMAGE} ({built.aggview:.0f} s) and "
        f"{docker_images.HBASE_IMAGE} ({built.hbase:.0f} s) "
        f"FROM {args.base or docker_images.BASE_IMAGE} ({built.base:.0f} s)"
    )


def _run_demo(args: argparse.Namespace) -> None:
    from loadgen.demo import quick_size, run_demo

    size = quick_size() if args.quick else None
    if args.data:
        run_demo(Path(args.data), ltms=args.ltms, out=Path(args.out), size=size)
    else:
        with tempfile.TemporaryDirectory(prefix="aggview-demo-") as data:
            run_demo(Path(data), ltms=args.ltms, out=Path(args.out), size=size)


def _run_m3(args: argparse.Namespace) -> None:
    from coordinator.catalog import table_from_create
    from cumulus.m3.command import run_m3

    run_m3(args, table_from_create)


def _run_cumulus_replay(args: argparse.Namespace) -> None:
    from coordinator.catalog import table_from_create
    from cumulus.runtime.replay import run_replay

    def spark_nodes(program_text: str, nodes: int, switches: int, mode: str) -> Any:
        from aggspark.dw_stage import spark_nodes
        from aggspark.session import spark_session

        return spark_nodes(spark_session(), program_text, nodes, switches=switches, mode=mode)

    loops.collect_less()  # the simulator host runs the DW nodes in this process
    run_replay(args, table_from_create, spark_nodes)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="aggview", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--log-format",
        choices=logformat.FORMATS,
        default=logformat.default_format(),
        help="how servers log: text, or one JSON object per line for a log collector "
        "(default: $AGGVIEW_LOG_FORMAT, else text)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_server_commands(sub)
    _add_client_commands(sub)
    certs = sub.add_parser("certs", help="make a development CA, certificates and tokens")
    certs.add_argument("dir", help="where to write them (created if missing)")
    certs.add_argument(
        "--host",
        action="append",
        default=[],
        help="another name or IP address the servers are reached at (localhost, 127.0.0.1 "
        "and ::1 are always in)",
    )
    certs.add_argument("--days", type=int, default=365, help="validity of the certificates")
    certs.add_argument("--force", action="store_true", help="replace files already there")
    certs.set_defaults(run=_run_certs)

    hbase = sub.add_parser("hbase", help="a real standalone HBase on this machine (Java, Maven)")
    hbase_actions = hbase.add_subparsers(dest="action", required=True)
    hbase_start = hbase_actions.add_parser(
        "start", help="resolve HBase's jars (once), start HBase and its Thrift server"
    )
    hbase_start.add_argument("--dir", required=True, help="its files, logs and tables go here")
    hbase_start.add_argument(
        "--port", type=int, default=9090, help="the Thrift server's port (0: a free one)"
    )
    hbase_start.set_defaults(run=run_hbase_start)
    hbase_stop = hbase_actions.add_parser("stop", help="stop the HBase started from --dir")
    hbase_stop.add_argument("--dir", required=True, help="the --dir it was started with")
    hbase_stop.set_defaults(run=run_hbase_stop)

    docker = sub.add_parser("docker", help="Docker images of aggview and of HBase")
    docker_actions = docker.add_subparsers(dest="action", required=True)
    docker_build = docker_actions.add_parser(
        "build",
        help="build aggview:latest and the HBase image (the jars of `aggview hbase start`) "
        "FROM Debian, made here from Debian's packages unless --base names an image",
    )
    docker_build.add_argument(
        "--source", help="the aggview checkout to build (default: the one this aggview runs from)"
    )
    docker_build.add_argument(
        "--base",
        help="an image to build FROM, pulled if missing, e.g. debian:bookworm-slim (default: "
        "aggview-debian:bookworm, made once by debootstrap from Debian's packages: no registry)",
    )
    docker_build.add_argument(
        "--mirror", help="the Debian mirror for debootstrap (default: the one apt uses here)"
    )
    docker_build.add_argument(
        "--start-engine",
        action="store_true",
        help="where no Docker engine answers, start dockerd (root, Linux), installing Debian's "
        "docker.io and debootstrap if missing",
    )
    docker_build.set_defaults(run=_run_docker_build)

    from aggspark.commands import add_spark_commands
    from loadgen.commands import add_bench_commands

    add_spark_commands(sub, add_client_security, client_options)
    add_bench_commands(sub, add_client_security, client_options)
    _add_cumulus_commands(sub)

    demo = sub.add_parser("demo", help="the main job: a local cluster, a workload, a report")
    demo.add_argument("--data", help="keep the cluster's data here (default: a temp dir)")
    demo.add_argument("--ltms", type=int, default=3, help="partitions of the local cluster")
    demo.add_argument("--out", default="aggview-report", help="where the report and plots go")
    demo.add_argument(
        "--quick", action="store_true", help="every step at a small size (a few minutes)"
    )
    demo.set_defaults(run=_run_demo)
    return parser


def _add_server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``aggview start`` (a whole cluster here) and ``aggview ltm`` (one member)."""
    from agglauncher.cluster import PROCESSES_HELP

    start = sub.add_parser(
        "start",
        help="run N partitions in coordinating processes (on the embedded store, or --store)",
        description="Runs the --ltms partitions in member processes and keeps them running: a "
        "member that exits is restarted on its own data (one that cannot start is retried, "
        "waiting up to 30 s between tries). Ctrl-C or SIGTERM stops every member cleanly; "
        "`kill -USR1` of this process makes each member write where its tasks wait to its "
        "log in DATA/logs/.",
    )
    start.add_argument("--data", required=True, help="data directory (created if missing)")
    start.add_argument("--ltms", type=int, default=3, help="partitions (one LTM each)")
    start.add_argument(
        "--store",
        default="",
        help="hbase://HOST:PORT (e.g. from `aggview hbase start`); default: the embedded store "
        "in DATA/store.db",
    )
    start.add_argument("--port", type=int, default=0, help="member 0's port (clients' address)")
    start.add_argument(
        "--no-fsync", action="store_true", help="skip fsync of logs (tests and demos only)"
    )
    start.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help=METRICS_HELP.replace("this port", "this port + M for member M").replace(
            "0: a free one", "0: a free one each"
        ),
    )
    start.add_argument("--no-metrics", action="store_true", help=NO_METRICS_HELP)
    start.add_argument(
        "--replicate",
        action="store_true",
        help="each process's logs are copied to the next process, which takes its partitions "
        "(and its commit decisions, and the lead from member 0) over if it stays silent for "
        "2 s; a dead process is restarted (holding copies, if its partitions moved)",
    )
    start.add_argument(
        "--processes",
        type=int,
        default=None,
        help=PROCESSES_HELP,
    )
    add_server_security(start, clients=True)
    start.set_defaults(run=run_start)

    ltm = sub.add_parser(
        "ltm",
        help="run a local transaction manager: one of the coordinating members that each "
        "serve a share of the partitions (--member-address, repeated; alone: all of them)",
    )
    ltm.add_argument("--store", required=True, help="sqlite:///path or hbase://host:port")
    ltm.add_argument("--log-dir", required=True, help="where this member's logs go")
    ltm.add_argument("--partitions", type=int, required=True, help="the cluster's partitions")
    add_member_options(ltm)
    add_common(ltm)
    add_server_security(ltm, clients=True)
    ltm.set_defaults(run=run_ltm)


def _add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that talk to a running cluster: ``sql``, ``watch``, ``status``."""
    sql = sub.add_parser(
        "sql",
        help="run SQL against a cluster: statements given, a file, or an interactive shell",
        intermixed=True,
    )
    sql.add_argument("address", type=address_type, help="a server of the cluster, HOST:PORT")
    sql.add_argument("statements", nargs="*", help="each one call (BEGIN; ...; COMMIT; is one)")
    sql.add_argument("-f", "--file", help="run the statements of this file (-: stdin)")
    sql.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table: tab-separated, with a row count; csv and json: only the rows on stdout "
        "(the row count and other messages on stderr)",
    )
    add_client_security(sql)
    sql.set_defaults(run=run_sql)

    watch = sub.add_parser("watch", help="print a view's changes as they commit, until Ctrl-C")
    watch.add_argument("address", type=address_type, help="a server of the cluster, HOST:PORT")
    watch.add_argument("view", help="a materialized view's name")
    watch.add_argument(
        "--where",
        action="append",
        default=[],
        type=equality,
        metavar="COLUMN=VALUE",
        help="only this slice (repeated: every one holds; a whole number is an INT, anything "
        "else text; default: the whole view)",
    )
    watch.add_argument(
        "--interval-ms", type=int, default=0, help="how often the server looks (default: 50)"
    )
    watch.add_argument(
        "--tentative",
        action="store_true",
        help="a cumulus view: its tentative changes too, as each feed of its runtime reaches them",
    )
    add_client_security(watch)
    watch.set_defaults(run=run_watch)

    status = sub.add_parser(
        "status",
        help="each member of a running cluster: role, term, partitions, reachable members, "
        "up/down, throughput, views with their mode and lag",
        description="Asks ADDRESS for the cluster's members, then each member for its status. "
        "In a secure cluster, --tls-dir DIR also gives the cluster's secret (DIR/cluster.secret), "
        "which each member's details need; with --ca and --token alone members show up or down.",
    )
    status.add_argument("address", type=address_type, help="a server of the cluster, HOST:PORT")
    status.add_argument("--format", choices=["text", "json"], default="text", help="output")
    status.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        help="seconds a member may take to answer before it counts as down (default: %(default)s)",
    )
    status.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between the two samples whose commits give the throughput, and between "
        "refreshes with --watch (default: %(default)s; 0: one sample, no throughput)",
    )
    status.add_argument(
        "--watch",
        action="store_true",
        help="refresh every --interval seconds until Ctrl-C (--format json: one JSON object "
        "per line)",
    )
    add_client_security(status)
    status.set_defaults(run=run_status)


def _add_cumulus_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``aggview m3`` and ``aggview cumulus`` (replay, and one DW node)."""
    from cumulus.m3.command import add_m3_command
    from cumulus.runtime.replay import add_cumulus_commands

    add_m3_command(sub, _run_m3)
    cumulus = add_cumulus_commands(sub, _run_cumulus_replay)
    node = cumulus.add_parser(
        "node",
        help="Cumulus DW nodes: without --program, for the views that name this address in "
        "their host option (host = 'h1:port,h2:port'); with it, one node of a replay",
    )
    node.add_argument(
        "--program",
        help="the M3 program (aggview m3 prints one; replay --host grpc starts such nodes); "
        "default: none, views assign this process their programs",
    )
    node.add_argument("--number", type=int, help="this node's number, from 0 (with --program)")
    node.add_argument("--nodes", type=int, help="DW nodes in all (with --program)")
    node.add_argument("--switches", type=int, default=1, help="update streams")
    node.add_argument(
        "--per-switch",
        action="store_true",
        help="conservative: version numbers per switch (a cluster member's switch each)",
    )
    node.add_argument(
        "--mode",
        choices=("speculative", "conservative"),
        default="speculative",
        help="speculative: corrective updates; conservative: wait for version numbers",
    )
    node.add_argument(
        "--log-limit", type=int, default=None, help="write-log entries (default: no limit)"
    )
    add_common(node)
    add_server_security(node, clients=False)
    node.set_defaults(run=run_cumulus_node)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # a server a test or ``aggview start`` started
    args = build_parser().parse_args(argv)
    logformat.configure(args.verbose, args.log_format)
    try:
        args.run(args)
    except errors.AggviewError as exc:
        print(f"aggview: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
