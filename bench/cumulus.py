"""What the Cumulus runtime (``cumulus/runtime/``) costs per update, and what speculation buys
over seed 001's conservative execution, on the dashboard stream of ``bench/m3.py``: its view
(cost and events per category name) compiled to the full M3 program and its updates replayed
through the runtime's switches and DW nodes on the simulator, once per cell of

    mode (speculative, conservative) x DW nodes (1, 2, 4) x switches (1, 2)
    x reordering (off: every message takes 1 virtual ms; on: 1 to 21 ms, seeded),

one update entering per virtual ms and an epoch ending every 1,000 virtual ms.

The stream is bench.m3's: the static tables (20 categories, 5,000 products), then 94 % new
events, 3 % corrections, 2 % deletes, 0.9 % product moves and 0.1 % category renames, each
UPDATE a delete and an insert (the runtime takes one-row inserts and deletes). The static rows
go through the runtime first, in the same run, and count in every figure: the simulator feeds
on an absolute schedule, so a pause to load them first would make the stream's first updates
enter all at once (tens of thousands in conservative mode under reordering).

Per cell: updates/s of wall clock and CPU seconds per 1,000 updates (``time.process_time``) --
the simulator is one CPU-bound process, so these are the per-update cost of the state machines
(switch, nodes, the simulator's queue), not a distributed throughput; latency p50/p99 in
virtual ms from an update's entry to its last write (relative figures under the network model
only); messages per 1,000 updates by type; corrective updates per 1,000 and the deepest
recursion (with one switch none can happen); epochs committed and their lag (p50 of the
timestamps stamped past the cut when it committed, and of the virtual ms from begin to
commit); the largest logs seen at a commit. Then ratios measured in the same run: speculative
over conservative (updates/s, CPU s per 1,000, latency p50) per cell, and correctives with
reordering on over off. Every cell's final maps are compared, untimed, with the reference
interpreter's over the stream; a difference stops the run.

    python -m bench.cumulus                 # 24 cells, 40,000 updates: about 10 min on 2 cores
    python -m bench.cumulus --quick         # 2 nodes only (8 cells), 20,000: about 2 minutes
    python -m bench.cumulus --updates 100000 --json cumulus.json   # bench.m3's length: ~25 min
    python -m bench.cumulus --quick --batch 32  # a switch's 32 updates per message to a node

The default is 40,000 dashboard updates, not bench.m3's 10^5: the full matrix at 10^5 would
take about 25 minutes (a 4-node cell took 70 to 150 s). Per-update costs do not grow with the
stream (the maps the stream reads are sized by the products, not the events), so 40,000
measures them as well. Two figures do depend on the length: conservative mode under reordering
falls behind (about one update per network delay, where one enters per virtual ms), so its
latency and epoch lag grow with the stream; and correctives are rare (a product move or a
category rename in flight with a later event of one of its products): 0 to a dozen per cell.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aggview import loops
from aggview.processes import process_cpu_seconds
from bench import m3
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.printer import print_program
from cumulus.m3.program import Program
from cumulus.runtime.grpc_host import GrpcRuntime, start_node_processes
from cumulus.runtime.messages import Key
from cumulus.runtime.simulator import Network, Report, Simulator
from cumulus.runtime.simulator import Update as OneRow
from loadgen import dashboard

EPOCH_MS = 1000.0  # virtual ms between epoch ends; the simulator's gap between updates is 1
# the default matrix at 40,000 dashboard updates: the full 10^5 takes ~25 minutes (docstring)
DEFAULT: dict[str, Any] = {"updates": 40_000, "nodes": [1, 2, 4], "switches": [1, 2]}
QUICK: dict[str, Any] = {"updates": 20_000, "nodes": [2], "switches": [1, 2]}
Maps = dict[str, dict[Key, Any]]
Cell = tuple[str, int, int, int | None]  # mode, nodes, switches, reorder seed (None: off)
MESSAGES = {  # short column names, in the order of an update's life
    "Dispatch": "Disp",
    "Push": "Push",
    "Corrective": "Corr",
    "Settled": "Sttl",
    "Batch": "Btch",
    "EpochEnd": "EEnd",
    "EpochReady": "ERdy",
    "EpochCommit": "ECmt",
    "EpochEndRequest": "EReq",
}

out = Console(width=None if sys.stdout.isatty() else 210)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 132)


@dataclass(frozen=True)
class Stream:
    """The run's one-row updates in the order the switches take them."""

    updates: list[OneRow]
    static: int  # the first this many load the static tables
    kinds: dict[str, int]  # bench.m3's dashboard updates by kind (before splitting UPDATEs)


