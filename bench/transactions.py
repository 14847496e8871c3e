"""Transaction throughput and latency of a local cluster (one coordinator, N LTMs).

For every LTM count a fresh :class:`agglauncher.cluster.LocalCluster` is started in a temporary
directory, ``bench(id INT PRIMARY KEY, v INT NOT NULL)`` is created and preloaded, and then, for
every rows-per-transaction count k, transactions that add 1 to ``v`` of k distinct random rows
are run from this one process with ``aggclient.client.AsyncClient``:

* closed loop (default): ``--clients`` asyncio tasks, each sending its next transaction as soon
  as the previous one returns, for ``--seconds`` after ``--warmup`` seconds;
* open loop (``--rate R``): transactions arrive at R per second (Poisson or fixed interval), each
  as its own asyncio task, whatever the state of earlier ones; latency is measured from the
  scheduled arrival, so a client that falls behind shows up in the figures;
* ``--load-fraction F`` runs the closed loop and then the open loop at F times the throughput
  the closed loop reached (e.g. ``--ltms 3 --rows 3 --load-fraction 0.5``).

``--restart`` instead times a restart of a 1-LTM cluster over a preloaded data directory, from
process start to the first successful ``get`` (the LTM loads rows lazily).

    python -m bench.transactions --ltms 1 3 --rows 1 3 --seconds 5
    python -m bench.transactions --restart
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.retry import RetryPolicy, retry_on
from bench.clusters import (
    check_sum,
    hbase_store,
    old_code,
    preload,
    replicas_in_sync,
    running_cluster,
    settle,
    stop_clusters_on_signals,
)
from bench.load import CREATE, TABLE, Ledger, open_clients, run_closed, run_open, transaction
from bench.measurements import (
    MEASURE_COLUMNS,
    Result,
    cpu_cell,
    err,
    ms_cell,
    out,
    per_process_cpu,
    run_facts,
)

# --------------------------------------------------------------------------- modes


async def bench_cluster(
    cluster: LocalCluster, args: argparse.Namespace, setup: str
) -> list[Result]:
    ltms = cluster.ltms
    ledger = Ledger()
    async with AsyncClient(cluster.address, **cluster.client_options("admin")) as admin:
        await admin.sql(CREATE)
        t0 = time.perf_counter()
        await preload(admin, args.preload, args.batch)
        err.print(
            f"{ltms} LTM(s): preloaded {args.preload} rows in {time.perf_counter() - t0:.1f}s"
        )
    await settle(cluster)
    if cluster.replicate:
        await replicas_in_sync(cluster)
    results: list[Result] = []
    for rows in args.rows:
        for channels in args.channels:
            clients = await open_clients(cluster, channels)
            try:
                common = dict(
                    ltms=ltms,
                    rows=rows,
                    table_rows=args.preload,
                    seconds=args.seconds,
                    warmup=args.warmup,
                )
                rates = list(args.rate or [])
                if not args.rate:
                    result = await run_closed(
                        cluster, clients, ledger, tasks=args.clients, **common
                    )
                    result.setup = setup
                    results.append(result)
                    report_line(result)
                    rates = [result.tps * f for f in args.load_fraction or []]
                for rate in rates:
                    await settle(cluster)
                    if rate <= 0:
                        continue
                    result = await run_open(
                        cluster,
                        clients,
                        ledger,
                        rate=rate,
                        poisson=args.arrivals == "poisson",
                        drain=args.drain,
                        **common,
                    )
                    result.setup = setup
                    results.append(result)
                    report_line(result)
            finally:
                for client in clients:
                    await client.close()
            await settle(cluster)
    if args.check:
        err.print(await check_sum(cluster, ledger.row_updates, ledger.ambiguous))
    return results


def report_line(r: Result) -> None:
    load = f"{r.clients} clients" if r.mode == "closed" else f"{r.offered:g}/s offered"
    err.print(
        f"  {r.setup}: {r.ltms} LTM(s), {r.rows} row(s)/tx, {r.channels} channel(s), {load}: "
        f"{r.tps:.0f} tx/s, p50 {ms_cell(r.p50_ms)} ms, p99 {ms_cell(r.p99_ms)} ms, "
        f"{r.retries_per_s:.1f} retries/s, errors {r.errors or 0}, CPU % {cpu_cell(r)}"
        + (f", arrival lag p99 {ms_cell(r.lag_p99_ms)} ms" if r.mode == "open" else "")
        + per_process_cpu(r)
    )


def run_load(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    for ltms in args.ltms:
        for setup in args.setup:  # alternated per LTM count, so drift hits all alike
            if "replicated" in setup and ltms < 2:
                err.print("replication needs at least 2 LTMs: skipped for 1")
                continue
            prefix = f"aggview-bench-{ltms}-{setup}-"
            store = hbase_store(args.hbase) if setup == "hbase" else ""
            code = old_code(args) if setup.startswith("old") else None
            with tempfile.TemporaryDirectory(prefix=prefix, dir=args.tmp) as tmp:
                with running_cluster(
                    Path(tmp), ltms, not args.no_fsync, setup, store, code=code
                ) as cluster:
                    results.extend(asyncio.run(bench_cluster(cluster, args, setup)))
    return results


def setup_ratios(results: Sequence[Result]) -> list[str]:
    """Every setup against its baseline, for every case measured both ways: the old code in
    the same layout (old-<setup>) when it was measured, else the old code (--setup old), else
    plaintext."""
    setups = {r.setup for r in results}
    default = "old" if "old" in setups else "plain"
    by_case = {(r.setup, _case(r)): r for r in results}
    lines = []
    for r in results:
        if r.setup.startswith("old"):
            continue
        baseline = f"old-{r.setup}" if f"old-{r.setup}" in setups else default
        base = by_case.get((baseline, _case(r)))
        if r.setup != baseline and base is not None and base.tps:
            lines.append(
                f"{r.setup} against {baseline}: {r.ltms} LTM(s), {r.rows} row(s)/tx, {r.mode}, "
                f"{r.clients} clients: {r.tps:.0f} vs {base.tps:.0f} tx/s, ratio "
                f"{r.tps / base.tps:.2f}; p50 {ms_cell(r.p50_ms)} vs {ms_cell(base.p50_ms)} ms; "
                f"server CPU {_server_cpu_ms(r):.2f} vs {_server_cpu_ms(base):.2f} ms/tx"
            )
    return lines


def _server_cpu_ms(r: Result) -> float:
    """Milliseconds of server CPU (coordinating processes and LTMs) per committed transaction."""
    if not r.tps:
        return 0.0
    return 10 * (r.cpu.get("coordinator", 0) + r.cpu.get("ltms", 0)) / r.tps


def _case(r: Result) -> tuple[object, ...]:
    return (r.ltms, r.rows, r.mode, r.clients, r.channels, r.offered)


def print_table(results: Sequence[Result], fsync: bool) -> None:
    table = Table(
        title=f"aggview transactions ({'fsync' if fsync else 'no fsync'})",
        caption="ch: client channels; CPU: % of one core used by the coordinator, the LTMs, "
        "this client and other processes",
    )
    for name in ("setup", "LTMs", "rows/tx", "load", "ch", *MEASURE_COLUMNS):
        table.add_column(name, justify="right")
    for r in results:
        load = f"closed {r.clients}" if r.mode == "closed" else f"open {r.offered:g}/s"
        if r.unfinished:
            load += f" ({r.unfinished} unfinished)"
        table.add_row(
            r.setup,
            str(r.ltms),
            str(r.rows),
            load,
            str(r.channels),
            f"{r.tps:.0f}",
            ms_cell(r.p50_ms),
            ms_cell(r.p99_ms),
            ms_cell(r.max_ms),
            f"{r.retries_per_s:.1f}",
            str(sum(r.errors.values())),
            cpu_cell(r),
        )
    out.print(table)


async def _first_get(address: str, key: int, timeout: float = 60.0) -> dict[str, Any]:
    """Times the first successful get, the first commit and a batch of cold reads."""
    ready = RetryPolicy(  # every 5 ms, for ``timeout`` seconds
        attempts=None,
        first_delay=0.005,
        max_delay=0.005,
        spread=(1.0, 1.0),
        deadline=timeout,
        retryable=retry_on(errors.Unavailable),
    )
    async with AsyncClient(address, timeout=10) as client:
        row = await ready.arun(lambda: client.get(TABLE, {"id": key}))
        got = time.perf_counter()
        if row is None:
            raise RuntimeError(f"row {key} is missing after the restart")
        await transaction(client, [key])
        committed = time.perf_counter()
        return {"got": got, "committed": committed}


async def _timed_gets(address: str, keys: Sequence[int], concurrency: int = 32) -> float:
    async with AsyncClient(address) as client:
        pending = iter(keys)
        t0 = time.perf_counter()

        async def worker() -> None:
            for key in pending:
                await client.get(TABLE, {"id": key})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


async def _load_for_restart(address: str, args: argparse.Namespace) -> None:
    async with AsyncClient(address) as client:
        await client.sql(CREATE)
        await preload(client, args.preload, args.batch)


def run_restart(args: argparse.Namespace) -> dict[str, Any]:
    fsync = not args.no_fsync
    keys = random.Random(1).sample(range(args.preload), min(1000, args.preload))
    with tempfile.TemporaryDirectory(prefix="aggview-bench-restart-", dir=args.tmp) as tmp:
        data = Path(tmp)
        with running_cluster(data, 1, fsync) as cluster:
            t0 = time.perf_counter()
            asyncio.run(_load_for_restart(cluster.address, args))
            loaded = time.perf_counter() - t0
            err.print(f"preloaded {args.preload} rows into 1 LTM in {loaded:.1f}s")
            warm_gets = asyncio.run(_timed_gets(cluster.address, keys))
            t_stop = time.perf_counter()
        stopped = time.perf_counter() - t_stop
        store_bytes = sum(p.stat().st_size for p in data.glob("store.db*"))
        log_bytes = sum(p.stat().st_size for p in (data / "ltm-0").glob("*.wal"))
        err.print(f"stopped cleanly in {stopped:.2f}s; restarting over the same directory")

        t_start = time.perf_counter()
        with running_cluster(data, 1, fsync) as cluster:
            listening = time.perf_counter()
            first = asyncio.run(_first_get(cluster.address, keys[0]))
            cold_gets = asyncio.run(_timed_gets(cluster.address, keys[1:]))
    figures = {
        "rows": args.preload,
        "fsync": fsync,
        "preload_s": round(loaded, 3),
        "stop_s": round(stopped, 3),
        "store_bytes": store_bytes,
        "ltm_log_bytes_after_stop": log_bytes,
        "start_to_listening_s": round(listening - t_start, 3),
        "start_to_first_get_s": round(first["got"] - t_start, 3),
        "start_to_first_commit_s": round(first["committed"] - t_start, 3),
        "warm_gets_per_s": round(len(keys) / warm_gets),
        "cold_gets_per_s": round((len(keys) - 1) / cold_gets),
    }
    table = Table(title=f"restart of 1 LTM over {args.preload} rows")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, str(value))
    out.print(table)
    out.print(f"start to first successful get: {figures['start_to_first_get_s']:.3f} s")
    return figures


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.transactions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ltms", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 20], help="rows per tx")
    parser.add_argument("--clients", type=int, default=32, help="closed loop: concurrent tasks")
    parser.add_argument(
        "--channels",
        type=int,
        nargs="+",
        default=[1],
        help="gRPC connections the tasks share (several values: one run each)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per case")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured time per case")
    parser.add_argument(
        "--rate", type=float, nargs="+", help="open loop at these tx/s instead of closed loop"
    )
    parser.add_argument(
        "--load-fraction",
        type=float,
        nargs="+",
        help="after the closed loop, open loop at these fractions of its throughput",
    )
    parser.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    parser.add_argument(
        "--drain", type=float, default=30.0, help="open loop: wait this long for stragglers"
    )
    parser.add_argument("--preload", type=int, default=100_000, help="rows in the table")
    parser.add_argument("--batch", type=int, default=500, help="rows per preload transaction")
    parser.add_argument("--no-fsync", action="store_true", help="servers skip fsync of logs")
    parser.add_argument(
        "--setup",
        nargs="+",
        choices=[
            "plain",
            "tls",
            "replicated",
            "hbase",
            "one-process",
            "processes-2",
            "processes-4",
            "replicated-processes-2",
            "old",
            "old-one-process",
            "old-processes-2",
            "old-processes-4",
            "old-replicated",
            "old-replicated-processes-2",
            "old-tls",
        ],
        default=["plain"],
        help="plaintext (--insecure); TLS with tokens and member checks; replicated LTM logs "
        "(plaintext); the store on HBase (--hbase); the whole cluster in one process "
        "(--processes 1); in 2 or 4 processes that each coordinate (--processes P), also "
        "with their logs copied to each other (replicated-processes-2); the "
        "servers of --old (plaintext; old-<layout>: in that layout; old-tls: secure, in the "
        "default layout). Several: each is also "
        "compared with old, if measured, else with plain",
    )
    parser.add_argument(
        "--old", help="with --setup old: a checkout of older code (git worktree add DIR REV)"
    )
    parser.add_argument(
        "--hbase", help="with --setup hbase: a real HBase's Thrift server, hbase://HOST:PORT"
    )
    parser.add_argument(
        "--no-check", dest="check", action="store_false", help="skip the final sum(v) check"
    )
    parser.add_argument("--restart", action="store_true", help="time a restart instead")
    parser.add_argument("--tmp", help="where to make the data directories (default: $TMPDIR)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rate and args.load_fraction:
        raise SystemExit("--rate and --load-fraction exclude each other")
    if min(args.ltms) < 1 or min(args.rows) < 1 or min(args.channels) < 1 or args.clients < 1:
        raise SystemExit("--ltms, --rows, --channels and --clients must be at least 1")
    if max(args.rows) > args.preload:
        raise SystemExit("--rows cannot exceed --preload")
    stop_clusters_on_signals()
    meta = run_facts(argv)
    try:
        if args.restart:
            report: dict[str, Any] = {**meta, "restart": run_restart(args)}
        else:
            results = run_load(args)
            print_table(results, not args.no_fsync)
            for line in setup_ratios(results):
                out.print(line)
            report = {
                **meta,
                "results": [{**asdict(r), "retries_per_s": r.retries_per_s} for r in results],
            }
    except KeyboardInterrupt:
        err.print("interrupted; clusters stopped")
        return 130
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
