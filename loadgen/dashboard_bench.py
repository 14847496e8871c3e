"""The thesis's dashboard micro-benchmark (seed 004, §6.3, Figures 6.2 and 6.3): transactions of
k events into the dashboard schema with no view, with SQL-1 (cost per shop and category) as a
sync view, as an async view refreshed every 50, 500 or 5,000 ms, and as a Cumulus view.

Freshness is measured with probe transactions beside the load: one client commits an event,
then reads the view until the timestamp a read is consistent at reaches the probe's commit
(sync: at once; async: the next refresh; cumulus: the next committed epoch), every 20 ms.
Consistency: one more client reads the whole view every 50 ms, and after the load each read is
judged against the exact answer at its timestamp, from what the benchmark committed
(``loadgen.consistency``): ``consistent`` is the share of exact reads, ``max_error`` the
largest cost difference of a group in the others. ``cpu_ms_per_event``: the CPU every server
process of a local cluster used during the point (its view maintenance included: a cumulus
view's runtime runs in process 0), per event committed.

Each mode runs on a cluster of its own with the same static data (shops, products,
categories), so every mode starts from the same state; against a running cluster
(``--address``) the modes run one after another on it. For every update size k, ``--clients``
closed-loop clients each commit transactions of k new events for ``--seconds``. After a mode the
view is compared with SQL-1 recomputed from the base tables (an async view after a refresh).

    aggview bench dashboard                         # about 6 minutes on 2 cores
    aggview bench dashboard --sizes 1 10 --modes none sync async:500 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from aggclient import Client
from aggclient.client import AsyncClient
from agglauncher.cluster import PROCESSES_HELP, LocalCluster, checked_processes
from aggview import errors
from loadgen import dashboard
from loadgen.consistency import Ledger, judge
from loadgen.dashboard_load import VIEW, Point, measure
from loadgen.dashboard_report import ratios, write_outputs
from loadgen.report import RunReport, percentiles

MODES = ("none", "sync", "async", "cumulus")
MODE_USAGE = (
    "none, sync, async:<interval ms> (e.g. async:500) or "
    "cumulus:<epoch ms>[:<nodes>][:conservative][:grpc|:spark][:feed<ms>][:depth<N>] (e.g. "
    "cumulus:100:2, cumulus:100:2:spark, cumulus:1000:2:feed50: changes fed every 50 ms, "
    "tentative reads measured too; cumulus:100:1:depth1: the M3 program at depth 1)"
)
HOSTS = ("local", "grpc", "spark")


@dataclass(frozen=True)
class Mode:
    kind: str  # none, sync, async or cumulus
    interval_ms: int = 0  # async: the refresh interval; cumulus: the epoch
    nodes: int = 0  # cumulus: DW nodes
    speculation: str = ""  # cumulus: speculative or conservative
    host: str = "local"  # cumulus: where the DW nodes run (local, grpc or spark)
    feed_ms: int = 0  # cumulus: changes fed between epochs every feed_ms (tentative reads)
    depth: int = 0  # cumulus: its M3 program's depth (0: every level)

    @property
    def label(self) -> str:
        if self.kind == "async":
            return f"async {self.interval_ms} ms"
        if self.kind == "cumulus":
            how = "spec" if self.speculation == "speculative" else "cons"
            where = "" if self.host == "local" else f" {self.host}"
            feed = f" feed {self.feed_ms} ms" if self.feed_ms else ""
            depth = f" depth {self.depth}" if self.depth else ""
            return f"cumulus {how} {self.interval_ms} ms x{self.nodes}{where}{feed}{depth}"
        return self.kind

    @classmethod
    def parse(cls, text: str) -> Mode:
        kind, *rest = text.split(":")
        if kind not in MODES:
            raise errors.InvalidArgument(f"unknown mode {text!r}: use {MODE_USAGE}")
        if kind in ("none", "sync"):
            if rest:
                raise errors.InvalidArgument(f"mode {kind} takes no interval; got {text!r}")
            return cls(kind)
        if len(rest) > (1 if kind == "async" else 6):
            raise errors.InvalidArgument(f"mode {text!r}: use {MODE_USAGE}")
        value = _number(text, rest[0] if rest else "500", "the interval", 1, 3_600_000)
        if kind == "async":
            return cls("async", value)
        nodes = _number(text, rest[1], "the nodes", 1, 64) if len(rest) > 1 else 2
        speculation, host, feed, depth = "speculative", "local", 0, 0
        for part in rest[2:]:
            if part in ("speculative", "conservative"):
                speculation = part
            elif part in HOSTS:
                host = part
            elif part.startswith("feed"):
                feed = _number(text, part.removeprefix("feed"), "the feed interval", 10, value)
            elif part.startswith("depth"):
                depth = _number(text, part.removeprefix("depth"), "the depth", 1, 16)
            else:
                raise errors.InvalidArgument(
                    f"mode {text!r}: after the nodes come speculative or conservative, "
                    f"{', '.join(HOSTS)}, feed<ms> and depth<N>; got {part!r}"
                )
        return cls("cumulus", value, nodes, speculation, host, feed, depth)


def _number(text: str, part: str, what: str, low: int, high: int) -> int:
    try:
        value = int(part)
    except ValueError:
        raise errors.InvalidArgument(f"mode {text!r}: {what} must be an integer") from None
    if not low <= value <= high:
        raise errors.InvalidArgument(f"mode {text!r}: {what} must be {low}..{high}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="a running cluster (default: a local one per mode)")
    parser.add_argument("--ltms", type=int, default=3, help="LTMs of the local clusters")
    parser.add_argument("--processes", type=int, default=None, help=PROCESSES_HELP)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["none", "sync", "async:50", "async:500", "async:5000"],
        help=MODE_USAGE,
    )
    parser.add_argument(
        "--sizes", nargs="+", type=int, default=[1, 10, 50, 150], help="events per transaction"
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per point")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--shops", type=int, default=50)
    parser.add_argument("--products", type=int, default=5000)
    parser.add_argument("--categories", type=int, default=20)
    parser.add_argument("--out", default="aggview-report", help="where reports and plots go")
    parser.add_argument(
        "--hot", action="store_true", help="every event to one product: one group takes it all"
    )
    parser.add_argument(
        "--moves",
        type=float,
        default=0.0,
        help="share of the clients' transactions that move a product to another category "
        "instead of adding events (default: %(default)s; in cumulus mode these are what make "
        "corrective updates)",
    )
    parser.add_argument(
        "--renames",
        type=float,
        default=0.0,
        help="share of the clients' transactions that rename a category (default: "
        "%(default)s): a few rows every event reads",
    )


@dataclass
class Settings:
    modes: list[Mode]
    sizes: list[int]
    seconds: float
    clients: int
    scale: dashboard.Scale
    ltms: int
    address: str | None
    out: Path
    hot: bool = False  # every event into one group
    processes: int = 0  # the local clusters' layout, as ``aggview start --processes``
    moves: float = 0.0  # share of transactions that move a product (``measure``'s ``moves``)
    renames: float = 0.0  # share of transactions that rename a category


def settings(args: argparse.Namespace) -> Settings:
    """Every argument checked before any load starts."""
    modes = [Mode.parse(m) for m in args.modes]
    if not modes:
        raise errors.InvalidArgument("give at least one mode")
    for k in args.sizes:
        if not 1 <= k <= 1000:
            raise errors.InvalidArgument(f"update size {k} must be between 1 and 1000 events")
    if not 0 < args.seconds <= 3600:
        raise errors.InvalidArgument(f"--seconds must be in (0, 3600]; got {args.seconds}")
    if not 1 <= args.clients <= 1000:
        raise errors.InvalidArgument(f"--clients must be between 1 and 1000; got {args.clients}")
    if args.shops < 1 or args.categories < 1 or args.products < args.shops:
        raise errors.InvalidArgument(
            "need at least 1 shop and 1 category, and at least as many products as shops"
        )
    if not (0 <= args.moves and 0 <= args.renames and args.moves + args.renames < 1):
        raise errors.InvalidArgument(
            f"--moves and --renames must be at least 0 and less than 1 together; got "
            f"{args.moves} and {args.renames}"
        )
    if not 1 <= args.ltms <= 64:
        raise errors.InvalidArgument(f"--ltms must be between 1 and 64; got {args.ltms}")
    return Settings(
        modes,
        sorted(set(args.sizes)),
        args.seconds,
        args.clients,
        dashboard.Scale(args.shops, args.products, args.categories),
        args.ltms,
        args.address,
        Path(args.out),
        args.hot,
        checked_processes(args.ltms, getattr(args, "processes", None)),
        args.moves,
        args.renames,
    )


def check_reachable(address: str, options: dict[str, Any]) -> None:
    try:
        with Client(address, timeout=5, **options) as client:
            client.sql("SELECT * FROM no_such_table_probe LIMIT 1")
    except errors.UnknownTable:
        return  # it answered
    except errors.AggviewError as exc:
        if isinstance(exc, errors.Unavailable):
            raise errors.Unavailable(f"cluster at {address} is not reachable: {exc}") from None


def _setup(address: str, mode: Mode, scale: dashboard.Scale, options: dict[str, Any]) -> None:
    with Client(address, **options) as client:
        existing = {r["name"] for r in _tables(client)}
        if "events" not in existing:
            dashboard.create_schema(client)
            dashboard.populate(client, scale)
        client.sql(f"DROP MATERIALIZED VIEW IF EXISTS {VIEW}")
        if mode.kind != "none":
            client.sql(
                dashboard.view_ddl(
                    VIEW,
                    dashboard.SHOP_CATEGORY_COST,
                    mode.kind,
                    mode.interval_ms,
                    mode.nodes,
                    mode.speculation,
                    mode.host,
                    mode.feed_ms,
                    mode.depth,
                )
            )


def _ledger(address: str, options: dict[str, Any]) -> Ledger:
    """SQL-1 recomputed at a snapshot before the load: what the benchmark's events add to."""
    with Client(address, **options) as client, client.snapshot() as snapshot:
        return dashboard.ledger_at(snapshot)


