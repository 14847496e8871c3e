"""``aggview bench tpcw``: TPC-W's emulated browsers against a cluster, with a report.

A run checks its arguments and the cluster first (nothing is loaded when one is wrong), then
prepares the shop (tables, views, and the population through the Spark bulk path, unless the
cluster already holds a population of the same size), drives ``--browsers`` emulated browsers
for ``--seconds`` with a live display, checks that the rows the committed interactions wrote
are in the tables, verifies every view against a Spark recomputation, and writes
``tpcw.json``, ``tpcw.csv`` and PNG plots into ``--out``. Ctrl-C stops the browsers and still
writes what was measured (the report says ``interrupted``; the verification is skipped).

    python -m loadgen.tpcw_bench --mix ordering --browsers 8 --items 1000 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from aggclient import AsyncClient, Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import PROCESSES_HELP, LocalCluster, checked_processes
from aggview import errors
from loadgen import tpcw, tpcw_interactions
from loadgen.report import RunReport, bar_plot, percentiles
from loadgen.tpcw_checks import consistency, snapshot, verify
from loadgen.tpcw_setup import check_population, load_population, population_meta, prepare_views

GRACE_SECONDS = 15.0  # after the deadline, how long in-flight interactions may take
MAX_LTMS = 32
REPORT_COLUMNS = (
    "interaction",
    "count",
    "per_s",
    "committed",
    "aborts",
    "errors",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_ms",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="a running cluster (default: start a local one)")
    parser.add_argument("--ltms", type=int, default=3, help="LTMs of the local cluster")
    parser.add_argument("--processes", type=int, default=None, help=PROCESSES_HELP)
    parser.add_argument("--data", help="data directory of the local cluster (default: temp)")
    parser.add_argument("--no-fsync", action="store_true", help="local cluster skips fsync")
    parser.add_argument("--browsers", type=int, default=4, help="emulated browsers")
    parser.add_argument("--items", type=int, default=1000, help="items: 1,000 to 100,000")
    parser.add_argument(
        "--customers-per-browser",
        type=int,
        default=tpcw.CUSTOMERS_PER_BROWSER,
        help="TPC-W: 2,880; fewer only for quick runs",
    )
    parser.add_argument("--mix", default="shopping", help="browsing, shopping or ordering")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the load")
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="mean think time (0: as fast as possible)"
    )
    parser.add_argument(
        "--view-mode",
        default="mixed",
        help="mixed (cart and order totals sync, sales async), sync, async, cumulus or none",
    )
    parser.add_argument(
        "--interval-ms", type=int, default=1000, help="async refresh interval, cumulus epoch"
    )
    parser.add_argument(
        "--clients", type=int, default=0, help="gRPC clients the browsers share (0: up to 4)"
    )
    parser.add_argument("--out", default="tpcw-report", help="directory for the report")
    parser.add_argument("--seed", type=int, default=1)


@dataclass(frozen=True)
class Settings:
    address: str | None
    ltms: int
    processes: int
    data: str | None
    fsync: bool
    browsers: int
    items: int
    customers_per_browser: int
    mix: str
    seconds: float
    think_ms: float
    view_mode: str
    interval_ms: int
    clients: int
    out: str
    seed: int

    @property
    def scale(self) -> tpcw.Scale:
        return tpcw.Scale(self.browsers, self.items, self.customers_per_browser)


def settings_from(args: argparse.Namespace) -> Settings:
    """The run's settings, or InvalidArgument naming the first one that makes no sense."""
    ltms = int(getattr(args, "ltms", 3))
    settings = Settings(
        address=getattr(args, "address", None) or None,
        ltms=ltms,
        processes=checked_processes(ltms, getattr(args, "processes", None)),
        data=getattr(args, "data", None),
        fsync=not getattr(args, "no_fsync", False),
        browsers=int(args.browsers),
        items=int(args.items),
        customers_per_browser=int(
            getattr(args, "customers_per_browser", tpcw.CUSTOMERS_PER_BROWSER)
        ),
        mix=str(args.mix),
        seconds=float(args.seconds),
        think_ms=float(getattr(args, "think_ms", 0.0)),
        view_mode=str(getattr(args, "view_mode", "mixed")),
        interval_ms=int(getattr(args, "interval_ms", 1000)),
        clients=int(getattr(args, "clients", 0)),
        out=str(getattr(args, "out", "tpcw-report")),
        seed=int(getattr(args, "seed", 1)),
    )
    if settings.mix not in tpcw.MIXES:
        raise errors.InvalidArgument(
            f"unknown mix {settings.mix!r}: use one of {', '.join(tpcw.MIXES)}"
        )
    tpcw.view_modes(settings.view_mode)
    settings.scale.check()
    if not 0 < settings.seconds <= 24 * 3600:
        raise errors.InvalidArgument(f"seconds must be > 0 and at most a day; got {args.seconds}")
    if not 0 <= settings.think_ms <= 3_600_000:
        raise errors.InvalidArgument(f"think-ms must be >= 0; got {settings.think_ms}")
    if settings.address is None and not 1 <= settings.ltms <= MAX_LTMS:
        raise errors.InvalidArgument(f"ltms must be between 1 and {MAX_LTMS}; got {settings.ltms}")
    if not 10 <= settings.interval_ms <= 3_600_000:
        raise errors.InvalidArgument(
            f"interval-ms must be between 10 and 3,600,000; got {settings.interval_ms}"
        )
    if not 0 <= settings.clients <= settings.browsers:
        raise errors.InvalidArgument(
            f"clients must be between 0 and the browsers ({settings.browsers}); got "
            f"{settings.clients}"
        )
    out = Path(settings.out)
    if out.exists() and not out.is_dir():
        raise errors.InvalidArgument(f"--out {out} exists and is not a directory")
    return settings


