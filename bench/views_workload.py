"""The workload of ``python -m bench.views``: one-row event inserts (spread or hot), point reads of
the view, and the checks after a case (each view against duckdb's recomputation, the events
against the commits the client saw).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import duckdb

from aggclient import Client
from aggclient.bulk_client import BulkClient
from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from bench.load import Ledger, measure_window
from bench.measurements import (
    CpuMeter,
    err,
    percentile,
)
from bench.views_cases import (
    CATEGORY_VIEW,
    POINT_READ,
    RECOMPUTE_TABLES,
    SCALE,
    Case,
    Point,
    Reads,
    Report,
)
from loadgen import dashboard


def hot_products(scale: dashboard.Scale) -> list[int]:
    """Products of category 0 (``dashboard.populate`` puts product i in category i % n)."""
    return [p for p in range(scale.products) if p % scale.categories == 0]


def make_event(rng: random.Random, event_id: int, products: Sequence[int] | None) -> dict[str, Any]:
    row = dashboard.event(rng, event_id, SCALE)
    if products is not None:
        row["prod_id"] = rng.choice(products)
        row["shop_id"] = row["prod_id"] % SCALE.shops
    return row


async def insert_events(
    client: AsyncClient, rows: Iterable[dict[str, Any]], batch: int, concurrency: int = 4
) -> int:
    """Inserts rows ``batch`` per transaction from ``concurrency`` tasks; returns how many."""
    pending = iter(rows)
    done = 0

    async def worker() -> None:
        nonlocal done
        while chunk := list(itertools.islice(pending, batch)):
            async with client.transaction() as tx:
                for row in chunk:
                    tx.insert("events", row)
            done += len(chunk)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def run_inserts(
    cluster: LocalCluster,
    client: AsyncClient,
    ledger: Ledger,
    ids: Iterator[int],
    *,
    case: Case,
    workload: str,
    tasks: int,
    args: argparse.Namespace,
) -> Point:
    """Closed loop: ``tasks`` tasks on one client, one new event per transaction."""
    point = Point(
        cluster.ltms,
        1,
        "closed",
        tasks,
        1,
        None,
        args.seconds,
        case=case.name,
        workload=workload,
        view_mode=case.mode if case.view else None,
        interval_ms=case.interval_ms if case.view and case.mode == "async" else None,
    )
    products = hot_products(SCALE) if workload == "hot" else None
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    start = time.perf_counter()
    measure_from, end = start + args.warmup, start + args.warmup + args.seconds

    async def worker(task: int) -> None:
        # the same event sequences in every case, so "none" and "sync" insert the same rows
        rng = random.Random(f"{args.seed}:{workload}:{tasks}:{task}")
        perf_counter = time.perf_counter
        while perf_counter() < end:
            row = make_event(rng, next(ids), products)
            t0 = perf_counter()
            try:
                async with client.transaction() as tx:
                    tx.insert("events", row)
            except errors.AggviewError as exc:
                name = ledger.failed(exc, 1)
                if measure_from <= perf_counter() <= end:
                    failures[name] += 1
                continue
            t1 = perf_counter()
            ledger.row_updates += 1
            if measure_from <= t1 <= end:
                latencies.append(t1 - t0)

    meter = asyncio.create_task(measure_window(cluster, [client], measure_from, end))
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    point.retries, point.cpu, point.members = await meter
    point.committed = len(latencies)
    point.tps = len(latencies) / args.seconds
    point.errors = dict(failures)
    point.summarize(latencies)
    return point


async def point_reads(cluster: LocalCluster, client: AsyncClient, count: int) -> Reads:
    """``count`` sequential point lookups by the full group key (after 50 unmeasured ones)."""
    for _ in range(min(50, count)):
        await client.view(CATEGORY_VIEW, POINT_READ)
    meter = CpuMeter(cluster)
    latencies = []
    for _ in range(count):
        t0 = time.perf_counter()
        rows = await client.view(CATEGORY_VIEW, POINT_READ)
        latencies.append(time.perf_counter() - t0)
        if len(rows) != 1 or rows[0]["name"] != POINT_READ["name"]:
            raise RuntimeError(f"point read of {POINT_READ} returned {list(rows)}")
    cpu = meter.stop()
    ms = sorted(x * 1000 for x in latencies)
    everything = await client.view(CATEGORY_VIEW)
    return Reads(
        events=sum(row["count"] for row in everything),
        reads=count,
        p50_ms=percentile(ms, 0.50),
        p99_ms=percentile(ms, 0.99),
        mean_ms=sum(ms) / len(ms) if ms else None,
        max_ms=ms[-1] if ms else None,
        load_s=None,
        load_events_per_s=None,
        cpu=cpu,
    )


def _load_duckdb(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[dict]) -> None:
    """Column-wise: one list per column, unnested and cast to the column's type (fast)."""
    if not rows:
        return
    types = {name: kind for name, kind, *_ in con.execute(f"DESCRIBE {table}").fetchall()}
    columns = list(rows[0])
    values = [[None if r[c] is None else str(r[c]) for r in rows] for c in columns]
    selects = ", ".join(f"CAST(unnest(?::VARCHAR[]) AS {types[c]})" for c in columns)
    con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {selects}", values)