def build_stream(count: int, seed: int) -> Stream:
    """bench.m3's static rows and stream, each UPDATE split into a delete and an insert (the
    runtime, like the seeds, takes only those)."""
    scale = dashboard.Scale()
    updates: list[OneRow] = [("+", table, row) for table, row in m3.static_rows(scale)]
    static = len(updates)
    kinds: dict[str, int] = {}
    for kind, table, old, new in m3.stream(count, scale, seed):
        kinds[kind] = kinds.get(kind, 0) + 1
        if old is not None:
            updates.append(("-", table, old))
        if new is not None:
            updates.append(("+", table, new))
    return Stream(updates, static, kinds)


def compile_view() -> Program:
    """The full M3 program of bench.m3's view (every delta materialized), as bench.m3 runs it."""
    tables = m3.schemas()
    plan = plan_of(m3.VIEW_SQL, "cost_by_category", tables.__getitem__)
    return compile_program([plan], tables.__getitem__)


def reference_maps(program: Program, stream: Stream) -> Maps:
    """What every cell's final maps must equal: the reference interpreter over the stream."""
    interpreter = Interpreter(program)
    for update in stream.updates:
        interpreter.apply(*update)
    return {name: dict(store.data) for name, store in interpreter.maps.items()}


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank: defined for a single value too (a short run may commit one epoch)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def run_sim(
    program: Program,
    stream: Stream,
    nodes: int,
    switches: int,
    mode: str,
    reorder: int | None,
    batch: int = 1,
) -> dict[str, Any]:
    """One cell on the simulator host. The figures, and under "maps" the final maps for the
    caller to verify. A grpc or spark host is another function like this one in ``HOSTS``."""
    simulator = Simulator(
        program,
        nodes=nodes,
        switches=switches,
        network=Network(reorder),
        mode=mode,
        epoch_every=EPOCH_MS,
        **({"batch": batch} if batch > 1 else {}),
    )
    wall, cpu = time.perf_counter(), time.process_time()
    report = simulator.run(stream.updates)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        **figures(report, wall, cpu, simulator.latencies(), ms_per_unit=1),
        "virtual_s": report.finished_at / 1000,
        "maps": simulator.maps(),
    }


def figures(
    report: Report, wall: float, cpu: float, latencies: list[float], ms_per_unit: float
) -> dict[str, Any]:
    """One cell's figures from its run's report; latencies and epoch times are in units of
    ``ms_per_unit`` milliseconds (virtual ms on the simulator, seconds on the real hosts)."""
    per_k = 1000 / report.updates
    in_ms = [ms_per_unit * x for x in latencies]
    return {
        "updates": report.updates,
        "wall_s": wall,
        "updates_per_s": report.updates / wall,
        "cpu_s_per_1000": cpu * per_k,
        "latency_ms_p50": percentile(in_ms, 50),
        "latency_ms_p99": percentile(in_ms, 99),
        "messages_per_1000": {k: n * per_k for k, n in sorted(report.messages.items())},
        "correctives_per_1000": report.corrective * per_k,
        "corrective_max_depth": report.max_depth,
        "epochs": len(report.epochs),
        "epoch_lag_ts_p50": percentile([newest - cut for cut, _, _, newest in report.epochs], 50),
        "epoch_lag_ms_p50": percentile([ms_per_unit * (c - b) for _, b, c, _ in report.epochs], 50),
        "peak_logs": dict(report.peak_logs),
    }


def run_grpc(
    program: Program, stream: Stream, nodes: int, switches: int, mode: str, reorder: int | None
) -> dict[str, Any]:
    """One cell with each DW node a process of its own (``aggview cumulus node``)."""
    with tempfile.TemporaryDirectory(prefix="aggview-bench-cumulus-") as base:
        servers = start_node_processes(program, nodes, Path(base), switches=switches, mode=mode)
        try:
            pids = [s.process.pid for s in servers if s.process is not None]
            return _drive(program, stream, [s.address for s in servers], switches, mode, pids)
        finally:
            for server in servers:
                server.stop()


def run_spark(
    program: Program, stream: Stream, nodes: int, switches: int, mode: str, reorder: int | None
) -> dict[str, Any]:
    """One cell with the DW nodes the tasks of one Spark barrier stage (local Spark: its
    Python workers' CPU is not counted, only the driver's)."""
    from aggspark.dw_stage import spark_nodes
    from aggspark.session import spark_session

    text = print_program(program)
    with spark_nodes(spark_session(), text, nodes, switches=switches, mode=mode) as addresses:
        return _drive(program, stream, addresses, switches, mode, [])


