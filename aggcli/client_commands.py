"""The ``aggview`` commands that talk to a running cluster: ``sql``, ``watch`` and ``status``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from aggcli.options import CLI_TLS_SETTINGS, client_options, open_client
from aggview import errors


def run_sql(args: argparse.Namespace) -> None:
    """Statements from the command line, a file (``-f FILE``, ``-f -``: stdin), or, with
    neither, stdin: an interactive shell with history when it is a terminal."""
    from aggview.sqlscript import calls, shell

    with open_client(args) as client:
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


def equality(text: str) -> tuple[str, Any]:
    """``--where COLUMN=VALUE``: a whole number is an INT, anything else text."""
    column, sep, value = text.partition("=")
    if not sep or not column.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not COLUMN=VALUE")
    return column.strip(), int(value) if value.lstrip("-").isdigit() else value


# How long ``aggview watch`` waits for its first answer before it gives up, saying why.
WATCH_FIRST_ANSWER = 5.0


def run_watch(args: argparse.Namespace) -> None:
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
    with open_client(args) as client:
        client.timeout = WATCH_FIRST_ANSWER
        client.query(args.view, where, limit=1)  # reachable, the view and columns exist
        consistency = "tentative" if args.tentative else "committed"
        with client.watch(
            args.view, show, where, interval_ms=args.interval_ms, consistency=consistency
        ) as watch:
            while watch.error is None:
                time.sleep(0.2)
            raise watch.error


def run_status(args: argparse.Namespace) -> None:
    """Each member's role, partitions, views, lag and throughput, as the cluster says
    (aggclient.status); ``--watch``: again every ``--interval`` seconds until Ctrl-C."""
    import json

    from aggclient.status import cluster_status, render_text, throughput

    if args.interval < 0 or (args.watch and args.interval == 0):
        raise errors.InvalidArgument(
            f"--interval must be above 0 with --watch, and not negative; got {args.interval:g}"
        )
    options = client_options(args)
    secret = None
    if args.client_tls_dir and (Path(args.client_tls_dir) / "cluster.secret").exists():
        secret = (Path(args.client_tls_dir) / "cluster.secret").read_text().strip()

    def sample() -> tuple[float, Any]:
        status = cluster_status(
            args.address,
            ca=options["ca"],
            token=options["token"],
            secret=secret,
            timeout=args.timeout,
            tls_settings=CLI_TLS_SETTINGS,
        )
        return time.monotonic(), status

    previous = sample()
    if args.interval > 0 and not args.watch:  # a second sample gives the throughput
        time.sleep(args.interval)
    clear = args.watch and args.format == "text" and sys.stdout.isatty()
    try:
        while True:
            if args.interval > 0:
                now = sample()
                status = throughput(previous[1], now[1], now[0] - previous[0])
                previous = now
            else:
                status = previous[1]
            if args.format == "json":
                print(json.dumps(status.to_json(), indent=None if args.watch else 2), flush=True)
            else:
                print(("\x1b[H\x1b[2J" if clear else "") + render_text(status), flush=True)
            if not args.watch:
                return
            if args.format == "text" and not clear:
                print(flush=True)  # refreshes apart
            time.sleep(args.interval)
    except KeyboardInterrupt:
        if not args.watch:
            raise
