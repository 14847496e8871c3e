"""The ``aggview`` command line."""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.processes import die_with_parent

DESCRIPTION = (
    "aggview: transactional aggregate views over key-value stores. Start a cluster (start, "
    "ltm), talk to it (sql, watch, load, views, verify), measure it (bench, demo). "
    "aggview COMMAND --help lists a command's options."
)
# What a client's hint at a TLS mismatch names (the Python client's names its arguments).
CLI_TLS_SETTINGS = "--tls-dir DIR (or --ca FILE and --token T)"

PLAINTEXT_REFUSED = (
    "refusing to serve plaintext without authentication: pass --tls-dir DIR (TLS everywhere, "
    "client tokens; `aggview certs DIR` makes one), or --insecure (plaintext, anyone who can "
    "connect may do anything: one trusted machine only)"
)


def _shown(value: Any) -> str:
    """A default as the help shows it (argparse %-formats help, so % is doubled)."""
    if value is None or value == []:
        text = "none"
    elif isinstance(value, list | tuple):
        text = " ".join(map(str, value))
    else:
        text = str(value)
    return text.replace("%", "%%")


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default is argparse.SUPPRESS
            or action.required
            or not action.option_strings
            or action.nargs == 0  # a flag: off unless given
            or "default" in text.lower()
        ):
            return text
        return f"{text} (default: {_shown(action.default)})".strip()

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and self._get_help_string(action):  # its default, at least
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)


class _Parser(argparse.ArgumentParser):
    """Shows defaults; ``intermixed``: options may come anywhere among the positionals
    (``aggview sql ADDRESS "SELECT ..." --format csv "SELECT ..."``)."""

    def __init__(self, *args: Any, intermixed: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        self._intermixed = intermixed
        self._mixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if not self._intermixed or self._mixing:  # intermixed parsing calls this twice
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


def _address(text: str) -> str:
    """HOST:PORT, checked: a bare host would make gRPC dial port 443."""
    host, sep, port = text.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:7070)")
    return text


def _add_server_security(parser: argparse.ArgumentParser, *, clients: bool) -> None:
    group = parser.add_argument_group("security (one of --tls-dir and --insecure is required)")
    group.add_argument(
        "--tls-dir",
        help="ca.pem, server.pem/-key.pem, client.pem/-key.pem, cluster.secret (aggview certs)"
        " (default: none)",
    )
    group.add_argument(
        "--insecure", action="store_true", help="plaintext, no tokens, no member check"
    )
    if clients:
        group.add_argument(
            "--tokens", help="client tokens, TOKEN ROLE [NAME] lines (default: TLS_DIR/tokens)"
        )
        group.add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="override a limit, e.g. max_views=20 (repeated; the limits are listed in the "
            "README's Security section; default: none)",
        )


def _server_tls_dir(args: argparse.Namespace) -> Path | None:
    """The TLS directory, or None for --insecure; plaintext is never a silent default."""
    if args.insecure and args.tls_dir:
        raise errors.InvalidArgument("give --tls-dir or --insecure, not both")
    if args.insecure:
        return None
    if not args.tls_dir:
        raise errors.InvalidArgument(PLAINTEXT_REFUSED)
    return Path(args.tls_dir)


def _tokens_path(args: argparse.Namespace, tls_dir: Path | None) -> Path | None:
    if tls_dir is None:
        if args.tokens:
            raise errors.InvalidArgument("--tokens needs --tls-dir: tokens are only sent over TLS")
        return None
    return Path(args.tokens) if args.tokens else tls_dir / "tokens"