def _drive(
    program: Program,
    stream: Stream,
    addresses: list[str],
    switches: int,
    mode: str,
    pids: list[int],
) -> dict[str, Any]:
    """The switches in this process feed the nodes at ``addresses``: wall-clock figures, CPU
    of this process and of the node processes ``pids``."""
    runtime = GrpcRuntime(program, addresses, switches=switches, mode=mode, epoch_ms=int(EPOCH_MS))
    try:
        cpu = time.process_time() + sum(process_cpu_seconds(p) for p in pids)
        wall = time.perf_counter()
        runtime.feed(stream.updates)
        report = runtime.finish()
        wall = time.perf_counter() - wall
        cpu = time.process_time() + sum(process_cpu_seconds(p) for p in pids) - cpu
        latencies = runtime.latencies()
        maps = runtime.maps()
    finally:
        runtime.close()
    return {**figures(report, wall, cpu, latencies, ms_per_unit=1000), "maps": maps}


Host = Callable[[Program, Stream, int, int, str, int | None], dict[str, Any]]
HOSTS: dict[str, Host] = {"sim": run_sim, "grpc": run_grpc, "spark": run_spark}


def verify(cell: Cell, found: Maps, expected: Maps) -> None:
    """Stops the run, naming the cell and the maps, unless the runtime's maps are exact."""
    wrong = [name for name in expected if found.get(name, {}) != expected[name]]
    if wrong:
        raise SystemExit(
            f"NOT VERIFIED: {label(cell)}: maps {', '.join(wrong)} differ from the "
            "reference interpreter's"
        )


def label(cell: Cell) -> str:
    mode, nodes, switches, reorder = cell
    return f"{mode}, {nodes} node(s), {switches} switch(es), reordering {_reorder(reorder)}"


def ratios(figures: dict[Cell, dict[str, Any]]) -> list[dict[str, Any]]:
    """Speculative against conservative at the same (nodes, switches, reordering); correctives
    with reordering on against off at the same (mode, nodes, switches)."""
    found: list[dict[str, Any]] = []
    for (mode, nodes, switches, reorder), spec in figures.items():
        cons = figures.get(("conservative", nodes, switches, reorder))
        if mode != "speculative" or cons is None:
            continue
        rates = spec["updates_per_s"], cons["updates_per_s"]
        cpu = spec["cpu_s_per_1000"], cons["cpu_s_per_1000"]
        p50s = spec["latency_ms_p50"], cons["latency_ms_p50"]
        found.append(
            {
                "ratio": "speculative / conservative",
                "nodes": nodes,
                "switches": switches,
                "reorder": reorder,
                "updates_per_s": rates,
                "updates_per_s_ratio": rates[0] / rates[1],
                "cpu_s_per_1000": cpu,
                "cpu_s_per_1000_ratio": cpu[0] / cpu[1],
                "latency_p50": p50s,
                "latency_p50_ratio": p50s[0] / p50s[1] if None not in p50s and p50s[1] else None,
            }
        )
    for (mode, nodes, switches, reorder), on in figures.items():
        off = figures.get((mode, nodes, switches, None))
        if reorder is None or off is None:
            continue
        pair = on["correctives_per_1000"], off["correctives_per_1000"]
        found.append(
            {
                "ratio": "correctives per 1,000: reordering on / off",
                "mode": mode,
                "nodes": nodes,
                "switches": switches,
                "reorder": reorder,
                "correctives_per_1000": pair,
                "correctives_ratio": pair[0] / pair[1] if pair[1] else None,
            }
        )
    return found


def revision() -> str:
    """The commit measured, and whether cumulus/ had uncommitted changes (it moves quickly)."""
    git = ["git", "-C", str(Path(__file__).resolve().parents[1])]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "cumulus"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return commit + (" + uncommitted changes in cumulus/" if dirty else "")


def _fig(value: float | None) -> str:
    """About three significant digits: the figures span 0.01 to 10^6."""
    if value is None:
        return "-"
    return (
        f"{value:,.0f}"
        if abs(value) >= 100
        else f"{value:.1f}"
        if abs(value) >= 10
        else (f"{value:.2f}")
    )


