"""Switches per member (issue #42 item 1): a join whose two sides are written by concurrent
clients at both members of the members layout (8 clients: 70 % inserts of right rows, 30 %
moves of a left row to another key and group), under a cumulus view (epochs every 100 ms, 2
DW nodes). Unlike the dashboard stream (inserts of facts only, whose triggers read maps no
event writes), writes here read maps other members' writes change: reordering between the
members' switches makes corrective updates. Prints one JSON line per run: throughput,
committed freshness p50/p99 (a probe's commit until a committed read holds it), corrective
updates per 1,000 updates, the runtime's CPU per update, and whether the view equals the
tables at the end.

    python -m bench.switches --modes speculative conservative --seconds 8
    python -m bench.switches --code ../other-checkout      # its servers, same load
    python -m bench.switches --delay 1:0.02                # member 1's batches held 20 ms
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggview import errors

CLIENTS = 8
KEYS = 40
SELECT = (
    "SELECT a.g AS g, SUM(b.v) AS s, COUNT(*) AS n FROM sa a JOIN sb b ON a.k = b.k GROUP BY a.g"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["speculative", "conservative"])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--code", type=Path, default=None, help="another checkout's servers")
    parser.add_argument("--delay", default="", help="M:SECONDS: member M's batches held")
    args = parser.parse_args()
    if args.delay:
        os.environ["AGGVIEW_SWITCH_DELAY"] = args.delay  # the servers' environment
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as tmp:
            layout: dict[str, Any] = {"code": args.code.resolve()} if args.code else {}
            cluster = LocalCluster(Path(tmp) / "data", ltms=3, processes=2, **layout)
            cluster.start()
            try:
                print(json.dumps({"mode": mode, **run(cluster, mode, args.seconds)}), flush=True)
            finally:
                cluster.stop()
                cluster.kill()


def run(cluster: LocalCluster, mode: str, seconds: float) -> dict[str, Any]:
    """One measured run on a fresh cluster."""
    with Client(cluster.address) as client:
        client.sql("CREATE TABLE sa (id INT PRIMARY KEY, k INT, g TEXT)")
        client.sql("CREATE TABLE sb (id INT PRIMARY KEY, k INT, v DECIMAL(8,2))")
        with client.transaction() as tx:
            for i in range(KEYS * 2):
                tx.insert("sa", {"id": i, "k": i % KEYS, "g": "abcd"[i % 4]})
        client.sql(
            f"CREATE MATERIALIZED VIEW sv WITH (refresh = 'cumulus', epoch_ms = 100, nodes = 2, "
            f"mode = '{mode}') AS {SELECT}"
        )
        before = BulkClient(client).describe("sv").runtime
    deadline = time.perf_counter() + seconds
    counts = {"tx": 0, "aborted": 0}
    fresh: list[float] = []
    lock = threading.Lock()
    ids = iter(range(10**6, 10**9))

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with Client(cluster.address) as c:
            while time.perf_counter() < deadline:
                try:
                    with c.transaction() as tx:
                        if rng.random() < 0.3:  # a move of a left row: another key and group
                            tx.update(
                                "sa",
                                {"id": rng.randrange(KEYS * 2)},
                                {"k": rng.randrange(KEYS), "g": rng.choice("abcd")},
                            )
                        else:
                            with lock:
                                new = next(ids)
                            tx.insert(
                                "sb",
                                {
                                    "id": new,
                                    "k": rng.randrange(KEYS),
                                    "v": Decimal(rng.randrange(1, 500)) / 100,
                                },
                            )
                except errors.AggviewError:
                    with lock:
                        counts["aborted"] += 1
                    continue
                with lock:
                    counts["tx"] += 1

    def prober() -> None:
        with Client(cluster.address) as c:
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                with c.transaction() as tx:
                    tx.insert("sb", {"id": 2 * 10**9 + n, "k": 0, "v": Decimal(0)})
                ts, acked = tx.timestamp, time.perf_counter()
                while c.view("sv", {"g": "a"}).timestamp < ts:
                    time.sleep(0.005)
                fresh.append(time.perf_counter() - acked)
                time.sleep(0.05)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(CLIENTS)]
    threads.append(threading.Thread(target=prober))
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    with Client(cluster.address) as client:
        client.refresh("sv")
        after = BulkClient(client).describe("sv").runtime
        rows = client.view("sv")
        with client.snapshot() as snapshot:
            expected = snapshot.sql(SELECT)
        key = lambda r: repr(r["g"])  # noqa: E731
        exact = sorted(map(dict, rows), key=key) == sorted(map(dict, expected), key=key)
    updates = after["updates"] - before["updates"]
    corrective = after["corrective"] - before["corrective"]
    fresh.sort()
    return {
        "tx_per_s": round(counts["tx"] / elapsed, 1),
        "aborted": counts["aborted"],
        "fresh_p50_ms": round(statistics.median(fresh) * 1000, 1),
        "fresh_p99_ms": round(fresh[int(len(fresh) * 0.99)] * 1000, 1),
        "updates": updates,
        "corrective_per_1k": round(1000 * corrective / max(updates, 1), 2),
        "runtime_cpu_ms_per_update": round(
            1000 * (after["cpu_seconds"] - before["cpu_seconds"]) / max(updates, 1), 3
        ),
        "exact": exact,
    }


if __name__ == "__main__":
    main()
