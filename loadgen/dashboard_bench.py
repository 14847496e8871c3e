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
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from aggclient import Client
from aggclient.client import AsyncClient
from agglauncher.cluster import PROCESSES_HELP, LocalCluster, checked_processes
from aggview import errors
from loadgen import dashboard
from loadgen.consistency import Ledger, Totals, judge
from loadgen.report import RunReport, line_figure, percentiles, save_figure

VIEW = "sql1"
MODES = ("none", "sync", "async", "cumulus")
MODE_USAGE = (
    "none, sync, async:<interval ms> (e.g. async:500) or "
    "cumulus:<epoch ms>[:<nodes>][:conservative][:grpc|:spark][:feed<ms>] (e.g. "
    "cumulus:100:2, cumulus:100:2:spark, cumulus:1000:2:feed50: changes fed every 50 ms, "
    "tentative reads measured too)"
)
HOSTS = ("local", "grpc", "spark")

if TYPE_CHECKING:  # matplotlib is imported only where a plot is drawn
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Mode:
    kind: str  # none, sync, async or cumulus
    interval_ms: int = 0  # async: the refresh interval; cumulus: the epoch
    nodes: int = 0  # cumulus: DW nodes
    speculation: str = ""  # cumulus: speculative or conservative
    host: str = "local"  # cumulus: where the DW nodes run (local, grpc or spark)
    feed_ms: int = 0  # cumulus: changes fed between epochs every feed_ms (tentative reads)

    @property
    def label(self) -> str:
        if self.kind == "async":
            return f"async {self.interval_ms} ms"
        if self.kind == "cumulus":
            how = "spec" if self.speculation == "speculative" else "cons"
            where = "" if self.host == "local" else f" {self.host}"
            feed = f" feed {self.feed_ms} ms" if self.feed_ms else ""
            return f"cumulus {how} {self.interval_ms} ms x{self.nodes}{where}{feed}"
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
        if len(rest) > (1 if kind == "async" else 5):
            raise errors.InvalidArgument(f"mode {text!r}: use {MODE_USAGE}")
        value = _number(text, rest[0] if rest else "500", "the interval", 1, 3_600_000)
        if kind == "async":
            return cls("async", value)
        nodes = _number(text, rest[1], "the nodes", 1, 64) if len(rest) > 1 else 2
        speculation, host, feed = "speculative", "local", 0
        for part in rest[2:]:
            if part in ("speculative", "conservative"):
                speculation = part
            elif part in HOSTS:
                host = part
            elif part.startswith("feed"):
                feed = _number(text, part.removeprefix("feed"), "the feed interval", 10, value)
            else:
                raise errors.InvalidArgument(
                    f"mode {text!r}: after the nodes come speculative or conservative, "
                    f"{', '.join(HOSTS)}, and feed<ms>; got {part!r}"
                )
        return cls("cumulus", value, nodes, speculation, host, feed)


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


@dataclass
class Point:
    committed: int
    events: int
    aborted: int
    latencies: list[float]
    seconds: float
    freshness: list[float]  # seconds from a probe's commit to a read that holds it
    probes: int  # probe transactions committed (one event each, beside the load's)
    reads: list[tuple[int, Totals]]  # whole-view reads: (consistent at, groups)
    # a cumulus view fed between epochs: the same for its tentative reads (their timestamp:
    # the last change fed, at which they should be exact)
    tentative_freshness: list[float] = field(default_factory=list)
    tentative_reads: list[tuple[int, Totals]] = field(default_factory=list)