def _times(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value >= 0.01 else f"{value:.2g}x"


def _reorder(seed: int | None) -> str:
    return "off" if seed is None else f"seed {seed}"


def print_table(figures: dict[Cell, dict[str, Any]], title: str, host: str) -> None:
    seen = {k for f in figures.values() for k in f["messages_per_1000"]}
    kinds = [k for k in MESSAGES if k in seen] + sorted(seen - set(MESSAGES))
    logs = sorted({k for f in figures.values() for k in f["peak_logs"]})
    table = Table(
        title=title,
        caption=(
            "upd/s, CPU s/1k: the simulator's run, one process (the state machines' cost per "
            "update). p50/p99: virtual ms"
            if host == "sim"
            else "upd/s: wall clock, updates entering as fast as the nodes take them (at most "
            "20,000 operations outstanding, so latency is mostly queueing); CPU s/1k: the "
            "driver and the node processes (a Spark stage's workers are not counted). p50/p99: "
            "wall-clock ms"
        )
        + " from an update's entry to its last write. "
        + ", ".join(f"{MESSAGES[k]}: {k}" for k in kinds if MESSAGES.get(k, k) != k)
        + " messages per 1,000 updates. corr/1k: corrective updates per 1,000, depth: the "
        "deepest. lag: p50 over epochs of timestamps stamped past the cut at commit, and of "
        + ("virtual " if host == "sim" else "")
        + "ms from begin to commit. Peak logs: entries, the largest at a commit",
    )
    columns = ["mode", "nodes", "sw", "reorder", "upd/s", "CPU s/1k", "p50 ms", "p99 ms"]
    columns += [MESSAGES.get(k, k) for k in kinds]
    columns += ["corr/1k", "depth", "epochs", "lag ts", "lag ms"]
    columns += [f"peak {name.removesuffix('_entries').replace('_', ' ')}" for name in logs]
    for name in columns:
        table.add_column(name, justify="left" if name == "mode" else "right")
    for (mode, nodes, switches, reorder), f in figures.items():
        table.add_row(
            mode[:4],
            str(nodes),
            str(switches),
            _reorder(reorder),
            f"{f['updates_per_s']:,.0f}",
            f"{f['cpu_s_per_1000']:.3f}",
            _fig(f["latency_ms_p50"]),
            _fig(f["latency_ms_p99"]),
            *(_fig(f["messages_per_1000"].get(k, 0.0)) for k in kinds),
            f"{f['correctives_per_1000']:.2f}",
            str(f["corrective_max_depth"]),
            str(f["epochs"]),
            _fig(f["epoch_lag_ts_p50"]),
            _fig(f["epoch_lag_ms_p50"]),
            *(f"{f['peak_logs'].get(k, 0):,}" for k in logs),
        )
    out.print(table)


def print_ratios(found: list[dict[str, Any]]) -> None:
    modes = Table(
        title="speculative / conservative, same nodes, switches and reordering",
        caption="CPU s/1k: steadier than upd/s when other work shares the cores",
    )
    for name in (
        "nodes",
        "sw",
        "reorder",
        "upd/s spec",
        "cons",
        "ratio",
        "CPU s/1k spec",
        "cons",
        "ratio",
        "p50 ms spec",
        "cons",
        "ratio",
    ):
        modes.add_column(name, justify="right")
    reorder = Table(title="corrective updates per 1,000: reordering on / off, same cell")
    for name in ("mode", "nodes", "sw", "off", "on", "on/off"):
        reorder.add_column(name, justify="left" if name == "mode" else "right")
    for r in found:
        where = [str(r["nodes"]), str(r["switches"])]
        if "correctives_ratio" in r:
            on, off = r["correctives_per_1000"]
            reorder.add_row(
                r["mode"], *where, f"{off:.2f}", f"{on:.2f}", _times(r["correctives_ratio"])
            )
        else:
            rates, p50s = r["updates_per_s"], r["latency_p50"]
            modes.add_row(
                *where,
                _reorder(r["reorder"]),
                f"{rates[0]:,.0f}",
                f"{rates[1]:,.0f}",
                _times(r["updates_per_s_ratio"]),
                f"{r['cpu_s_per_1000'][0]:.3f}",
                f"{r['cpu_s_per_1000'][1]:.3f}",
                _times(r["cpu_s_per_1000_ratio"]),
                _fig(p50s[0]),
                _fig(p50s[1]),
                _times(r["latency_p50_ratio"]),
            )
    for table in (modes, reorder):
        if table.row_count:
            out.print(table)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, with --quick's or the default matrix filled in where none was given."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.cumulus", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--host",
        default="sim",
        help="sim (virtual time), grpc (node processes) or spark (a barrier stage); the last "
        "two measure wall-clock time and take no --reorder cells (two switches reorder)",
    )
    parser.add_argument(
        "--updates", type=int, help=f"dashboard updates (default {DEFAULT['updates']:,})"
    )
    parser.add_argument("--nodes", type=_ints, help="DW node counts (default 1,2,4)")
    parser.add_argument("--switches", type=_ints, help="switch counts (default 1,2)")
    parser.add_argument(
        "--modes",
        type=lambda t: [m for m in t.split(",") if m],
        default=["speculative", "conservative"],
    )
    parser.add_argument("--reorder-seed", type=int, default=7, help="the reordering cells' seed")
    parser.add_argument("--seed", type=int, default=42, help="the stream's seed, as bench.m3")
    parser.add_argument("--quick", action="store_true", help="20,000 updates, 2 nodes: 8 cells")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure here")
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="sim: updates per switch message, a node's replies one message per destination "
        "(default 1: every message alone)",
    )
    parser.add_argument(
        "--collector",
        choices=["servers", "default"],
        default="servers",
        help="this process's cyclic collector as aggview's servers run it (default) or CPython's",
    )
    args = parser.parse_args(argv)
    if args.host not in HOSTS:
        parser.error(f"--host is one of {', '.join(HOSTS)}")
    if not args.modes or not set(args.modes) <= {"speculative", "conservative"}:
        parser.error("--modes takes speculative and/or conservative, comma-separated")
    for name, value in (QUICK if args.quick else DEFAULT).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch > 1 and args.host != "sim":
        parser.error("--batch is the simulator's (the grpc and spark hosts batch per stream)")
    if args.updates < 1 or min(args.nodes + args.switches, default=0) < 1:
        parser.error("--updates, --nodes and --switches take numbers of at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.collector == "servers":
        loops.collect_less()
    started, load = time.perf_counter(), os.getloadavg()[0]
    measured = revision()  # before the run: the code imported now is the code measured
    cells: list[Cell] = sorted(
        itertools.product(
            args.modes,
            args.nodes,
            args.switches,
            [None, args.reorder_seed] if args.host == "sim" else [None],
        ),
        key=lambda c: (c[1], c[2], c[3] is not None, c[0] != "speculative"),
    )
    program = compile_view()
    stream = build_stream(args.updates, args.seed)
    kinds = ", ".join(f"{n:,} {k}" for k, n in stream.kinds.items())
    header = (
        f"{len(stream.updates):,} one-row updates per cell: {stream.static:,} static rows, then "
        f"{args.updates:,} dashboard updates ({kinds}), each UPDATE a delete and an insert"
    )
    err.print(header)
    expected = reference_maps(program, stream)
    figures: dict[Cell, dict[str, Any]] = {}
    for number, cell in enumerate(cells, 1):
        mode, nodes, switches, reorder = cell
        with err.status(f"[{number}/{len(cells)}] {label(cell)}"):
            host = HOSTS[args.host]
            if args.batch > 1:
                host = functools.partial(run_sim, batch=args.batch)
            figures[cell] = host(program, stream, nodes, switches, mode, reorder)
        verify(cell, figures[cell].pop("maps"), expected)
        err.print(
            f"[{number}/{len(cells)}] {label(cell)}: {figures[cell]['wall_s']:.1f} s, verified"
        )

    total, load = time.perf_counter() - started, (load, os.getloadavg()[0])
    out.print(header)
    out.print(
        f"view: {m3.VIEW_SQL}\nhost {args.host}, {measured}, batch {args.batch}; an epoch "
        f"ends every {EPOCH_MS:,.0f} ms; "
        + (
            "one update enters per virtual ms; ms are virtual"
            if args.host == "sim"
            else "updates enter as fast as the nodes take them; ms are wall-clock"
        )
    )
    print_table(figures, f"Cumulus runtime, {len(stream.updates):,} updates per cell", args.host)
    found = ratios(figures)
    print_ratios(found)
    out.print(f"verified: all {len(cells)} cells' final maps equal the reference interpreter's")
    out.print(
        f"total wall time {total / 60:.1f} min; load average {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end (above 1, other work shared the cores: see CPU s/1k)"
    )
    if args.json:
        document = {
            "host": args.host,
            "revision": measured,
            "view": m3.VIEW_SQL,
            "dashboard_updates": args.updates,
            "kinds": stream.kinds,
            "static_rows": stream.static,
            "updates_per_cell": len(stream.updates),
            "seed": args.seed,
            "epoch_every_virtual_ms": EPOCH_MS,
            "batch": args.batch,
            "verified": True,
            "total_wall_s": total,
            "load_average": load,
            "cells": [
                {"mode": c[0], "nodes": c[1], "switches": c[2], "reorder": c[3], **f}
                for c, f in figures.items()
            ],
            "ratios": found,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