def _tables(client: Client) -> list[dict[str, Any]]:
    from aggclient.bulk_client import BulkClient

    return [{"name": name} for name in BulkClient(client).list()[0]]


def _runtime_counts(address: str, mode: Mode, options: dict[str, Any]) -> dict[str, Any] | None:
    """A cumulus view's runtime counts (``CumulusView.counts``), from process 0."""
    if mode.kind != "cumulus":
        return None
    from aggclient.bulk_client import BulkClient

    with Client(address, **options) as client:
        return BulkClient(client).describe(VIEW).runtime


def runtime_costs(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> dict[str, float | int | None]:
    """Messages and corrective updates per 1,000 updates the runtime was fed between two
    counts, the CPU process 0 spent driving the runtime per update (on the local host, the
    runtime's whole cost: the rest of ``cpu_ms_per_event`` is the cluster's), and its log
    entries at the second (None where there is no runtime)."""
    out: dict[str, float | int | None] = {
        "messages_per_1k": None,
        "corrective_per_1k": None,
        "log_entries": None,
        "runtime_cpu_ms_per_update": None,
    }
    if not before or not after:
        return out
    updates = after["updates"] - before["updates"]
    if updates > 0:
        sent = sum(after["messages"].values()) - sum(before["messages"].values())
        out["messages_per_1k"] = 1000 * sent / updates
        out["corrective_per_1k"] = 1000 * (after["corrective"] - before["corrective"]) / updates
        cpu = after.get("cpu_seconds", 0.0) - before.get("cpu_seconds", 0.0)
        out["runtime_cpu_ms_per_update"] = 1000 * cpu / updates
    out["log_entries"] = sum(after["logs"].values())
    return out


def verify(address: str, mode: Mode, options: dict[str, Any]) -> bool:
    if mode.kind == "none":
        return True
    with Client(address, **options) as client:
        if mode.kind in ("async", "cumulus"):
            client.refresh(VIEW)
        return dashboard.view_totals(client.view(VIEW)) == dashboard.recompute_shop_category_cost(
            client
        )


@contextlib.contextmanager
def _cluster(config: Settings, mode: Mode, base: Path) -> Iterator[LocalCluster | None]:
    """A local cluster for the mode, or None for the running one at ``config.address``."""
    if config.address:
        yield None
        return
    cluster = LocalCluster(
        base / mode.label.replace(" ", "_"), ltms=config.ltms, processes=config.processes
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        cluster.kill()


def _server_cpu(cluster: LocalCluster | None) -> float | None:
    """CPU seconds every server of a local cluster has used (None: a running cluster's
    servers are not ours to look at)."""
    if cluster is None:
        return None
    return sum(server.cpu_seconds() for server in cluster.servers)


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """Ctrl-C raises KeyboardInterrupt as usual and is also remembered: asyncio.run's own
    handler turns it into a cancellation, which a point's clients may absorb (a run then went
    on as if never interrupted, under load)."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        pressed.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def run_benchmark(
    config: Settings, options: dict[str, Any], console: Console | None = None
) -> RunReport:
    """Every mode and size; the report holds what was measured even if interrupted."""
    console = console or Console()
    report = RunReport(
        "dashboard",
        settings={
            "modes": [m.label for m in config.modes],
            "sizes": config.sizes,
            "seconds": config.seconds,
            "clients": config.clients,
            "scale": vars(config.scale),
            "ltms": config.ltms,
            "processes": config.processes,
            "address": config.address,
            "hot": config.hot,
            "moves": config.moves,
            "renames": config.renames,
        },
    )
    ids = itertools.count(1_000_000 * int(time.time()) % (10**15))
    status = Text("starting")
    try:
        with (
            _ctrl_c() as pressed,
            tempfile.TemporaryDirectory(prefix="aggview-bench-") as tmp,
            Live(status, console=console, transient=True),
        ):
            for mode in config.modes:
                if pressed.is_set():
                    raise KeyboardInterrupt
                status.plain = f"{mode.label}: setting up"
                mode_run = _ModeRun(config, mode, options, ids, status, pressed)
                mode_run.measure_sizes(report, Path(tmp))
        report.interrupted = pressed.is_set()
    except KeyboardInterrupt:
        report.interrupted = True
    return report


@dataclass
class _ModeRun:
    """One mode of a benchmark run: its cluster, a point per update size, the check after."""

    config: Settings
    mode: Mode
    options: dict[str, Any]
    ids: Iterator[int]
    status: Text  # the live display's line
    pressed: threading.Event  # Ctrl-C

    def measure_sizes(self, report: RunReport, tmp: Path) -> None:
        """A row per update size into ``report``, then the view verified (every row of the
        mode says whether it was); a view that drifted fails the run."""
        config, mode, options = self.config, self.mode, self.options
        with _cluster(config, mode, tmp) as cluster:
            address = cluster.address if cluster is not None else config.address
            assert address is not None
            _setup(address, mode, config.scale, options)
            ledger = _ledger(address, options) if mode.kind != "none" else None
            for k in config.sizes:
                if self.pressed.is_set():
                    raise KeyboardInterrupt
                self.status.plain = f"{mode.label}: {k} events per transaction"
                report.add(**self.point_row(cluster, address, k, ledger))
            self.status.plain = f"{mode.label}: verifying"
            ok = verify(address, mode, options)
            for row in report.rows:
                if row["mode"] == mode.label:
                    row["verified"] = ok
            if not ok:
                raise errors.FailedPrecondition(f"view {VIEW} ({mode.label}) drifted")

    def point_row(
        self, cluster: LocalCluster | None, address: str, k: int, ledger: Ledger | None
    ) -> dict[str, Any]:
        """Measures one point, with the servers' CPU and the runtime's counts around it."""
        mode, options = self.mode, self.options
        cpu_before = _server_cpu(cluster)
        counts_before = _runtime_counts(address, mode, options)
        p = asyncio.run(self.point(address, k, ledger))
        cpu_after = _server_cpu(cluster)
        runtime = runtime_costs(counts_before, _runtime_counts(address, mode, options))
        cpu_ms = None
        if cpu_before is not None and cpu_after is not None:
            events = max(p.events + p.probes, 1)
            cpu_ms = (cpu_after - cpu_before) * 1000 / events
        return _row(mode, k, p, ledger, cpu_ms, runtime)

    async def point(self, address: str, k: int, ledger: Ledger | None) -> Point:
        config = self.config
        async with AsyncClient(address, **self.options) as client:
            return await measure(
                client,
                k,
                config.seconds,
                config.clients,
                config.scale,
                self.ids,
                ledger,
                hot=config.hot,
                tentative=self.mode.feed_ms > 0,
                moves=config.moves,
                renames=config.renames,
            )


def _row(
    mode: Mode,
    k: int,
    p: Point,
    ledger: Ledger | None,
    cpu_ms: float | None,
    runtime: dict[str, float | int | None],
) -> dict[str, Any]:
    """A point's row of the report: throughput, latency, freshness, the consistency verdicts
    of its reads, and its costs."""
    lat = percentiles([s * 1000 for s in p.latencies])
    fresh = percentiles([s * 1000 for s in p.freshness])
    ahead = percentiles([s * 1000 for s in p.tentative_freshness])
    verdict = judge(ledger, p.reads) if ledger is not None else None
    tentative = (
        judge(ledger, p.tentative_reads) if ledger is not None and p.tentative_reads else None
    )
    return dict(
        mode=mode.label,
        k=k,
        tx_per_s=p.committed / p.seconds,
        events_per_s=p.events / p.seconds,
        committed=p.committed,
        aborted=p.aborted,
        p50_ms=lat["p50"],
        p99_ms=lat["p99"],
        fresh_p50_ms=fresh["p50"],
        fresh_p99_ms=fresh["p99"],
        tentative_fresh_p50_ms=ahead["p50"],
        tentative_consistent=tentative.share if tentative else None,
        tentative_max_error=float(tentative.max_cost_error) if tentative else None,
        probes=p.probes,
        moved=p.moved,
        reads=verdict.reads if verdict else 0,
        consistent=verdict.share if verdict else None,
        max_error=float(verdict.max_cost_error) if verdict else None,
        unknown=ledger.unknown if ledger else 0,
        cpu_ms_per_event=cpu_ms,
        interval_ms=mode.interval_ms or None,
        feed_ms=mode.feed_ms or None,
        **runtime,
        verified=None,
    )


def run(args: argparse.Namespace, options: dict[str, Any]) -> None:
    config = settings(args)
    if config.address:
        check_reachable(config.address, options)
    console = Console()
    report = run_benchmark(config, options, console)
    written = write_outputs(report, config.out)
    report.print(
        [
            "mode",
            "k",
            "tx_per_s",
            "events_per_s",
            "aborted",
            "p50_ms",
            "p99_ms",
            "fresh_p50_ms",
            "fresh_p99_ms",
            "tentative_fresh_p50_ms",
            "consistent",
            "tentative_consistent",
            "cpu_ms_per_event",
            "runtime_cpu_ms_per_update",
            "messages_per_1k",
            "corrective_per_1k",
            "verified",
        ],
        console,
    )
    for r in ratios(report):
        console.print(f"{r['mode']} / none at k={r['k']}: {r['ratio']:.2f}")
    console.print("wrote " + ", ".join(str(p) for p in written))
    if report.interrupted:
        console.print("[yellow]interrupted[/]: the report holds what was measured")
