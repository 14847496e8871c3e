"""``aggview demo``: a local cluster on the embedded store, a concurrent transactional workload
with a crash in the middle, and a check that nothing was lost or half-applied."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aggview.cluster import LocalCluster
from coordinator import Client
from loadgen import transfers

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
    console.print("cluster stopped")