async def recompute(client: AsyncClient, select: str) -> tuple[list[tuple], int]:
    """The view's SELECT run by duckdb over the tables it reads, all read page by page at one
    held snapshot (10^6 events do not fit one scan reply), and the number of events read."""
    tables = await asyncio.to_thread(snapshot_rows, client.address, RECOMPUTE_TABLES)
    con = duckdb.connect()
    try:
        for ddl in dashboard.TABLES:
            con.execute(ddl.replace("PRIMARY KEY", ""))
        for table, rows in tables.items():
            _load_duckdb(con, table, rows)
        return sorted(con.execute(select).fetchall()), len(tables["events"])
    finally:
        con.close()


def snapshot_rows(address: str, tables: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    with Client(address, timeout=60) as client:
        bulk = BulkClient(client)
        lease, ts = bulk.hold_snapshot()
        try:
            return {table: list(bulk.table_rows(table, ts)) for table in tables}
        finally:
            bulk.release_snapshot(lease)


async def verify(
    client: AsyncClient, case: Case, ledger: Ledger, preloaded: int, report: Report
) -> float:
    """Checks the view against a recomputation and the events against the commits; returns
    the seconds the recomputation took."""
    t0 = time.perf_counter()
    expected, events = await recompute(client, case.select or "SELECT 1")
    recompute_s = time.perf_counter() - t0
    low = preloaded + ledger.row_updates
    high = low + ledger.ambiguous
    ok = low <= events <= high
    report.checks.append(
        {
            "case": case.name,
            "check": "events",
            "ok": ok,
            "detail": f"{events} events; {preloaded} preloaded + {ledger.row_updates} "
            f"committed" + (f" (+ up to {ledger.ambiguous} unclear)" if ledger.ambiguous else ""),
        }
    )
    if case.view:
        if case.mode == "async":
            await client.refresh(case.view)
        rows = await client.view(case.view)
        got = sorted(tuple(row.values()) for row in rows)
        same = got == expected
        detail = f"{len(got)} rows equal duckdb's over {events} events"
        if not same:
            missing = [r for r in expected if r not in got][:3]
            extra = [r for r in got if r not in expected][:3]
            detail = f"DIFFERS: view has {extra} not recomputed; recomputed {missing} not in view"
        report.checks.append(
            {"case": case.name, "check": f"view {case.view}", "ok": same, "detail": detail}
        )
    for check in report.checks[-2 if case.view else -1 :]:
        mark = "[green]ok[/]" if check["ok"] else "[bold red]FAILED[/]"
        err.print(f"  check {check['case']} / {check['check']}: {mark}, {check['detail']}")
    return recompute_s
