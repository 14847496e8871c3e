"""Bulk load and bulk initialization of the dashboard schema with Spark, against the same rows
loaded through transactions, in one run.

A :class:`agglauncher.cluster.LocalCluster` (``--ltms`` LTMs, fsync on) gets the thesis's dashboard
tables (50 shops, 5,000 products, 20 categories), then:

1. ``--events`` events are written to a CSV file and loaded with ``aggview load``'s job
   (``aggspark.jobs.load_files``): one transaction at one timestamp;
2. the two dashboard views are created with ``aggview views init``'s job (Spark SQL at a held
   snapshot): SQL-1 (shop x category cost, sync) and the cost per category (async, 500 ms);
3. ``aggview verify``'s job recomputes both and compares every group;
4. a second cluster loads ``--tx-events`` events through ordinary transactions of ``--batch``
   events from ``--clients`` concurrent clients; its rate, scaled to ``--events``, is the
   "through transactions" time the ratio compares with (loading all of them that way would take
   tens of minutes).

The peak resident memory (VmHWM) of each LTM process is read from /proc after each step.

    python -m bench.bulk                       # 10^6 events: about 5 minutes on 2 cores
    python -m bench.bulk --events 100000 --tx-events 20000
    python -m bench.bulk --events 100000 --tx-events 20000 --hbase hbase://127.0.0.1:9090
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from aggclient import Client
from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggspark import jobs
from aggspark.session import spark_session
from bench.clusters import hbase_store
from loadgen import dashboard

SCALE = dashboard.Scale()


def peak_memory_mib(cluster: LocalCluster) -> list[float]:
    """VmHWM of each LTM process, in MiB."""
    out = []
    for server in cluster.servers:
        if not server.role.startswith("ltm") or server.process is None:
            continue
        for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                out.append(int(line.split()[1]) / 1024)
    return out


async def through_transactions(address: str, count: int, batch: int, clients: int) -> float:
    """Seconds to insert ``count`` events in transactions of ``batch`` from ``clients``."""
    rng = random.Random(2)
    ids = iter(range(count))

    async def worker(client: AsyncClient) -> None:
        while True:
            chunk = [i for _, i in zip(range(batch), ids, strict=False)]
            if not chunk:
                return
            async with client.transaction() as tx:
                for i in chunk:
                    tx.insert("events", dashboard.event(rng, i, SCALE))

    async with AsyncClient(address) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        return time.perf_counter() - started


def store(args: argparse.Namespace) -> str:
    """The embedded store, or (--hbase) a fresh table prefix on that HBase."""
    return hbase_store(args.hbase) if args.hbase else ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = spark_session()
    report: dict[str, Any] = {
        "events": args.events,
        "ltms": args.ltms,
        "store": "hbase" if args.hbase else "embedded",
    }
    with tempfile.TemporaryDirectory(prefix="aggview-bulk-") as tmp:
        base = Path(tmp)
        events_csv = base / "events.csv"
        started = time.perf_counter()
        dashboard.write_events_csv(events_csv, args.events, SCALE, seed=1)
        print(f"wrote {args.events} events to CSV in {time.perf_counter() - started:.1f} s")
        with LocalCluster(base / "bulk", ltms=args.ltms, store=store(args)) as cluster:
            with Client(cluster.address) as client:
                dashboard.create_schema(client)
                dashboard.populate(client, SCALE)
            started = time.perf_counter()
            loaded = jobs.load_files(spark, cluster.address, "events", [str(events_csv)])
            report["load_seconds"] = time.perf_counter() - started
            report["ltm_peak_mib_after_load"] = peak_memory_mib(cluster)
            print(f"bulk load: {loaded.rows} rows in {report['load_seconds']:.1f} s")
            init_seconds = {}
            for name, select, mode in (
                ("shop_category_cost", dashboard.SHOP_CATEGORY_COST, "sync"),
                ("category_cost", dashboard.CATEGORY_COST, "async"),
            ):
                started = time.perf_counter()
                result = jobs.init_view(
                    spark, cluster.address, sql=dashboard.view_ddl(name, select, mode, 500)
                )
                init_seconds[name] = time.perf_counter() - started
                print(f"bulk init {name}: {result.groups} groups in {init_seconds[name]:.1f} s")
            report["init_seconds"] = init_seconds
            started = time.perf_counter()
            verified = jobs.verify_views(spark, cluster.address)
            report["verify_seconds"] = time.perf_counter() - started
            report["verified"] = {r.view: len(r.differences) for r in verified}
            report["ltm_peak_mib"] = peak_memory_mib(cluster)
            print(
                f"verify: {report['verified']} differing groups in {report['verify_seconds']:.1f} s"
            )
        with LocalCluster(base / "tx", ltms=args.ltms, store=store(args)) as cluster:
            with Client(cluster.address) as client:
                dashboard.create_schema(client)
                dashboard.populate(client, SCALE)
            seconds = asyncio.run(
                through_transactions(cluster.address, args.tx_events, args.batch, args.clients)
            )
            rate = args.tx_events / seconds
            report["tx_rows_per_second"] = rate
            report["tx_seconds_scaled"] = args.events / rate
            print(
                f"transactions: {args.tx_events} rows in {seconds:.1f} s ({rate:.0f} rows/s); "
                f"{args.events} rows would take {report['tx_seconds_scaled']:.0f} s"
            )
    report["load_ratio"] = report["tx_seconds_scaled"] / report["load_seconds"]
    print(
        f"\nbulk load {report['load_seconds']:.1f} s vs transactions "
        f"{report['tx_seconds_scaled']:.0f} s: {report['load_ratio']:.1f}x faster; "
        f"LTM peak memory {', '.join(f'{m:.0f}' for m in report['ltm_peak_mib'])} MiB"
    )
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tx-events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=100, help="events per transaction")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--ltms", type=int, default=3)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--hbase", help="keep the store on this HBase (hbase://HOST:PORT)")
    args = parser.parse_args(argv)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