def _refuse_taken_port(host: str, port: int) -> None:
    """A port in use is one line naming it, before any server starts (the server's own bind
    failure comes as gRPC's log line, or, under ``aggview start``, a member's traceback)."""
    if not port:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise errors.Unavailable(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _add_client_security(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("security (a cluster started with --tls-dir)")
    group.add_argument("--ca", help="the cluster's CA certificate (ca.pem); default: none")
    group.add_argument(
        "--token", default=os.environ.get("AGGVIEW_TOKEN"), help="default: $AGGVIEW_TOKEN"
    )
    group.add_argument(
        "--tls-dir",
        dest="client_tls_dir",
        metavar="DIR",
        help="use DIR/ca.pem, and without --token the first admin token of DIR/tokens "
        "(default: none)",
    )


def _client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The Client keyword arguments the security flags of a command ask for."""
    from aggview.security import token_for

    ca, token = args.ca, args.token
    if args.client_tls_dir:
        directory = Path(args.client_tls_dir)
        ca = ca or directory / "ca.pem"
        if token is None and (directory / "tokens").exists():
            token = token_for(directory / "tokens", "admin")
    return {"ca": ca, "token": token}


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """A blocking client for ``args.address`` with the security flags of the command, whose
    hints name those flags."""
    from aggclient.client import Client

    client = Client(args.address, **_client_options(args))
    client.tls_settings = CLI_TLS_SETTINGS
    return client


def _run_certs(args: argparse.Namespace) -> None:
    from aggview.certs import make_certs

    written = make_certs(Path(args.dir), hosts=args.host, days=args.days, force=args.force)
    for path in written:
        print(path)
    print(
        f"start servers with --tls-dir {args.dir}; clients need {Path(args.dir) / 'ca.pem'} and "
        f"a token from {Path(args.dir) / 'tokens'}"
    )


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--no-fsync", action="store_true", help="skip fsync of logs (tests and demos only)"
    )


METRICS_HELP = (
    "serve Prometheus metrics over HTTP at /metrics on this port (0: a free one, printed at "
    "start; unauthenticated and plaintext even with --tls-dir). Default: none (off)"
)


def _add_member_options(parser: argparse.ArgumentParser) -> None:
    """What a coordinating process takes: its place among the members, its partitions'
    checkpoints and cache, and failover."""
    parser.add_argument(
        "--member-address",
        action="append",
        default=[],
        help="every coordinating member's address, in order (repeated; member 0 keeps the "
        "clock and the catalog); partition p is hosted by member p %% members",
    )
    parser.add_argument(
        "--member-exchange",
        action="append",
        default=[],
        help="where every member serves the other members' transaction streams on framed TCP, "
        "in member order (repeated; as many as --member-address). Without it, those streams go "
        "over gRPC, which costs each message about 15 times the CPU (python -m bench.messages)",
    )
    parser.add_argument(
        "--exchange-port",
        type=int,
        default=None,
        help="the port this member serves framed TCP on (default: its --member-exchange's)",
    )
    parser.add_argument("--member", type=int, default=0, help="which member this is")
    parser.add_argument("--metrics-port", type=int, default=None, help=METRICS_HELP)
    parser.add_argument(
        "--take-lead",
        action="store_true",
        help="with --failover-after: this member leads the cluster (keeps the clock and the "
        "catalog) whoever led before; only for a start of every member at once (aggview start "
        "gives it to member 0). Without it a member follows the leader the store records",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=2.0,
        help="seconds between checkpoints of committed rows to the store",
    )
    parser.add_argument(
        "--cache-rows", type=int, default=1_000_000, help="rows each partition keeps in memory"
    )
    parser.add_argument(
        "--failover-after",
        type=float,
        default=0.0,
        help="seconds a member may stay silent before its partitions and decisions move to "
        "the next member, which holds their copies (0: never; needs --member-address): every "
        "member copies its logs to the next one, the leader moves a silent member's partitions "
        "and decisions, and the next member takes the lead from a silent leader",
    )


def _register_view_hosts() -> None:
    """Cumulus views may run their DW nodes on Spark (``host = 'spark'``): the Spark layer is
    imported only when one does."""
    from coordinator import cumulus_hosts

    def spark(*args: Any) -> Any:
        from aggspark.view_host import SparkStageNodes

        return SparkStageNodes(*args)

    cumulus_hosts.EXTRA_HOSTS["spark"] = spark


def _run_ltm(args: argparse.Namespace) -> None:
    """A coordinating LTM: hosts its share of the partitions (all of them alone) and
    coordinates the transactions sent to it."""
    from aggview.security import TlsDir, load_tokens
    from coordinator.convert import Limits
    from coordinator.service import CoordinatorConfig, serve

    _register_view_hosts()
    if len(args.member_address) == 1:  # one member: the whole cluster in this process
        args.member_address = []
        args.member_exchange = []
    if args.member_address and not 0 <= args.member < len(args.member_address):
        raise errors.InvalidArgument(
            f"--member {args.member} is not one of the {len(args.member_address)} members"
        )
    if args.partitions < 1:
        raise errors.InvalidArgument("--partitions must be at least 1")
    if args.member_exchange and len(args.member_exchange) != len(args.member_address):
        raise errors.InvalidArgument(
            f"{len(args.member_exchange)} --member-exchange for "
            f"{len(args.member_address)} --member-address: give one per member, or none"
        )
    exchange_port = args.exchange_port
    if exchange_port is None and args.member_exchange:
        from aggview.frames import host_port

        own = args.member_exchange[args.member]
        try:
            _, exchange_port = host_port(own)
        except ValueError:
            raise errors.InvalidArgument(f"--member-exchange {own!r} is not host:port") from None
    tls_dir = _server_tls_dir(args)
    tokens = _tokens_path(args, tls_dir)
    _refuse_taken_port(args.host, args.port)
    if args.metrics_port is not None:
        _refuse_taken_port(args.host, args.metrics_port)
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
    )
    asyncio.run(serve(config))


def _run_start(args: argparse.Namespace) -> None:
    from agglauncher.cluster import LocalCluster, Restarts, checked_processes

    if args.ltms < 1:
        raise errors.InvalidArgument("--ltms must be at least 1")
    args.processes = checked_processes(args.ltms, args.processes, args.replicate)
    from aggview.security import TlsDir, load_tokens
    from coordinator.convert import Limits

    tls_dir = _server_tls_dir(args)
    tokens = _tokens_path(args, tls_dir)
    limits = Limits.parse(args.limit)  # checked here: a bad flag fails before anything starts
    _refuse_taken_port("127.0.0.1", args.port)
    if args.metrics_port:  # member m serves on metrics_port + m
        for m in range(min(args.processes, args.ltms)):
            _refuse_taken_port("127.0.0.1", args.metrics_port + m)
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
        restarts = Restarts(cluster.servers, say=_say)
        while not signalled:
            time.sleep(0.2)
            if dumps:
                del dumps[:]
                logs = ", ".join(str(log) for log in cluster.dump_stacks())
                _say(f"SIGUSR1 passed on: each server writes where its tasks wait to {logs}")
            if not signalled:
                restarts.tend()  # a dead member comes back on its data (with --replicate too)
    finally:
        cluster.stop()
    print("aggview stopped", flush=True)


def _say(text: str) -> None:
    print(f"aggview: {text}", file=sys.stderr, flush=True)


def _run_sql(args: argparse.Namespace) -> None:
    """Statements from the command line, a file (``-f FILE``, ``-f -``: stdin), or, with
    neither, stdin: an interactive shell with history when it is a terminal."""
    from aggview.sqlscript import calls, shell

    with _client(args) as client:
        if args.statements:
            for statement in args.statements:
                _print_result(client.sql(statement), args.format)
        elif args.file is not None or not sys.stdin.isatty():
            text = sys.stdin.read() if args.file in (None, "-") else Path(args.file).read_text()
            for call in calls(text):
                _print_result(client.sql(call), args.format)
        else:
            shell(lambda call: _print_result(client.sql(call), args.format), args.address)


def _print_result(rows: Any, form: str) -> None:
    """The rows on stdout, and the messages (row count, timestamp) too for a table; for csv
    and json the messages go to stderr, so that stdout is only CSV, or one JSON document (a
    read-only block's: an array of its SELECTs' arrays)."""
    from aggview.sqlscript import render

    def rendered(result: Any) -> str:
        return render(list(result.columns), [[r[c] for c in result.columns] for r in result], form)

    block = list(getattr(rows, "results", []))
    messages = sys.stdout if form == "table" else sys.stderr
    if form == "json":
        print(f"[{', '.join(map(rendered, block))}]" if block else rendered(rows))
    for result in [*block, rows]:
        text = "" if form == "json" else rendered(result)
        if text:
            print(text)
        if result.message:
            print(result.message, file=messages, flush=True)


def _equality(text: str) -> tuple[str, Any]:
    """``--where COLUMN=VALUE``: a whole number is an INT, anything else text."""
    column, sep, value = text.partition("=")
    if not sep or not column.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not COLUMN=VALUE")
    return column.strip(), int(value) if value.lstrip("-").isdigit() else value


# How long ``aggview watch`` waits for its first answer before it gives up, saying why.
WATCH_FIRST_ANSWER = 5.0


def _run_watch(args: argparse.Namespace) -> None:
    """Prints a view's changes as they come, until Ctrl-C. A server that cannot be reached (or
    that speaks TLS to a plaintext client) fails it at once with the reason, not a silent
    wait: one read of the view's first row first."""
    from aggclient.subscriptions import Changes, Watch

    def show(changes: Changes, watch: Watch) -> None:
        if changes.reset:
            print(f"-- {len(changes.changes)} row(s) at timestamp {changes.timestamp}")

        def shown(row: dict[str, Any]) -> str:
            return " ".join(f"{k}={v}" for k, v in sorted(row.items()))

        for change in changes.changes:
            before = "" if changes.reset or change.old is None else f"{shown(change.old)} -> "
            after = "(gone)" if change.new is None else shown(change.new)
            print(f"{changes.timestamp}\t{before}{after}", flush=True)

    where = dict(args.where)
    with _client(args) as client:
        client.timeout = WATCH_FIRST_ANSWER
        client.query(args.view, where, limit=1)  # reachable, the view and columns exist
        consistency = "tentative" if args.tentative else "committed"
        with client.watch(
            args.view, show, where, interval_ms=args.interval_ms, consistency=consistency
        ) as watch:
            while watch.error is None:
                time.sleep(0.2)
            raise watch.error


def _run_status(args: argparse.Namespace) -> None:
    """Each member's role, partitions, views and lag, as the cluster says (aggclient.status)."""
    import json

    from aggclient.status import cluster_status, render_text

    options = _client_options(args)
    secret = None
    if args.client_tls_dir and (Path(args.client_tls_dir) / "cluster.secret").exists():
        secret = (Path(args.client_tls_dir) / "cluster.secret").read_text().strip()
    status = cluster_status(
        args.address,
        ca=options["ca"],
        token=options["token"],
        secret=secret,
        timeout=args.timeout,
        tls_settings=CLI_TLS_SETTINGS,
    )
    if args.format == "json":
        print(json.dumps(status.to_json(), indent=2))
    else:
        print(render_text(status))


def _run_hbase_start(args: argparse.Namespace) -> None:
    from ltm.store.hbase_server import HBASE_VERSION, StandaloneHBase, cache_directory

    print(f"HBase {HBASE_VERSION}: jars in {cache_directory()} (resolved by Maven the first time)")
    running = StandaloneHBase(Path(args.dir), port=args.port).start()
    print(f"HBase running from {args.dir}: {running.url}")


def _run_hbase_stop(args: argparse.Namespace) -> None:
    from ltm.store.hbase_server import StandaloneHBase

    if not StandaloneHBase(Path(args.dir)).stop():
        raise errors.FailedPrecondition(f"no HBase runs from {args.dir}")
    print(f"HBase from {args.dir} stopped")


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

    run_replay(args, table_from_create, spark_nodes)


def _run_cumulus_node(args: argparse.Namespace) -> None:
    from aggview.security import TlsDir
    from cumulus.runtime.dw_server import NodeConfig, serve

    tls_dir = _server_tls_dir(args)
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
        host=args.host,
        port=args.port,
        tls=TlsDir.load(tls_dir) if tls_dir is not None else None,
    )
    asyncio.run(serve(config))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="aggview", description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
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
    hbase_start.set_defaults(run=_run_hbase_start)
    hbase_stop = hbase_actions.add_parser("stop", help="stop the HBase started from --dir")
    hbase_stop.add_argument("--dir", required=True, help="the --dir it was started with")
    hbase_stop.set_defaults(run=_run_hbase_stop)

    from aggspark.commands import add_spark_commands
    from loadgen.commands import add_bench_commands

    add_spark_commands(sub, _add_client_security, _client_options)
    add_bench_commands(sub, _add_client_security, _client_options)
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
    _add_server_security(start, clients=True)
    start.set_defaults(run=_run_start)

    ltm = sub.add_parser(
        "ltm",
        help="run a local transaction manager: one of the coordinating members that each "
        "serve a share of the partitions (--member-address, repeated; alone: all of them)",
    )
    ltm.add_argument("--store", required=True, help="sqlite:///path or hbase://host:port")
    ltm.add_argument("--log-dir", required=True, help="where this member's logs go")
    ltm.add_argument("--partitions", type=int, required=True, help="the cluster's partitions")
    _add_member_options(ltm)
    _add_common(ltm)
    _add_server_security(ltm, clients=True)
    ltm.set_defaults(run=_run_ltm)


