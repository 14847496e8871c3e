"""``aggview load``, ``aggview views init`` and ``aggview verify``: the Spark jobs on the command
line, with a live status line while they run and a summary at the end."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console

from aggspark.progress import spark_status
from aggview import errors

AddSecurity = Callable[[argparse.ArgumentParser], None]
ClientOptions = Callable[[argparse.Namespace], dict[str, Any]]
T = TypeVar("T")


def add_spark_commands(sub: Any, add_security: AddSecurity, client_options: ClientOptions) -> None:
    load = sub.add_parser(
        "load", help="bulk-load CSV or Parquet files into a table (Spark), at one timestamp"
    )
    load.add_argument("address", help="a server of the cluster, HOST:PORT")
    load.add_argument("table", help="the table the rows go to (it must exist)")
    load.add_argument("files", nargs="+", metavar="FILE", help="CSV or Parquet files")
    load.add_argument("--format", choices=["csv", "parquet"], help="default: from the suffix")
    load.add_argument(
        "--no-header", action="store_true", help="CSV files have no header line (table order)"
    )
    add_security(load)
    load.set_defaults(run=lambda args: _run_load(args, client_options(args)))

    views = sub.add_parser("views", help="materialized views computed by Spark")
    actions = views.add_subparsers(dest="action", required=True)
    init = actions.add_parser(
        "init",
        help="create a view from its SQL, or recompute an existing one, with Spark SQL at a "
        "snapshot while writers go on",
    )
    init.add_argument("address", help="a server of the cluster, HOST:PORT")
    init.add_argument("view", help="a view name, or a CREATE MATERIALIZED VIEW statement")
    add_security(init)
    init.set_defaults(run=lambda args: _run_init(args, client_options(args)))

    verify = sub.add_parser(
        "verify", help="recompute views with Spark and report every group that differs"
    )
    verify.add_argument("address", help="a server of the cluster, HOST:PORT")
    verify.add_argument("views", nargs="*", metavar="VIEW", help="default: every view")
    add_security(verify)
    verify.set_defaults(run=lambda args: _run_verify(args, client_options(args)))


def _spark(console: Console) -> Any:
    from aggspark.session import spark_log, spark_session

    with console.status(f"starting Spark (its own log: {spark_log()})"):
        return spark_session()


def _run_job(label: str, job: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    """Starts Spark and runs ``job(spark, *args, progress=..., **kwargs)`` under a live status
    line saying ``label``: its result, and the seconds it took (Spark's start not counted)."""
    console = Console(stderr=True)
    spark = _spark(console)
    started = time.monotonic()
    with spark_status(console, spark, label) as progress:
        result = job(spark, *args, progress=progress, **kwargs)
    return result, time.monotonic() - started


def _run_load(args: argparse.Namespace, options: dict[str, Any]) -> None:
    from aggspark.jobs import load_files

    result, seconds = _run_job(
        f"loading {args.table}",
        load_files,
        args.address,
        args.table,
        args.files,
        file_format=args.format,
        header=not args.no_header,
        client_options=options,
    )
    print(
        f"loaded {result.rows} rows into {result.table} at timestamp {result.timestamp} "
        f"in {seconds:.1f} s"
    )


def _run_init(args: argparse.Namespace, options: dict[str, Any]) -> None:
    from aggspark.jobs import init_view

    target = args.view.strip()
    is_sql = target.split(None, 1)[0].upper() == "CREATE" if target else False
    result, seconds = _run_job(
        "initializing",
        init_view,
        args.address,
        sql=target if is_sql else "",
        view="" if is_sql else target,
        client_options=options,
    )
    computed = f"{result.entries} map entries" if result.entries else f"{result.groups} groups"
    print(f"{result.message}: {computed}, written at {result.timestamp}, in {seconds:.1f} s")


def _run_verify(args: argparse.Namespace, options: dict[str, Any]) -> None:
    from aggspark.jobs import verify_views

    results, _ = _run_job(
        "verifying", verify_views, args.address, args.views or None, client_options=options
    )
    wrong = 0
    for result in results:
        if result.ok:
            print(
                f"{result.view}: OK, {result.groups} groups equal at timestamp {result.timestamp}"
            )
            continue
        wrong += 1
        print(
            f"{result.view}: {len(result.differences)} of {result.groups} groups DIFFER at "
            f"timestamp {result.timestamp}"
        )
        for diff in result.differences:
            print(f"  group {diff.group}: recomputed {diff.expected}, maintained {diff.actual}")
    if wrong:
        raise errors.FailedPrecondition(f"{wrong} view(s) differ from their recomputation")
