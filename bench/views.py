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
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from aggclient import Client
from aggclient.client import AsyncClient
from agglauncher.cluster import AS_START, LocalCluster
from bench.clusters import old_code, running_cluster, settle, stop_clusters_on_signals
from bench.load import Ledger
from bench.measurements import (
    cpu_cell,
    err,
    ms_cell,
    out,
    per_process_cpu,
    run_facts,
)
from bench.views_cases import (
    NO_METRICS,
    OLD,
    RECOMPUTE_TABLES,
    SCALE,
    Case,
    Point,
    Report,
    in_processes,
    layouts,
    store_cases,
)
from bench.views_report import print_report, ratios
from bench.views_workload import insert_events, make_event, point_reads, run_inserts, verify
from loadgen import dashboard

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
                metrics = not case.name.endswith(NO_METRICS)
                with running_cluster(
                    data,
                    args.ltms,
                    not args.no_fsync,
                    store=store,
                    processes=processes,
                    code=code,
                    metrics=metrics,
                ) as cluster:
                    pids.extend(s.process.pid for s in cluster.servers if s.process is not None)
                    loop.run_until_complete(bench_case(cluster, case, args, report, pass_index))
                shutil.rmtree(data)


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
        "--without-metrics",
        action="store_true",
        help="also run every case with members that keep no metrics (--no-metrics): the "
        "ratio metrics/none is what the metrics cost on the hot path",
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
    stop_clusters_on_signals()
    meta = run_facts(argv, fsync=not args.no_fsync)
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
