"""``aggview demo``: a local cluster on the embedded store, a concurrent transactional workload
with a crash in the middle, and a check that nothing was lost or half-applied."""

from __future__ import annotations

import itertools
import random
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aggview.cluster import LocalCluster
from coordinator import Client
from loadgen import dashboard, transfers

ACCOUNTS = 60
CLIENTS = 8


def run_demo(data: Path, *, ltms: int = 3, seconds: float = 6.0) -> None:
    console = Console()
    console.print(f"[bold]aggview demo[/]: {ltms} LTMs + a coordinator on the embedded store")
    with LocalCluster(data, ltms=ltms, checkpoint_interval=1.0) as cluster:
        console.print(f"cluster listening on {cluster.address} (data in {data})")
        with Client(cluster.address) as client:
            transfers.create(client, "accounts", "ledger", ACCOUNTS)
        console.print(
            f"{CLIENTS} clients run conditional transfers between {ACCOUNTS} accounts "
            f"for {seconds:.0f}s; LTM 0 is killed with SIGKILL half-way and restarted"
        )
        stop = threading.Event()
        outcomes = transfers.Outcomes()
        workers = transfers.run_clients(
            cluster.address,
            "accounts",
            "ledger",
            ACCOUNTS,
            clients=CLIENTS,
            stop=stop,
            outcomes=outcomes,
        )
        started = time.monotonic()
        time.sleep(seconds / 2)
        cluster.ltm(0).kill()
        killed_at = len(outcomes.committed)
        cluster.ltm(0).start()
        time.sleep(seconds / 2)
        stop.set()
        for worker in workers:
            worker.join()
        elapsed = time.monotonic() - started

        with Client(cluster.address) as client:
            transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)
            balances = client.scan("accounts")
        table = Table(title="transfers")
        table.add_column("measure")
        table.add_column("value", justify="right")
        table.add_row("committed", str(len(outcomes.committed)))
        table.add_row("committed before the crash", str(killed_at))
        table.add_row("refused by their condition", str(outcomes.condition_failed))
        table.add_row("failed while LTM 0 was down", str(outcomes.unknown))
        table.add_row("timestamp-order retries", str(outcomes.retries))
        table.add_row("committed per second", f"{len(outcomes.committed) / elapsed:.0f}")
        table.add_row("total balance (snapshot)", str(sum(r["balance"] for r in balances)))
        table.add_row("snapshot timestamp", str(balances.timestamp))
        console.print(table)
        console.print(
            "[green]verified[/]: every acknowledged transfer is in the ledger, balances agree "
            "with the ledger, the total is unchanged and no balance is negative"
        )
        run_dashboard(cluster.address, console, seconds=seconds / 2)
    console.print("cluster stopped")


def run_dashboard(address: str, console: Console, *, seconds: float) -> None:
    """The thesis's dashboard: SQL-1 as a sync view, cost per category as an async view."""
    scale = dashboard.Scale(shops=10, products=200, categories=8)
    with Client(address) as client:
        dashboard.create_schema(client)
        dashboard.populate(client, scale)
        client.sql(dashboard.view_ddl("shop_category_cost", dashboard.SHOP_CATEGORY_COST))
        client.sql(
            dashboard.view_ddl("category_cost", dashboard.CATEGORY_COST, "async", interval_ms=500)
        )
    console.print(
        f"dashboard: {CLIENTS} clients insert events for {seconds:.0f}s; SQL-1 per (shop, "
        "category) is a sync view, cost per category an async view refreshed every 500 ms"
    )
    counter = itertools.count()
    stop = threading.Event()
    committed = []

    def work(worker: int) -> None:
        rng = random.Random(worker)
        done = 0
        with Client(address) as client:
            while not stop.is_set():
                with client.transaction() as tx:
                    tx.insert("events", dashboard.event(rng, next(counter), scale))
                done += 1
        committed.append(done)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    with Client(address) as client:
        stale = client.view("category_cost")
    stop.set()
    for thread in threads:
        thread.join()
    with Client(address) as client:
        sync_rows = client.view("shop_category_cost")
        expected = dashboard.recompute_shop_category_cost(client)
        assert dashboard.view_totals(sync_rows) == expected, "the sync view drifted"
        refreshed_at = client.refresh("category_cost")
        fresh = client.view("category_cost")
        lookup = client.view("shop_category_cost", {"shop": "shop 3", "category": "category 3"})
    table = Table(title="dashboard views")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("events committed", str(sum(committed)))
    table.add_row("SQL-1 groups (sync view)", str(len(sync_rows)))
    table.add_row("SQL-1 for shop 3 / category 3", str(lookup[0]["cost"] if lookup else 0))
    table.add_row("async view read while writing: as of", str(stale.timestamp))
    table.add_row("async view after refresh: as of", str(refreshed_at))
    table.add_row("events in the async view", str(sum(r["events"] for r in fresh)))
    console.print(table)
    assert sum(r["events"] for r in fresh) == sum(committed)
    console.print(
        "[green]verified[/]: the sync view equals SQL-1 recomputed from the base tables, and "
        "the refreshed async view counts every committed event"
    )
