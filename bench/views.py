"""What aggregate views cost: one-row inserts into the thesis's dashboard schema with no view, a
sync view and async views, a hot group, view point reads at two table sizes, and the pg_ivm
comparison workload, in one run.

A base data directory is built once: a :class:`agglauncher.cluster.LocalCluster` with ``--ltms``
LTMs, the dashboard tables at the thesis scale (50 shops, 5,000 products, 20 categories;
``loadgen.dashboard.populate``) and ``--events`` events inserted ``--batch`` per transaction.
The cluster is stopped cleanly (the LTMs checkpoint) and every case below runs on a cluster
started over its own copy of that directory, so all cases start from the same data:

* ``none``: no view;
* ``sync``: ``SELECT c.name, SUM(e.cost), COUNT(*) FROM events e JOIN products p ON e.prod_id =
  p.id JOIN categories c ON p.cat_id = c.id GROUP BY c.name`` maintained inside transactions;
* ``async <ms>``: the same SELECT ``WITH (refresh = 'async', interval_ms = <ms>)`` for each of
  ``--intervals``;
* ``pg_ivm SQL``: the view of the pg_ivm comparison, ``SELECT p.cat_id, SUM(e.cost), COUNT(*) FROM
  events e JOIN products p ON e.prod_id = p.id GROUP BY p.cat_id`` (sync).

The workload is a closed loop: ``--clients`` asyncio tasks share one AsyncClient, and each
inserts one new event per transaction (a random product, so spread over all categories) as soon
as its previous one returned, for ``--seconds`` after ``--warmup`` seconds. The ``sync`` cluster
also runs the hot-group workload (every event's product is in category 0, so every transaction
merges into the same view row), times ``--reads`` sequential point reads ``view(name, {"name":
"category 3"})`` right after the view is created, loads events up to ``--big-events`` rows
through transactions (timed) and times the point reads again. The ``none`` figures also serve
as the no-view side of the pg_ivm comparison (same data, same workload).

At the end of every case each view is compared with a recomputation by duckdb over a snapshot
scan of the tables (async views are refreshed first), and the number of events with the
commits the client saw.

With ``--repeat N`` every case runs N times, the cases alternating, and each ratio is the median
of the N ratios of a case to its baseline of the same pass: on a noisy machine one pass can be
30 % off either way.

    python -m bench.views                                # about 4 minutes on 2 cores
    python -m bench.views --repeat 3                     # about 8 minutes; steadier ratios
    python -m bench.views --intervals 50 500 5000 --json views.json
    python -m bench.views --parts 3 --big-events 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import duckdb
from rich.table import Table

from aggclient import Client
from aggclient.bulk_client import BulkClient
from aggclient.client import AsyncClient
from agglauncher.cluster import AS_START, LocalCluster
from aggview import errors
from bench.clusters import hbase_store, interrupt, old_code, running_cluster, settle
from bench.load import Ledger, measure_window
from bench.measurements import (
    MEASURE_COLUMNS,
    CpuMeter,
    Result,
    cpu_cell,
    err,
    ms_cell,
    out,
    per_process_cpu,
    percentile,
)
from loadgen import dashboard

SCALE = dashboard.Scale()  # the thesis: 50 shops, 5,000 products, 20 categories

CATEGORY_VIEW = "cost_by_category"
CATEGORY_SQL = (
    "SELECT c.name, SUM(e.cost), COUNT(*) FROM events e JOIN products p ON e.prod_id = p.id "
    "JOIN categories c ON p.cat_id = c.id GROUP BY c.name"
)
PGIVM_VIEW = "cost_by_cat_id"
PGIVM_SQL = (
    "SELECT p.cat_id, SUM(e.cost), COUNT(*) FROM events e JOIN products p ON e.prod_id = p.id "
    "GROUP BY p.cat_id"
)
POINT_READ = {"name": "category 3"}
# pg_ivm's figures from the issue: clients -> (tx/s with the view, tx/s without)
PGIVM_REFERENCE = {1: (1771, 5661), 8: (1831, 16571)}
# the tables the views read, loaded into duckdb for the recomputation
RECOMPUTE_TABLES = ("categories", "products", "events")


ON_HBASE = " @hbase"
ONE_PROCESS = " @1 process"
OLD = " @old"


def in_processes(processes: int) -> str:
    """The suffix of a case run in ``processes`` coordinating processes."""
    return ONE_PROCESS if processes == 1 else f" @{processes} processes"


@dataclass(frozen=True)
class Case:
    name: str  # "none", "sync", "async 500ms", "pg_ivm SQL"
    view: str | None = None
    select: str | None = None
    mode: str = "sync"
    interval_ms: int = 500

    @property
    def ddl(self) -> str:
        assert self.view is not None and self.select is not None
        return dashboard.view_ddl(self.view, self.select, self.mode, self.interval_ms)


@dataclass
class Point(Result):
    """One closed-loop measurement (Result's figures, plus what ran)."""

    case: str = ""
    workload: str = "spread"  # "spread": random products; "hot": products of category 0 only
    view_mode: str | None = None
    interval_ms: int | None = None
    pass_index: int = 0  # which pass over the cases (--repeat)


@dataclass
class Reads:
    events: int  # rows in the events table when read
    reads: int
    p50_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    max_ms: float | None
    load_s: float | None  # seconds it took to load the events up to this size (None: preload)
    load_events_per_s: float | None
    recompute_s: float | None = None  # scan + duckdb recomputation of the whole view
    cpu: dict[str, float] = field(default_factory=dict)


@dataclass
class Report:
    base: dict[str, Any] = field(default_factory=dict)
    points: list[Point] = field(default_factory=list)
    reads: list[Reads] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    view_create_s: dict[str, float] = field(default_factory=dict)

    def point(
        self, case: str, clients: int, workload: str = "spread", pass_index: int = 0
    ) -> Point | None:
        wanted = (case, clients, workload, pass_index)
        for p in self.points:
            if (p.case, p.clients, p.workload, p.pass_index) == wanted:
                return p
        return None

    @property
    def verified(self) -> bool:
        return all(c["ok"] for c in self.checks)


# --------------------------------------------------------------------------- events


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


# --------------------------------------------------------------------------- reads, checks


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


# --------------------------------------------------------------------------- cases


def report_point(p: Point) -> None:
    err.print(
        f"  {p.case}, {p.workload}, {p.clients} client(s): {p.tps:.0f} tx/s, p50 "
        f"{ms_cell(p.p50_ms)} ms, p99 {ms_cell(p.p99_ms)} ms, {p.retries_per_s:.1f} retries/s, "
        f"errors {p.errors or 0}, CPU coord/LTMs/client/other % {cpu_cell(p)}" + per_process_cpu(p)
    )


async def bench_case(
    cluster: LocalCluster, case: Case, args: argparse.Namespace, report: Report, pass_index: int
) -> None:
    ledger = Ledger()
    ids = itertools.count(args.events)
    parts = set(args.parts) if pass_index == 0 else set(args.parts) - {3}  # reads: once
    async with AsyncClient(cluster.address) as client:
        for table in RECOMPUTE_TABLES:  # the same warm caches in every case
            await client.scan(table)
        if case.view:
            t0 = time.perf_counter()
            await client.sql(case.ddl)
            report.view_create_s[case.name] = round(time.perf_counter() - t0, 3)
            err.print(f"  created {case.view} ({case.mode}) in {time.perf_counter() - t0:.1f}s")
        await settle(cluster)
        reads_here = case.name == "sync" and 3 in parts
        if reads_here:  # at the preloaded size, before the workload adds events
            reads = await point_reads(cluster, client, args.reads)
            err.print(
                f"  point reads at {reads.events} events: p50 {ms_cell(reads.p50_ms)} ms, "
                f"p99 {ms_cell(reads.p99_ms)} ms"
            )
            reads.recompute_s = round(await verify(client, case, ledger, args.events, report), 3)
            report.reads.append(reads)
        workloads = []
        if case.name != "sync" or parts & {1, 2}:
            workloads.append("spread")
        if case.name == "sync" and 2 in parts:
            workloads.append("hot")
        for workload in workloads:
            for tasks in args.clients:
                point = await run_inserts(
                    cluster,
                    client,
                    ledger,
                    ids,
                    case=case,
                    workload=workload,
                    tasks=tasks,
                    args=args,
                )
                point.pass_index = pass_index
                report.points.append(point)
                report_point(point)
                await settle(cluster)
        big = None
        now = args.events + ledger.row_updates + ledger.ambiguous
        if reads_here and args.big_events > now:
            more = args.big_events - now
            rng = random.Random(f"{args.seed}:big")
            rows = (make_event(rng, next(ids), None) for _ in range(more))
            err.print(f"  loading {more} more events through transactions...")
            t0 = time.perf_counter()
            ledger.row_updates += await insert_events(client, rows, args.batch)
            load_s = time.perf_counter() - t0
            await settle(cluster, timeout=120)
            big = await point_reads(cluster, client, args.reads)
            big.load_s, big.load_events_per_s = round(load_s, 2), round(more / load_s)
            report.reads.append(big)
            err.print(
                f"  loaded {more} events in {load_s:.1f}s ({more / load_s:.0f}/s); point reads "
                f"at {big.events} events: p50 {ms_cell(big.p50_ms)} ms, "
                f"p99 {ms_cell(big.p99_ms)} ms"
            )
        recompute_s = await verify(client, case, ledger, args.events, report)
        if big is not None:
            big.recompute_s = round(recompute_s, 3)


def build_base(
    data: Path,
    args: argparse.Namespace,
    report: Report,
    pids: list[int],
    loop: asyncio.AbstractEventLoop,
    store: str = "",
) -> None:
    fsync = not args.no_fsync
    with running_cluster(data, args.ltms, fsync, store=store) as cluster:
        pids.extend(s.process.pid for s in cluster.servers if s.process is not None)
        t0 = time.perf_counter()
        with Client(cluster.address) as client:
            dashboard.create_schema(client)
            dashboard.populate(client, SCALE, batch=args.batch)
        populated = time.perf_counter()
        rng = random.Random(f"{args.seed}:preload")
        rows = (dashboard.event(rng, i, SCALE) for i in range(args.events))

        async def load() -> None:
            async with AsyncClient(cluster.address) as client:
                await insert_events(client, rows, args.batch)

        loop.run_until_complete(load())
        loaded = time.perf_counter()
    if store:  # a case's own base on HBase: its build time is reported, the base stays
        err.print(f"  its base on HBase: {args.events} events in {loaded - populated:.1f}s")
        return
    report.base = {
        "ltms": args.ltms,
        "shops": SCALE.shops,
        "products": SCALE.products,
        "categories": SCALE.categories,
        "events": args.events,
        "batch": args.batch,
        "populate_s": round(populated - t0, 2),
        "preload_s": round(loaded - populated, 2),
        "preload_events_per_s": round(args.events / max(loaded - populated, 1e-9)),
    }
    err.print(
        f"base: {args.ltms} LTMs, dashboard tables in {populated - t0:.1f}s, {args.events} "
        f"events in {loaded - populated:.1f}s ({args.events} per {args.batch}-row transaction)"
    )


def cases(args: argparse.Namespace) -> list[Case]:
    parts = set(args.parts)
    chosen: list[Case] = []
    if parts & {1, 4}:
        chosen.append(Case("none"))
    if parts & {1, 2, 3}:
        chosen.append(Case("sync", CATEGORY_VIEW, CATEGORY_SQL))
    if 1 in parts:
        chosen.extend(
            Case(f"async {ms}ms", CATEGORY_VIEW, CATEGORY_SQL, "async", ms) for ms in args.intervals
        )
    if 4 in parts:
        chosen.append(Case("pg_ivm SQL", PGIVM_VIEW, PGIVM_SQL))
    return chosen


def layouts(args: argparse.Namespace) -> list[int]:
    """The --processes layouts each case also runs in (--one-process is --processes 1)."""
    return sorted({*args.processes, *([1] if args.one_process else [])})


def store_cases(args: argparse.Namespace) -> list[tuple[Case, str]]:
    """Every case on the embedded store, then (with --one-process) each again with the whole
    cluster in one process, named ``<case> @1 process``, then (with --hbase) each again on
    HBase, named ``<case> @hbase``."""
    chosen = [(case, "") for case in cases(args)]
    if args.old:
        chosen += [(replace(case, name=f"{case.name}{OLD}"), "") for case in cases(args)]
    for processes in layouts(args):
        suffix = in_processes(processes)
        chosen += [(replace(case, name=f"{case.name}{suffix}"), "") for case in cases(args)]
    if args.hbase:
        chosen += [
            (replace(case, name=f"{case.name}{ON_HBASE}"), hbase_store(args.hbase))
            for case in cases(args)
        ]
    return chosen


def run(args: argparse.Namespace, report: Report, pids: list[int]) -> None:
    # One event loop for the whole run: gRPC's poller thread may still call into the loop of
    # a finished asyncio.run, which then logs "Event loop is closed" tracebacks.
    loop = asyncio.new_event_loop()
    try:
        run_on(loop, args, report, pids)
    finally:
        loop.close()


def run_on(
    loop: asyncio.AbstractEventLoop, args: argparse.Namespace, report: Report, pids: list[int]
) -> None:
    with tempfile.TemporaryDirectory(prefix="aggview-bench-views-", dir=args.tmp) as tmp:
        base = Path(tmp) / "base"
        build_base(base, args, report, pids, loop)
        for pass_index in range(args.repeat):  # cases alternate: slow spells hit them alike
            for case, store in store_cases(args):
                data = Path(tmp) / case.name.replace(" ", "-")
                if store:  # HBase holds the rows: a base of its own under a fresh prefix
                    err.print(f"{case.name}: a fresh cluster over its own base on HBase")
                    build_base(data, args, report, pids, loop, store)
                else:
                    shutil.copytree(base, data, ignore=shutil.ignore_patterns("logs"))
                    err.print(f"{case.name}: a fresh cluster over a copy of the base")
                old = case.name.endswith(OLD)
                processes = next(
                    (p for p in layouts(args) if case.name.endswith(in_processes(p))),
                    args.old_processes if old else AS_START,
                )
                code = old_code(args) if old else None
                with running_cluster(
                    data, args.ltms, not args.no_fsync, store=store, processes=processes, code=code
                ) as cluster:
                    pids.extend(s.process.pid for s in cluster.servers if s.process is not None)
                    loop.run_until_complete(bench_case(cluster, case, args, report, pass_index))
                shutil.rmtree(data)


# --------------------------------------------------------------------------- report


def ratios(report: Report, args: argparse.Namespace) -> list[dict[str, Any]]:
    """tx/s and p50 of each case against its baseline, per client count: with --repeat, the
    median of the ratios of each pass (a case against its baseline of the same pass)."""
    found = []

    def add(
        name: str,
        clients: int,
        num: tuple[str, str],
        den: tuple[str, str],
        **extra: Any,
    ) -> None:
        tps, p50s = [], []
        for r in range(args.repeat):
            a = report.point(num[0], clients, num[1], r)
            b = report.point(den[0], clients, den[1], r)
            if a is None or b is None or not b.tps:
                continue
            tps.append(a.tps / b.tps)
            if a.p50_ms and b.p50_ms:
                p50s.append(a.p50_ms / b.p50_ms)
        if not tps:
            return
        found.append(
            {
                "ratio": name,
                "clients": clients,
                "tps": round(statistics.median(tps), 3),
                "p50": round(statistics.median(p50s), 3) if p50s else None,
                "tps_per_pass": [round(t, 3) for t in tps],
                **extra,
            }
        )

    for clients in args.clients:
        none, sync = ("none", "spread"), ("sync", "spread")
        add("sync/none", clients, sync, none)
        for ms in args.intervals:
            add(f"async {ms}ms/none", clients, (f"async {ms}ms", "spread"), none)
        add("hot/spread (sync)", clients, ("sync", "hot"), sync)
    for processes in layouts(args):
        suffix = in_processes(processes)
        for clients in args.clients:
            for case in cases(args):
                layout = (f"{case.name}{suffix}", "spread")
                add(f"{case.name}:{suffix}/default", clients, layout, (case.name, "spread"))
    if args.old:
        for suffix in ["", *(in_processes(p) for p in layouts(args))]:
            for clients in args.clients:
                for case in cases(args):
                    new, old = (f"{case.name}{suffix}", "spread"), (f"{case.name}{OLD}", "spread")
                    add(f"{case.name}{suffix or ' (default)'}/old", clients, new, old)
    if args.hbase:
        for clients in args.clients:
            for case in cases(args):
                on_hbase = (f"{case.name}{ON_HBASE}", "spread")
                add(f"{case.name}: hbase/embedded", clients, on_hbase, (case.name, "spread"))
    for clients in args.clients:
        reference = PGIVM_REFERENCE.get(clients)
        extra = {}
        if reference:
            extra = {
                "pg_ivm_view_tps": reference[0],
                "pg_ivm_none_tps": reference[1],
                "pg_ivm_ratio": round(reference[0] / reference[1], 3),
            }
        add("pg_ivm view/none", clients, ("pg_ivm SQL", "spread"), ("none", "spread"), **extra)
    return found


def print_report(report: Report, found: list[dict[str, Any]], fsync: bool) -> None:
    base = report.base
    table = Table(
        title=f"aggview views: one-row event inserts, {base['ltms']} LTMs, {base['events']} "
        f"events preloaded, {base['products']} products in {base['categories']} categories "
        f"({'fsync' if fsync else 'no fsync'})",
        caption="spread: random products; hot: products of category 0 only (one view row). "
        "CPU: % of one core used by the coordinating processes (the coordinator, or every "
        "member), the LTMs, this client and other processes",
    )
    for name in ("case", "view", "workload", "clients", "pass", *MEASURE_COLUMNS):
        table.add_column(name, justify="right")
    for p in report.points:
        view = {
            None: "-",
            "sync": "sync",
            "async": f"async {p.interval_ms} ms",
        }[p.view_mode]
        table.add_row(
            p.case,
            view,
            p.workload,
            str(p.clients),
            str(p.pass_index + 1),
            f"{p.tps:.0f}",
            ms_cell(p.p50_ms),
            ms_cell(p.p99_ms),
            ms_cell(p.max_ms),
            f"{p.retries_per_s:.1f}",
            str(sum(p.errors.values())),
            cpu_cell(p),
        )
    out.print(table)

    if found:
        table = Table(
            title="ratios (committed tx/s and p50 latency of a case over its baseline)",
            caption="pg_ivm: the issue's figures (tx/s with the view / without, and their ratio)",
        )
        passes = any(len(r["tps_per_pass"]) > 1 for r in found)
        columns = ["ratio", "clients", "tx/s ratio", "p50 ratio", "pg_ivm view/none tx/s"]
        for name in columns + (["tx/s ratio of each pass"] if passes else []):
            table.add_column(name, justify="right")
        for r in found:
            reference = (
                f"{r['pg_ivm_view_tps']:,} / {r['pg_ivm_none_tps']:,} = {r['pg_ivm_ratio']:.2f}"
                if "pg_ivm_ratio" in r
                else ""
            )
            p50 = "-" if r["p50"] is None else f"{r['p50']:.2f}"
            each = [", ".join(f"{t:.2f}" for t in r["tps_per_pass"])] if passes else []
            table.add_row(r["ratio"], str(r["clients"]), f"{r['tps']:.2f}", p50, reference, *each)
        out.print(table)

    if report.reads:
        table = Table(
            title=f"point reads of {CATEGORY_VIEW} (sync) by its full group key {POINT_READ}",
            caption="sequential, one AsyncClient; loaded in: the events' load through "
            f"{base['batch']}-row transactions; recompute: the whole view by duckdb over "
            "snapshot scans of the tables",
        )
        for name in (
            "events",
            "loaded in",
            "reads",
            "p50 ms",
            "p99 ms",
            "max ms",
            "recompute s",
            "CPU coord/LTMs/client/other",
        ):
            table.add_column(name, justify="right")
        for r in report.reads:
            if r.load_s is None:  # the base's preload, before any view existed
                loaded = (
                    f"preload: {base['preload_s']:.1f}s "
                    f"({base['preload_events_per_s']:,}/s, no view)"
                )
            else:
                loaded = f"{r.load_s:.1f}s ({r.load_events_per_s:,}/s, sync view)"
            table.add_row(
                f"{r.events:,}",
                loaded,
                str(r.reads),
                ms_cell(r.p50_ms),
                ms_cell(r.p99_ms),
                ms_cell(r.max_ms),
                "-" if r.recompute_s is None else f"{r.recompute_s:.2f}",
                "/".join(
                    f"{r.cpu.get(k, 0):.0f}" for k in ("coordinator", "ltms", "client", "other")
                ),
            )
        out.print(table)

    others = [p.cpu.get("other", 0.0) for p in report.points]
    if others:
        out.print(
            f"CPU used by other processes while measuring: mean "
            f"{sum(others) / len(others):.0f}%, max {max(others):.0f}% of one core "
            f"({os.cpu_count()} cores)"
        )
    failed = [c for c in report.checks if not c["ok"]]
    if failed:
        for c in failed:
            out.print(f"[bold red]CHECK FAILED[/]: {c['case']} / {c['check']}: {c['detail']}")
    else:
        views = sum(1 for c in report.checks if c["check"].startswith("view"))
        out.print(
            f"verification: every view equals its recomputation ({views} checks) and every "
            "case's events match the commits the client saw"
        )


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.views",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ltms", type=int, default=3)
    parser.add_argument("--events", type=int, default=10_000, help="events preloaded")
    parser.add_argument("--batch", type=int, default=500, help="rows per preload transaction")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="closed loop tasks")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="measured time per point (5 s: ±30 %% here)"
    )
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured time per point")
    parser.add_argument(
        "--intervals", type=int, nargs="+", default=[500], help="async refresh intervals, ms"
    )
    parser.add_argument(
        "--big-events",
        type=int,
        default=100_000,
        help="part 3: load events up to this many, then read again (0: skip)",
    )
    parser.add_argument("--reads", type=int, default=1000, help="part 3: sequential point reads")
    parser.add_argument(
        "--parts",
        type=int,
        nargs="+",
        choices=[1, 2, 3, 4],
        default=[1, 2, 3, 4],
        help="1: none/sync/async; 2: hot group; 3: point reads; 4: pg_ivm workload",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="passes over the cases (alternating); ratios are the median over the passes",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="run every case again with the whole cluster in one process (--processes 1)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[],
        help="run every case again in each of these layouts: P processes that each "
        "coordinate, the partitions spread over them (1: the whole cluster in one process)",
    )
    parser.add_argument(
        "--old",
        help="also run every case on the servers of this checkout of older code (git worktree "
        "add DIR REV), in the layout --old-processes gives, each layout of this code against it",
    )
    parser.add_argument(
        "--old-processes",
        type=int,
        default=0,
        help="the old code's layout: 0 (code from before members, a8bd9dc and older: a "
        "coordinator and a process per LTM) or its members (newer code)",
    )
    parser.add_argument(
        "--hbase",
        help="also run every case with the store on this HBase (hbase://HOST:PORT; aggview "
        "hbase start), each against the same case on the embedded store",
    )
    parser.add_argument("--no-fsync", action="store_true", help="servers skip fsync of logs")
    parser.add_argument("--tmp", help="where to make the data directories (default: $TMPDIR)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def _leftovers(pids: Sequence[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ltms < 1 or min(args.clients) < 1 or args.events < 1 or args.reads < 1:
        raise SystemExit("--ltms, --clients, --events and --reads must be at least 1")
    if min(args.intervals) < 1:
        raise SystemExit("--intervals must be positive")
    # clean up as on Ctrl-C, also when started in the background (where SIGINT is ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "fsync": not args.no_fsync,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    report, pids = Report(), []
    t0 = time.perf_counter()
    try:
        run(args, report, pids)
    except KeyboardInterrupt:
        err.print("interrupted; clusters stopped")
        return 130
    found = ratios(report, args)
    print_report(report, found, not args.no_fsync)
    left = _leftovers(pids)
    out.print(
        f"total {time.perf_counter() - t0:.0f}s; "
        + (
            f"[bold red]servers still running: {left}[/]"
            if left
            else f"all {len(pids)} server processes have exited"
        )
    )
    if args.json:
        document = {
            **meta,
            "base": report.base,
            "view_create_s": report.view_create_s,
            "points": [{**asdict(p), "retries_per_s": p.retries_per_s} for p in report.points],
            "ratios": found,
            "reads": [asdict(r) for r in report.reads],
            "checks": report.checks,
            "verified": report.verified,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        args.json.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return 0 if report.verified else 1


if __name__ == "__main__":
    sys.exit(main())