async def measure(
    client: AsyncClient,
    k: int,
    seconds: float,
    clients: int,
    scale: dashboard.Scale,
    ids: Any,
    ledger: Ledger | None = None,
    hot: bool = False,
    tentative: bool = False,
) -> Point:
    """``clients`` closed loops committing transactions of k new events for ``seconds``; with
    a view (``ledger``: every commit is recorded there), one loop measuring how soon the view
    holds a commit and one reading it whole, for the consistency verdict; ``tentative``: both
    for a cumulus view's tentative reads too."""
    latencies: list[float] = []
    freshness: list[float] = []
    reads: list[tuple[int, Totals]] = []
    tentative_freshness: list[float] = []
    tentative_reads: list[tuple[int, Totals]] = []
    aborted = probed = 0
    deadline = time.perf_counter() + seconds

    def committed(ts: int, events: list[dict[str, Any]]) -> None:
        if ledger is not None:
            for event in events:
                ledger.add(ts, dashboard.group_of(event, scale), event["cost"])

    def failed(exc: errors.AggviewError) -> None:
        if ledger is not None and isinstance(exc, errors.Unavailable):
            ledger.unknown += 1  # it may have committed: the verdict says so

    async def reader() -> None:
        while time.perf_counter() < deadline:
            with contextlib.suppress(errors.AggviewError):
                rows = await client.view(VIEW)
                reads.append((rows.timestamp, dashboard.view_totals(rows)))
                if tentative:
                    rows = await client.view(VIEW, consistency="tentative")
                    tentative_reads.append((rows.timestamp, dashboard.view_totals(rows)))
            await asyncio.sleep(0.05)

    async def probes() -> None:
        nonlocal probed
        rng = random.Random(-1)
        while time.perf_counter() < deadline:
            try:
                async with client.transaction() as tx:
                    event = dashboard.event(rng, next(ids), scale, hot)
                    tx.insert("events", event)
            except errors.AggviewError as exc:
                failed(exc)  # an aborted probe measures nothing
                continue
            acknowledged = time.perf_counter()
            probed += 1
            committed(tx.timestamp, [event])
            shop = f"shop {event['shop_id']}"
            with contextlib.suppress(errors.AggviewError):
                if tentative:  # fed (its tentative read comes first), then committed
                    while (
                        await client.view(VIEW, {"shop": shop}, consistency="tentative")
                    ).timestamp < tx.timestamp:
                        await asyncio.sleep(0.005)
                    tentative_freshness.append(time.perf_counter() - acknowledged)
                while (await client.view(VIEW, {"shop": shop})).timestamp < tx.timestamp:
                    await asyncio.sleep(0.005)
                freshness.append(time.perf_counter() - acknowledged)
            await asyncio.sleep(0.02)

    async def loop(seed: int) -> None:
        nonlocal aborted
        rng = random.Random(seed)
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            events = [dashboard.event(rng, next(ids), scale, hot) for _ in range(k)]
            try:
                async with client.transaction() as tx:
                    for event in events:
                        tx.insert("events", event)
            except errors.AggviewError as exc:
                aborted += 1
                failed(exc)
                continue
            latencies.append(time.perf_counter() - started)
            committed(tx.timestamp, events)

    started = time.perf_counter()
    watchers = [probes(), reader()] if ledger is not None else []
    await asyncio.gather(*(loop(next(ids)) for _ in range(clients)), *watchers)
    elapsed = time.perf_counter() - started
    return Point(
        len(latencies),
        len(latencies) * k,
        aborted,
        latencies,
        elapsed,
        freshness,
        probed,
        reads,
        tentative_freshness,
        tentative_reads,
    )


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
                )
            )


