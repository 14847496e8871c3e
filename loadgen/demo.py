"""``aggview demo``, the main job: a local cluster on the embedded store shows, in about three
minutes, what aggview is for and checks every claim it prints.

1. conditional transfers from concurrent clients while an LTM is killed and restarted: nothing
   acknowledged is lost, nothing is half-applied;
2. the thesis's dashboard: events bulk-loaded by Spark at one timestamp, SQL-1 (cost per shop
   and category) created as a sync view and the cost per category as an async view, both
   computed by Spark SQL while writers go on;
3. a mixed workload of event inserts, corrections and deletes, with view reads meanwhile;
4. every view recomputed by Spark and compared group by group;
5. a short dashboard benchmark (no view, sync, async) whose report and plots are written.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from loadgen import dashboard, dashboard_bench, dashboard_report, transfers
from loadgen.report import print_whole

ACCOUNTS = 60
CLIENTS = 8


@dataclass
class DemoSize:
    """How much the demo does; the default took 146 s on a quiet 2-core machine."""

    transfer_seconds: float = 3.0
    events: int = 10_000
    workload_seconds: float = 3.0
    bench_seconds: float = 1.0
    bench_sizes: tuple[int, ...] = (1, 10, 50)
    scale: dashboard.Scale = field(
        default_factory=lambda: dashboard.Scale(shops=20, products=1000, categories=10)
    )


def quick_size() -> DemoSize:
    """``aggview demo --quick``: every step at a small size (a few minutes), the form CI runs
    from a fresh install."""
    return DemoSize(
        transfer_seconds=2.0,
        events=3000,
        workload_seconds=2.0,
        bench_seconds=0.5,
        bench_sizes=(1, 5),
        scale=dashboard.Scale(shops=5, products=50, categories=4),
    )


def run_demo(
    data: Path, *, ltms: int = 3, out: Path | None = None, size: DemoSize | None = None
) -> None:
    size = size or DemoSize()
    out = out or Path("aggview-report")
    console = Console()
    started = time.monotonic()
    with LocalCluster(data, ltms=ltms, checkpoint_interval=1.0) as cluster:  # as aggview start
        console.print(
            f"[bold]aggview demo[/]: {ltms} partitions in {len(cluster.servers)} processes "
            "that each serve a share and coordinate transactions, on the embedded store"
        )
        console.print(f"cluster listening on {cluster.address} (data in {data})")
        run_transfers(cluster, console, size.transfer_seconds)
        run_dashboard(cluster, console, size)
        run_bench(cluster.address, console, size, out)
    console.print(f"cluster stopped; the demo took {time.monotonic() - started:.0f} s")


def run_transfers(cluster: LocalCluster, console: Console, seconds: float) -> None:
    with Client(cluster.address) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
    victim = cluster.servers[-1]  # a process that hosts partitions and coordinates
    console.print(
        f"\n[bold]1. transactions[/]: {CLIENTS} clients run conditional transfers between "
        f"{ACCOUNTS} accounts for {seconds:g} s; {victim.role} is killed with SIGKILL "
        "half-way and restarted"
    )
    with transfers.running(
        cluster.address, "accounts", "ledger", ACCOUNTS, clients=CLIENTS
    ) as outcomes:
        began = time.monotonic()
        time.sleep(seconds / 2)
        victim.kill()
        killed_at = len(outcomes.committed)
        victim.start()
        time.sleep(seconds / 2)
    elapsed = time.monotonic() - began
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)
        balances = client.scan("accounts")
    table = Table(title="transfers")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("committed", str(len(outcomes.committed)))
    table.add_row("committed before the crash", str(killed_at))
    table.add_row("refused by their condition", str(outcomes.condition_failed))
    table.add_row(f"failed while {victim.role} was down", str(outcomes.unknown))
    table.add_row("timestamp-order retries", str(outcomes.retries))
    table.add_row("committed per second", f"{len(outcomes.committed) / elapsed:.0f}")
    table.add_row("total balance (snapshot)", str(sum(r["balance"] for r in balances)))
    print_whole(console, table)
    console.print(
        "[green]verified[/]: every acknowledged transfer is in the ledger, balances agree "
        "with the ledger, the total is unchanged and no balance is negative"
    )


def run_dashboard(cluster: LocalCluster, console: Console, size: DemoSize) -> None:
    from aggspark import jobs
    from aggspark.progress import spark_status
    from aggspark.session import spark_log, spark_session

    address, scale = cluster.address, size.scale
    console.print(
        f"\n[bold]2. the dashboard[/]: {scale.shops} shops, {scale.products} products, "
        f"{scale.categories} categories; {size.events} events bulk-loaded with Spark"
    )
    with Client(address) as client:
        dashboard.create_schema(client)
        dashboard.populate(client, scale)
    with console.status("starting Spark"):
        spark = spark_session()
    console.print(f"Spark's own output goes to {spark_log()}")
    events_csv = cluster.data / "events.csv"
    dashboard.write_events_csv(events_csv, size.events, scale)
    began = time.monotonic()
    with spark_status(console, spark, "bulk-loading events"):
        loaded = jobs.load_files(spark, address, "events", [str(events_csv)])
    console.print(
        f"loaded {loaded.rows} events at timestamp {loaded.timestamp} in "
        f"{time.monotonic() - began:.1f} s (one transaction)"
    )
    stop = threading.Event()
    ids = itertools.count(size.events)
    counts: list[int] = []
    writers = [
        threading.Thread(target=_churn, args=(address, scale, ids, seed, stop, counts))
        for seed in range(4)
    ]
    for writer in writers:
        writer.start()
    try:
        for name, select, mode in (
            ("shop_category_cost", dashboard.SHOP_CATEGORY_COST, "sync"),
            ("category_cost", dashboard.CATEGORY_COST, "async"),
        ):
            began = time.monotonic()
            with spark_status(
                console, spark, f"computing {name} with Spark SQL while 4 clients write"
            ):
                result = jobs.init_view(
                    spark, address, sql=dashboard.view_ddl(name, select, mode, 500)
                )
            console.print(
                f"created {name} ({mode}): {result.groups} groups computed at snapshot "
                f"{result.snapshot}, live at {result.timestamp}, "
                f"in {time.monotonic() - began:.1f} s"
            )
        console.print(
            f"\n[bold]3. mixed workload[/]: 4 clients insert, correct and delete events for "
            f"{size.workload_seconds:g} s while the views are read"
        )
        reads = _read_views(address, size.workload_seconds)
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    console.print(
        f"{sum(counts)} write transactions committed; {reads} view reads "
        "(SQL-1 lookups answered from one view row each)"
    )
    console.print("\n[bold]4. verification[/]: every view recomputed by Spark SQL")
    with spark_status(console, spark, "verifying") as progress:
        results = jobs.verify_views(spark, address, progress=progress)
    table = Table(title="views against recomputation")
    for column in ("view", "groups", "exact at timestamp", "differing groups"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r.view, str(r.groups), str(r.timestamp), str(len(r.differences)))
    print_whole(console, table)
    if not all(r.ok for r in results):
        raise errors.FailedPrecondition("a view differs from its recomputation")
    console.print("[green]verified[/]: every view equals its SQL recomputed from the base tables")
    with Client(address) as client:
        for name in ("shop_category_cost", "category_cost"):
            client.sql(f"DROP MATERIALIZED VIEW {name}")


CHURN_PACE = 0.1


def _churn(
    address: str,
    scale: dashboard.Scale,
    ids: itertools.count[int],
    seed: int,
    stop: threading.Event,
    counts: list[int],
) -> None:
    """Transactions of 1-20 new events, corrections of an event's cost and product, deletes:
    one every ``CHURN_PACE`` s (clients at a web application's pace, not flat out: the
    benchmark step measures throughput; flat out they slowed Spark's jobs two-fold)."""
    rng = random.Random(seed)
    done = 0
    mine: list[int] = []
    with Client(address) as client:
        while not stop.is_set():
            roll = rng.random()
            try:
                with client.transaction() as tx:
                    if roll < 0.7 or len(mine) < 5:
                        for _ in range(rng.randint(1, 20)):
                            event = dashboard.event(rng, next(ids), scale)
                            tx.insert("events", event)
                            mine.append(event["id"])
                    elif roll < 0.9:
                        tx.update(
                            "events", {"id": rng.choice(mine)}, dashboard.correction(rng, scale)
                        )
                    else:
                        tx.delete("events", {"id": mine.pop(rng.randrange(len(mine)))})
            except errors.AggviewError:
                continue
            done += 1
            stop.wait(CHURN_PACE)
    counts.append(done)


def _read_views(address: str, seconds: float) -> int:
    reads = 0
    deadline = time.monotonic() + seconds
    with Client(address) as client:
        while time.monotonic() < deadline:
            client.view("shop_category_cost", {"shop": "shop 3", "category": "category 3"})
            client.view("category_cost")
            reads += 2
    return reads


def run_bench(address: str, console: Console, size: DemoSize, out: Path) -> None:
    console.print(
        f"\n[bold]5. benchmark[/]: transactions of {', '.join(map(str, size.bench_sizes))} "
        f"events, {size.bench_seconds:g} s per point, with no view, SQL-1 sync, async and "
        "Cumulus (freshness: from a commit to a read that holds it; Cumulus's tentative reads "
        "hold it before its epoch commits)"
    )
    config = dashboard_bench.Settings(
        modes=[
            dashboard_bench.Mode("none"),
            dashboard_bench.Mode("sync"),
            dashboard_bench.Mode("async", 500),
            dashboard_bench.Mode("cumulus", 500, 2, "speculative", feed_ms=50),
        ],
        sizes=list(size.bench_sizes),
        seconds=size.bench_seconds,
        clients=CLIENTS,
        scale=size.scale,
        ltms=0,
        address=address,
        out=out,
    )
    report = dashboard_bench.run_benchmark(config, {}, console)
    written = dashboard_report.write_outputs(report, out)
    report.print(
        [
            "mode",
            "k",
            "tx_per_s",
            "p50_ms",
            "fresh_p50_ms",
            "tentative_fresh_p50_ms",
            "consistent",
            "verified",
        ],
        console,
    )
    for r in dashboard_report.ratios(report):
        console.print(f"{r['mode']} / no view at {r['k']} events per transaction: {r['ratio']:.2f}")
    console.print("wrote " + ", ".join(str(p) for p in written))
    console.print(f"{out / 'README.md'} says what each plot shows and how to read it")
