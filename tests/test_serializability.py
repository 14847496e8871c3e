"""Conditional transfers from many concurrent clients, with concurrent snapshot scans."""

from __future__ import annotations

import threading

from aggclient import Client
from agglauncher.cluster import LocalCluster
from loadgen import transfers

ACCOUNTS = 24


def test_concurrent_transfers_keep_every_invariant(cluster: LocalCluster, table_name: str) -> None:
    accounts, ledger = f"{table_name}_acc", f"{table_name}_led"
    with Client(cluster.address) as client:
        transfers.create(client, accounts, ledger, ACCOUNTS)
    stop = threading.Event()
    outcomes = transfers.Outcomes()
    workers = transfers.run_clients(
        cluster.address,
        accounts,
        ledger,
        ACCOUNTS,
        clients=8,
        stop=stop,
        outcomes=outcomes,
        seed=1,
        max_transfers=40,
    )
    snapshots: list[int] = []
    failures: list[str] = []

    def scan_loop() -> None:
        with Client(cluster.address) as client:
            while any(w.is_alive() for w in workers):
                rows = client.scan(accounts)
                total = sum(r["balance"] for r in rows)
                if total != transfers.INITIAL * ACCOUNTS or min(r["balance"] for r in rows) < 0:
                    failures.append(f"snapshot {rows.timestamp}: total {total}")
                snapshots.append(rows.timestamp)

    scanners = [threading.Thread(target=scan_loop) for _ in range(2)]
    for thread in scanners:
        thread.start()
    for thread in workers + scanners:
        thread.join(timeout=120)
    assert not failures, failures[:5]
    assert len(snapshots) > 5
    assert outcomes.unknown == 0, outcomes.messages
    assert len(outcomes.committed) + outcomes.condition_failed == 8 * 40
    assert len(outcomes.committed) > 100
    with Client(cluster.address) as client:
        transfers.check(client, accounts, ledger, ACCOUNTS, outcomes.committed)