def _add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that talk to a running cluster: ``sql``, ``watch``, ``status``."""
    sql = sub.add_parser(
        "sql",
        help="run SQL against a cluster: statements given, a file, or an interactive shell",
        intermixed=True,
    )
    sql.add_argument("address", type=_address, help="a server of the cluster, HOST:PORT")
    sql.add_argument("statements", nargs="*", help="each one call (BEGIN; ...; COMMIT; is one)")
    sql.add_argument("-f", "--file", help="run the statements of this file (-: stdin)")
    sql.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="table: tab-separated, with a row count; csv and json: only the rows on stdout "
        "(the row count and other messages on stderr)",
    )
    _add_client_security(sql)
    sql.set_defaults(run=_run_sql)

    watch = sub.add_parser("watch", help="print a view's changes as they commit, until Ctrl-C")
    watch.add_argument("address", type=_address, help="a server of the cluster, HOST:PORT")
    watch.add_argument("view", help="a materialized view's name")
    watch.add_argument(
        "--where",
        action="append",
        default=[],
        type=_equality,
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
    _add_client_security(watch)
    watch.set_defaults(run=_run_watch)

    status = sub.add_parser(
        "status",
        help="each member of a running cluster: role, term, partitions, reachable members, "
        "up/down, views with their mode and lag",
        description="Asks ADDRESS for the cluster's members, then each member for its status. "
        "In a secure cluster, --tls-dir DIR also gives the cluster's secret (DIR/cluster.secret), "
        "which each member's details need; with --ca and --token alone members show up or down.",
    )
    status.add_argument("address", type=_address, help="a server of the cluster, HOST:PORT")
    status.add_argument("--format", choices=["text", "json"], default="text", help="output")
    status.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        help="seconds a member may take to answer before it counts as down",
    )
    _add_client_security(status)
    status.set_defaults(run=_run_status)


def _add_cumulus_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``aggview m3`` and ``aggview cumulus`` (replay, and one DW node)."""
    from cumulus.m3.command import add_m3_command
    from cumulus.runtime.replay import add_cumulus_commands

    add_m3_command(sub, _run_m3)
    cumulus = add_cumulus_commands(sub, _run_cumulus_replay)
    node = cumulus.add_parser("node", help="one Cumulus DW node (replay --host grpc starts them)")
    node.add_argument("--program", required=True, help="the M3 program (aggview m3 prints one)")
    node.add_argument("--number", type=int, required=True, help="this node's number, from 0")
    node.add_argument("--nodes", type=int, required=True, help="DW nodes in all")
    node.add_argument("--switches", type=int, default=1, help="update streams")
    node.add_argument(
        "--mode",
        choices=("speculative", "conservative"),
        default="speculative",
        help="speculative: corrective updates; conservative: wait for version numbers",
    )
    node.add_argument(
        "--log-limit", type=int, default=None, help="write-log entries (default: no limit)"
    )
    _add_common(node)
    _add_server_security(node, clients=False)
    node.set_defaults(run=_run_cumulus_node)


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # a server a test or ``aggview start`` started
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