def _ledger(address: str, options: dict[str, Any]) -> Ledger:
    """SQL-1 recomputed at a snapshot before the load: what the benchmark's events add to."""
    with Client(address, **options) as client, client.snapshot() as snapshot:
        return Ledger(dashboard.recompute_shop_category_cost(snapshot), snapshot.timestamp)


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
                with _cluster(config, mode, Path(tmp)) as cluster:
                    address = cluster.address if cluster is not None else config.address
                    assert address is not None
                    _setup(address, mode, config.scale, options)
                    ledger = _ledger(address, options) if mode.kind != "none" else None
                    for k in config.sizes:
                        if pressed.is_set():
                            raise KeyboardInterrupt
                        status.plain = f"{mode.label}: {k} events per transaction"

                        async def point(
                            k: int = k,
                            ledger: Ledger | None = ledger,
                            address: str = address,
                            tentative: bool = mode.feed_ms > 0,
                        ) -> Point:
                            async with AsyncClient(address, **options) as client:
                                return await measure(
                                    client,
                                    k,
                                    config.seconds,
                                    config.clients,
                                    config.scale,
                                    ids,
                                    ledger,
                                    hot=config.hot,
                                    tentative=tentative,
                                )

                        cpu_before = _server_cpu(cluster)
                        counts_before = _runtime_counts(address, mode, options)
                        p = asyncio.run(point())
                        cpu_after = _server_cpu(cluster)
                        runtime = runtime_costs(
                            counts_before, _runtime_counts(address, mode, options)
                        )
                        cpu_ms = None
                        if cpu_before is not None and cpu_after is not None:
                            events = max(p.events + p.probes, 1)
                            cpu_ms = (cpu_after - cpu_before) * 1000 / events
                        lat = percentiles([s * 1000 for s in p.latencies])
                        fresh = percentiles([s * 1000 for s in p.freshness])
                        ahead = percentiles([s * 1000 for s in p.tentative_freshness])
                        verdict = judge(ledger, p.reads) if ledger is not None else None
                        tentative = (
                            judge(ledger, p.tentative_reads)
                            if ledger is not None and p.tentative_reads
                            else None
                        )
                        report.add(
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
                            tentative_max_error=float(tentative.max_cost_error)
                            if tentative
                            else None,
                            probes=p.probes,
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
                    status.plain = f"{mode.label}: verifying"
                    ok = verify(address, mode, options)
                    for row in report.rows:
                        if row["mode"] == mode.label:
                            row["verified"] = ok
                    if not ok:
                        raise errors.FailedPrecondition(f"view {VIEW} ({mode.label}) drifted")
        report.interrupted = pressed.is_set()
    except KeyboardInterrupt:
        report.interrupted = True
    return report


def ratios(report: RunReport) -> list[dict[str, Any]]:
    """Throughput of each mode over no view, per update size (measured in this run)."""
    base = {r["k"]: r["tx_per_s"] for r in report.rows if r["mode"] == "none"}
    out = []
    for row in report.rows:
        if row["mode"] != "none" and base.get(row["k"]):
            out.append(
                {"mode": row["mode"], "k": row["k"], "ratio": row["tx_per_s"] / base[row["k"]]}
            )
    return out


# a plot per column, a line per mode (modes without the column left out)
PER_MODE_PLOTS = (
    ("fresh_p50_ms", "Freshness: from a commit to the first read holding it (p50)", "ms"),
    ("cpu_ms_per_event", "Server CPU per event", "ms"),
    ("messages_per_1k", "Cumulus runtime messages per 1,000 updates", "messages"),
    ("corrective_per_1k", "Cumulus corrective updates per 1,000 updates", "corrective updates"),
)
TENTATIVE_PLOT = "dashboard_tentative_fresh_p50_ms.png"
ASYNC_PLOT = "dashboard_async_interval.png"
MIN_INTERVALS = 3  # fewer async intervals draw no curve worth a plot

# What each file shows and how to read it, for the report's README.md (a file's entry is
# written when the run wrote the file).
GUIDE = {
    "dashboard.json": "Every measured point (one row per mode and update size) with the "
    "run's settings and machine. `dashboard.csv`: the same rows as a table.",
    "dashboard_throughput_vs_update_size.png": "Committed transactions per second (y) for "
    "each update size, the events one transaction inserts (x), one line per mode: `none` "
    "(no view), `sync` (the view updated in each transaction), `async N ms` (refreshed every "
    "N ms), `cumulus ...` (maintained by a Cumulus runtime in epochs). Higher is better; the "
    "gap between `none` and a mode is what maintaining that view costs writers.",
    ASYNC_PLOT: "Throughput of async views (y) against their refresh interval (x), one line "
    "per update size: how much a longer interval (staler reads) gives back to writers. Drawn "
    f"only when {MIN_INTERVALS} or more intervals were measured.",
    "dashboard_fresh_p50_ms.png": "Freshness (y, median ms): from a probe transaction's "
    "acknowledgment to the first read of the view that holds it, per update size (x). Lower "
    "is fresher: sync is fresh at once, an async view waits for its next refresh, a Cumulus "
    "view for its next committed epoch.",
    TENTATIVE_PLOT: "For each Cumulus view fed between epochs: the freshness (median ms) of "
    "its tentative reads (which hold a commit once its change is fed to the runtime) beside "
    "that of its committed reads (once the epoch holding it commits). The tentative line "
    "should lie below the committed one; see the note below on this run.",
    "dashboard_cpu_ms_per_event.png": "CPU of every server process (ms) per event committed; "
    "only for local clusters (`aggview demo` runs on one cluster of its own, whose "
    "processes also serve its other steps, so it draws none).",
    "dashboard_messages_per_1k.png": "Messages the Cumulus runtime sent per 1,000 updates it "
    "was fed (y from 0): its network cost per update, per update size (x).",
    "dashboard_corrective_per_1k.png": "Corrective updates per 1,000 updates: speculation "
    "that had to be undone. 0 means every speculative update held.",
    "dashboard_latency_p99.png": "The 99th percentile of a transaction's latency (ms), from "
    "its start to its acknowledgment, per update size (x), one line per mode.",
}


def _per_mode(
    rows: list[dict[str, Any]], column: str, suffix: str = ""
) -> dict[str, list[tuple[float, float]]]:
    """A line per mode of ``column`` against the update size (modes without it left out)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.get(column) is not None:
            series.setdefault(row["mode"] + suffix, []).append((row["k"], row[column]))
    return series


def plots(report: RunReport) -> dict[str, Figure]:
    """Every plot the report's rows make, by the file name it is written to."""
    drawn = {
        "dashboard_throughput_vs_update_size.png": line_figure(
            "Throughput vs update size",
            "events per transaction",
            "transactions/s",
            _per_mode(report.rows, "tx_per_s"),
            logx=True,
        )
    }
    intervals: dict[str, list[tuple[float, float]]] = {}
    for row in report.rows:
        if row["mode"].startswith("async"):
            interval = float(row["mode"].split()[1])
            intervals.setdefault(f"k={row['k']}", []).append((interval, row["tx_per_s"]))
    if len({x for points in intervals.values() for x, _ in points}) >= MIN_INTERVALS:
        drawn[ASYNC_PLOT] = line_figure(
            "Async throughput vs refresh interval",
            "refresh interval (ms)",
            "transactions/s",
            intervals,
            logx=True,
        )
    for column, title, unit in PER_MODE_PLOTS:
        if series := _per_mode(report.rows, column):
            drawn[f"dashboard_{column}.png"] = line_figure(
                title, "events per transaction", unit, series, logx=True
            )
    fed = [row for row in report.rows if row.get("tentative_fresh_p50_ms") is not None]
    if fed:
        series = {
            **_per_mode(fed, "tentative_fresh_p50_ms", " tentative"),
            **_per_mode(fed, "fresh_p50_ms", " committed"),
        }
        drawn[TENTATIVE_PLOT] = line_figure(
            "Cumulus freshness: tentative against committed reads (p50)",
            "events per transaction",
            "ms",
            dict(sorted(series.items())),
            logx=True,
        )
    drawn["dashboard_latency_p99.png"] = line_figure(
        "p99 latency vs update size",
        "events per transaction",
        "ms",
        _per_mode(report.rows, "p99_ms", " p99"),
        logx=True,
    )
    return drawn


def write_outputs(report: RunReport, out: Path) -> list[Path]:
    """The report's JSON and CSV, its plots, and a README.md saying how to read them."""
    written = report.write(out)
    written += [save_figure(figure, out / name) for name, figure in plots(report).items()]
    written.append(write_guide(report, out, written))
    return written


def write_guide(report: RunReport, out: Path, written: list[Path]) -> Path:
    """``README.md`` beside the plots: what the run measured, what each file shows and how
    to read it, and whether Cumulus's tentative reads were fresher (and if not, why)."""
    settings = report.settings
    lines = [
        "# The dashboard benchmark",
        "",
        f"Modes {', '.join(settings.get('modes', []))}; update sizes (events per "
        f"transaction) {', '.join(map(str, settings.get('sizes', [])))}; "
        f"{settings.get('clients')} clients committing for {settings.get('seconds')} s per "
        "point, while one more client probes the view's freshness and another reads it whole "
        "(`consistent`: the share of those reads that were exact at their timestamp).",
        "",
    ]
    if report.interrupted:
        lines += ["**Interrupted**: the files hold what was measured until then.", ""]
    names = {path.name for path in written}
    for name, text in GUIDE.items():
        if name in names:
            lines += [f"- `{name}`: {text}", ""]
    lines += tentative_note(report)
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


FRESHER = 2.0  # how many times sooner tentative reads must hold a commit to look fresher


def tentative_note(report: RunReport) -> list[str]:
    """Per Cumulus mode fed between epochs: its tentative and committed freshness, and when
    the tentative reads were not clearly fresher, what in this run kept them close."""
    rows = report.rows
    modes = list(dict.fromkeys(r["mode"] for r in rows if r.get("tentative_fresh_p50_ms")))
    lines = ["## Cumulus: tentative against committed reads", ""] if modes else []
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode and r.get("fresh_p50_ms")]
        measured = "; ".join(
            f"{r['k']} event{'' if r['k'] == 1 else 's'}: {r['tentative_fresh_p50_ms']:.0f} ms "
            f"against {r['fresh_p50_ms']:.0f} ms"
            for r in mine
        )
        if all(r["fresh_p50_ms"] >= FRESHER * r["tentative_fresh_p50_ms"] for r in mine):
            lines += [
                f"**{mode}**: tentative reads held a commit at least {FRESHER:g} times sooner "
                f"than committed reads (p50, tentative against committed: {measured}).",
                "",
            ]
            continue
        lines += [
            f"**{mode}**: tentative reads were not clearly fresher in this run (p50, tentative "
            f"against committed: {measured}). A tentative read holds a commit once its change "
            "is fed to the runtime (every feed interval) and applied by the DW nodes; a "
            "committed read once the epoch that holds it commits. Here:",
            "",
            *(f"- {reason}" for reason in _close_because(report, mine)),
            "",
            "With fewer writers and a longer run they come apart, e.g. `aggview bench "
            "dashboard --modes cumulus:500:2:feed50 --clients 1 --seconds 5`.",
            "",
        ]
    return lines


def _close_because(report: RunReport, rows: list[dict[str, Any]]) -> list[str]:
    """What in a run keeps a Cumulus view's tentative reads about as stale as committed ones."""
    epoch, feed = rows[0].get("interval_ms"), rows[0].get("feed_ms")
    slowest = max(r["fresh_p50_ms"] for r in rows)
    probes = min(r["probes"] for r in rows)
    reasons = []
    if epoch and slowest > 2 * epoch:
        reasons.append(
            f"committed reads waited up to {slowest:.0f} ms, over twice the {epoch} ms epoch: "
            f"the runtime was behind the load of {report.settings.get('clients')} clients, "
            "and a tentative read waits for that same runtime to apply what it is fed, so "
            "both waited for it to catch up;"
        )
    if epoch and feed and 2 * feed > epoch:
        reasons.append(f"the feed interval ({feed} ms) is close to the epoch ({epoch} ms);")
    if probes < 10:
        reasons.append(
            f"a point had only {probes} probe(s) (each waits for its commit to be read), so "
            "the medians are rough;"
        )
    return reasons or ["an epoch often closed soon after the probe's commit;"]


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