def probe(address: str, client_options: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(tables, views) of the cluster, or Unavailable saying it cannot be reached."""
    try:
        with Client(address, timeout=10, **client_options) as client:
            return BulkClient(client).list()
    except errors.Unavailable as exc:
        raise errors.Unavailable(f"cannot reach an aggview cluster at {address}: {exc}") from None


# ----------------------------------------------------------------------------- the load


def _progress(shop: tpcw_interactions.Shop, elapsed: float, seconds: float, mix: str) -> Group:
    total = sum(t.done for t in shop.tallies.values())
    aborts = sum(t.condition_failures for t in shop.tallies.values())
    failed = sum(sum(t.errors.values()) for t in shop.tallies.values())
    rate = total / elapsed if elapsed > 0 else 0.0
    head = Text(
        f"TPC-W {mix} mix  {min(elapsed, seconds):5.1f}/{seconds:.0f} s  {total:,} interactions "
        f"({rate:,.1f}/s)  aborts {aborts}  retries {shop.retries}  errors {failed}"
    )
    table = Table(box=None, pad_edge=False)
    for column in ("interaction", "done", "/s", "committed", "aborts", "errors"):
        table.add_column(column, justify="left" if column == "interaction" else "right")
    for name, tally in shop.tallies.items():
        table.add_row(
            name,
            str(tally.done),
            f"{tally.done / elapsed:.1f}" if elapsed > 0 else "-",
            str(tally.committed),
            str(tally.condition_failures),
            str(sum(tally.errors.values())),
        )
    return Group(head, table)


async def drive(
    address: str,
    client_options: dict[str, Any],
    settings: Settings,
    scale: tpcw.Scale,
    views: dict[str, str],
    block: int,
    console: Console,
) -> tuple[tpcw_interactions.Shop, float, bool]:
    """Runs the browsers until ``seconds`` pass or SIGINT; returns the shop (its tallies),
    the seconds measured (until the last browser stopped) and whether it was interrupted."""
    count = settings.clients or min(settings.browsers, 4)
    clients = [AsyncClient(address, **client_options) for _ in range(count)]
    shop = tpcw_interactions.Shop(clients, scale, views, block)
    stop = asyncio.Event()
    interrupts = 0
    loop = asyncio.get_running_loop()

    def on_interrupt() -> None:
        nonlocal interrupts
        interrupts += 1
        stop.set()

    handled = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
        handled = True
    started = time.monotonic()
    deadline = started + settings.seconds
    browsers = [tpcw_interactions.Browser(shop, i, settings.seed) for i in range(settings.browsers)]
    tasks = [
        asyncio.create_task(
            tpcw_interactions.browse(b, settings.mix, stop, deadline, settings.think_ms)
        )
        for b in browsers
    ]
    stopped_at = deadline
    try:
        with Live(
            _progress(shop, 0.0, settings.seconds, settings.mix),
            console=console,
            refresh_per_second=4,
        ) as live:
            pending: set[asyncio.Task[None]] = set(tasks)
            while pending:
                _, pending = await asyncio.wait(pending, timeout=0.25)
                now = time.monotonic()
                live.update(_progress(shop, now - started, settings.seconds, settings.mix))
                if stop.is_set():
                    stopped_at = min(stopped_at, now)
                # in-flight interactions may finish, within a grace period (or a second ^C)
                if pending and (interrupts > 1 or now > stopped_at + GRACE_SECONDS):
                    for task in pending:
                        task.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    pending = set()
        console.line()
        elapsed = time.monotonic() - started
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)
        for client in clients:
            await client.close()
    return shop, elapsed, interrupts > 0


def interaction_rows(shop: tpcw_interactions.Shop, elapsed: float) -> list[dict[str, Any]]:
    """One row per interaction, then the whole mix: rates and latency percentiles (ms)."""
    rows = []
    every: list[float] = []
    for name, tally in shop.tallies.items():
        every.extend(tally.latencies)
        rows.append(_row(name, tally.done, tally, tally.latencies, elapsed))
    whole = tpcw_interactions.Tally(
        done=sum(t.done for t in shop.tallies.values()),
        committed=sum(t.committed for t in shop.tallies.values()),
        condition_failures=sum(t.condition_failures for t in shop.tallies.values()),
        gave_up=sum(t.gave_up for t in shop.tallies.values()),
        errors=sum((t.errors for t in shop.tallies.values()), Counter()),
    )
    rows.append(_row("all", whole.done, whole, every, elapsed, retries=shop.retries))
    return rows


def _row(
    name: str,
    count: int,
    tally: tpcw_interactions.Tally,
    latencies: list[float],
    elapsed: float,
    retries: int | None = None,
) -> dict[str, Any]:
    ms = {k: (v * 1000 if v is not None else None) for k, v in percentiles(latencies).items()}
    row: dict[str, Any] = {
        "interaction": name,
        "count": count,
        "per_s": count / elapsed if elapsed > 0 else 0.0,
        "committed": tally.committed,
        "aborts": tally.condition_failures,
        "gave_up": tally.gave_up,
        "errors": sum(tally.errors.values()),
        "error_kinds": ";".join(f"{k}={v}" for k, v in sorted(tally.errors.items())),
        "p50_ms": ms["p50"],
        "p95_ms": ms["p95"],
        "p99_ms": ms["p99"],
        "max_ms": ms["max"],
    }
    if retries is not None:
        row["retries"] = retries
    return row


def write_report(report: RunReport, results: dict[str, Any], out: Path) -> list[Path]:
    """JSON (settings, rows, results), CSV (rows), and bar plots of the interaction rates
    and the p50/p99 latencies."""
    paths = report.write(out)
    data = json.loads(paths[0].read_text())
    data["results"] = results
    paths[0].write_text(json.dumps(data, indent=2, default=str))
    measured = [r for r in report.rows if r["interaction"] != "all" and r["count"]]
    if measured:
        mix = report.settings.get("mix")
        paths.append(
            bar_plot(
                out / "tpcw-throughput.png",
                f"TPC-W {mix} mix: interactions/s per type",
                "interactions/s",
                {_short(r["interaction"]): r["per_s"] for r in measured},
            )
        )
        for key in ("p50_ms", "p99_ms"):
            paths.append(
                bar_plot(
                    out / f"tpcw-latency-{key[:3]}.png",
                    f"TPC-W {mix} mix: {key[:3]} latency per interaction",
                    "ms",
                    {_short(r["interaction"]): r[key] for r in measured},
                )
            )
    return paths


def _short(interaction: str) -> str:
    """Plot labels that do not overlap under their neighbours."""
    return {"Customer Registration": "Registration"}.get(interaction, interaction)


# ----------------------------------------------------------------------------- run


def run(args: argparse.Namespace, client_options: dict[str, Any]) -> RunReport:
    """The whole benchmark; see the module docstring. Returns the report it wrote."""
    settings = settings_from(args)
    options = {k: v for k, v in (client_options or {}).items() if v is not None}
    console = Console(width=None if sys.stdout.isatty() else 120)
    err = Console(stderr=True)

    def say(message: str) -> None:
        err.print(f"[dim]tpcw:[/] {message}")

    if settings.address is not None:
        probe(settings.address, options)
    report = RunReport("tpcw", settings=asdict(settings))
    results: dict[str, Any] = {"phases": {}}
    phases = results["phases"]
    out = Path(settings.out)
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="tpcw-"))
        stack.callback(shutil.rmtree, workdir, True)
        try:
            if settings.address is None:
                data = Path(settings.data) if settings.data else workdir / "cluster"
                cluster = LocalCluster(
                    data, ltms=settings.ltms, processes=settings.processes, fsync=settings.fsync
                )
                say(f"starting a local cluster with {settings.ltms} LTMs in {data}")
                stack.callback(cluster.stop)
                cluster.start()
                address, options = cluster.address, cluster.client_options()
            else:
                address = settings.address
            results["address"] = address
            results["local_cluster"] = settings.address is None
            _run(settings, address, options, workdir, report, results, console, say)
        except KeyboardInterrupt:  # before the browsers ran, or during the verification
            report.interrupted = True
            results.setdefault("verification", "skipped: interrupted")
            say("interrupted: writing what was measured")
        finally:
            phases["total_s"] = time.time() - report.started
            if report.rows or report.interrupted or results.get("measured_seconds"):
                paths = write_report(report, results, out)
                say("wrote " + ", ".join(str(p) for p in paths))
    if report.rows:
        console.print(report.table(REPORT_COLUMNS, title=_title(settings, results)))
        console.print(_summary(results))
    return report


def _run(
    settings: Settings,
    address: str,
    options: dict[str, Any],
    workdir: Path,
    report: RunReport,
    results: dict[str, Any],
    console: Console,
    say: Any,
) -> None:
    phases = results["phases"]
    scale = settings.scale
    wanted = tpcw.view_modes(settings.view_mode)
    with Client(address, **options) as client:
        tables, _ = BulkClient(client).list()
        meta = population_meta(client, tables)
        if meta is not None:
            check_population(meta, scale)  # refused before anything is written
        needs_spark = meta is None or bool(wanted)
        spark = None
        if needs_spark:
            from aggspark.session import spark_session

            started = time.time()
            say("starting Spark")
            spark = spark_session()
            phases["spark_s"] = time.time() - started
        started = time.time()
        tpcw.create_schema(client)
        prepare_views(
            client, spark, address, wanted, settings.interval_ms, meta is not None, options, say
        )
        phases["views_s"] = time.time() - started
        if meta is None:
            started = time.time()
            today = datetime.date.today()
            results["population"] = {"seed": settings.seed, "day": today.isoformat()}
            results["loaded"] = load_population(
                spark, address, scale, settings.seed, workdir, today, options, say
            )
            phases["load_s"] = time.time() - started
        results["scale"] = scale.meta()
        block = tpcw_interactions.claim_run_block(client)
        results["id_block"] = block
        before = snapshot(client)
    say(
        f"{settings.browsers} browsers, {settings.mix} mix, views {settings.view_mode} "
        f"for {settings.seconds:g} s"
    )
    shop, elapsed, interrupted = asyncio.run(
        drive(address, options, settings, scale, wanted, block, console)
    )
    report.interrupted = interrupted
    results["measured_seconds"] = elapsed
    report.rows.extend(interaction_rows(shop, elapsed))
    whole = report.rows[-1]
    results["interactions"] = whole["count"]
    results["interactions_per_s"] = whole["per_s"]
    results["aborts"] = whole["aborts"]
    results["retries"] = shop.retries
    results["written"] = {k: v for k, v in asdict(shop.written).items() if k != "stock"} | {
        "items_restocked_or_sold": len(shop.written.stock)
    }
    with Client(address, **options) as client:
        results["consistency"] = consistency(before, snapshot(client), shop.written)
    if interrupted:
        results["verification"] = "skipped: interrupted"
    elif wanted:
        started = time.time()
        say(f"verifying {', '.join(wanted)} against a Spark recomputation")
        results["verification"] = verify(spark, address, list(wanted), options)
        phases["verify_s"] = time.time() - started
    else:
        results["verification"] = "no views"


def _title(settings: Settings, results: dict[str, Any]) -> str:
    where = f"{settings.ltms} local LTMs" if results.get("local_cluster") else results["address"]
    return (
        f"TPC-W {settings.mix} mix, {settings.browsers} browsers, {settings.items:,} items, "
        f"views {settings.view_mode}, {where}"
    )


def _summary(results: dict[str, Any]) -> str:
    verification = results.get("verification")
    if isinstance(verification, list):
        verified = ", ".join(f"{v['view']} {'ok' if v['ok'] else 'DIFFERS'}" for v in verification)
    else:
        verified = str(verification)
    checks = results.get("consistency", {})
    return (
        f"{results.get('interactions', 0):,} interactions in "
        f"{results.get('measured_seconds', 0):.1f} s = "
        f"{results.get('interactions_per_s', 0):.1f}/s; aborts (refused stock conditions) "
        f"{results.get('aborts', 0)}; retries {results.get('retries', 0)}\n"
        f"rows written match the commits: {checks.get('ok')}; views: {verified}"
    )


def passed(report_dir: Path) -> bool:
    """Whether the run written into ``report_dir`` was consistent and its views verified."""
    results = json.loads((report_dir / "tpcw.json").read_text()).get("results", {})
    verification = results.get("verification")
    views_ok = not isinstance(verification, list) or all(v["ok"] for v in verification)
    return bool(results.get("consistency", {}).get("ok")) and views_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadgen.tpcw_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument("--ca", help="the cluster's CA certificate (a TLS cluster)")
    parser.add_argument("--token", help="a client token (a TLS cluster)")
    args = parser.parse_args(argv)
    try:
        report = run(args, {"ca": args.ca, "token": args.token})
    except errors.AggviewError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if report.interrupted:
        return 130
    return 0 if passed(Path(args.out)) else 1


if __name__ == "__main__":
    sys.exit(main())
