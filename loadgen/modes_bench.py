"""``aggview bench modes``: the comparison the mission asks for, on two workloads.

- **The thesis's dashboard stream**: no view, the CloudTPS modes (sync; async at 100 ms and
  1 s) and Cumulus (speculative on 1, 2 and 4 DW nodes; conservative on 2; and an epoch a
  second with changes fed every 50 ms, whose tentative reads are measured too), each on a
  cluster of its own with the same data. For each it reports write throughput (and its ratio
  to no view), p50/p99 commit latency, freshness (from a probe's commit to a read that holds
  it), the share of reads under load that were the exact answer at their timestamp, CPU per
  event, the runtime's messages and corrective updates per 1,000 updates, and whether the view
  was exact at the end. 2 % of the transactions move a product to another category
  (``--moves``: its events' cost moves between groups) and 1 % rename a category
  (``--renames``): in cumulus mode the updates of the members' switches meet out of order
  (corrective updates). It is the dashboard
  benchmark (``loadgen.dashboard_bench``) with these modes and smaller defaults; every option
  of ``aggview bench dashboard`` applies.
- **The TPC-W ordering mix** (``--tpcw-seconds``, 0 to skip; needs the Spark layer): one
  populated cluster, the four TPC-W views in each mode in turn (none, mixed, sync, async,
  cumulus; switched live between runs), web interactions per second and their latency, and
  every view verified against Spark's recomputation after each run.

    aggview bench modes                         # about 4 minutes on 2 cores
    aggview bench modes --hot                   # every event into one group
    aggview bench modes --sizes 1 --seconds 3 --modes none sync cumulus:100:2 --tpcw-seconds 0
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agglauncher.cluster import LocalCluster, checked_processes
from loadgen import dashboard_bench, tpcw_bench

DEFAULT_MODES = [
    "none",
    "sync",
    "async:100",
    "async:1000",
    "cumulus:100:1",
    "cumulus:100:2",
    "cumulus:100:4",
    "cumulus:100:2:conservative",
    "cumulus:1000:2:feed50",
]
# 2 % of the dashboard clients' transactions move a product to another category and 1 % rename
# a category: writes of the dimensions the events join, at every member, so a cumulus view's
# switches meet out of order and correct (a category is read by every 20th event)
MOVES = 0.02
RENAMES = 0.01
TPCW_MODES = ("none", "mixed", "sync", "async", "cumulus")
TPCW_SCALE = {"browsers": 4, "items": 1000, "customers_per_browser": 10}
TPCW_INTERVAL_MS = 100  # the async views' refresh interval and the cumulus views' epoch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    dashboard_bench.add_arguments(parser)
    parser.add_argument(
        "--tpcw-seconds",
        type=float,
        default=4.0,
        help="length of each TPC-W ordering run (0: no TPC-W comparison)",
    )
    parser.set_defaults(
        modes=DEFAULT_MODES,
        sizes=[1, 10],
        seconds=4.0,
        out="aggview-modes",
        moves=MOVES,
        renames=RENAMES,
    )


def run(args: argparse.Namespace, options: dict[str, Any]) -> None:
    dashboard_bench.run(args, options)
    if args.tpcw_seconds > 0 and not args.address:
        with (
            tempfile.TemporaryDirectory(prefix="aggview-tpcw-") as tmp,
            LocalCluster(
                Path(tmp) / "data",
                ltms=args.ltms,
                processes=checked_processes(args.ltms, args.processes),
            ) as cluster,
        ):
            rows = run_tpcw(args.tpcw_seconds, cluster.address, Path(args.out))
        print_tpcw(rows, Console())


def run_tpcw(
    seconds: float,
    address: str,
    out: Path,
    modes: tuple[str, ...] = TPCW_MODES,
    scale: dict[str, int] = TPCW_SCALE,
) -> list[dict[str, Any]]:
    """The ordering mix once per view mode on the cluster at ``address`` (populated by the
    first run, through Spark; the views switched live between runs)."""
    rows = []
    for mode in modes:
        args = _tpcw_defaults()
        args.address = address
        args.mix, args.seconds, args.view_mode = "ordering", seconds, mode
        args.interval_ms, args.out = TPCW_INTERVAL_MS, str(out / f"tpcw-{mode}")
        for name, value in scale.items():
            setattr(args, name, value)
        tpcw_bench.run(args, {})
        data = json.loads((out / f"tpcw-{mode}" / "tpcw.json").read_text())
        whole = next(r for r in data["rows"] if r["interaction"] == "all")
        verification = data["results"]["verification"]
        rows.append(
            {
                "views": mode,
                "wips": whole["per_s"],
                "p50_ms": whole["p50_ms"],
                "p99_ms": whole["p99_ms"],
                "verified": all(v["ok"] for v in verification)
                if isinstance(verification, list)
                else None,
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tpcw_modes.json").write_text(json.dumps(rows, indent=2))
    return rows


def _tpcw_defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tpcw_bench.add_arguments(parser)
    return parser.parse_args([])


def print_tpcw(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="TPC-W ordering mix: web interactions per second by view mode")
    for column in ("views", "WIPS", "/ none", "p50 ms", "p99 ms", "verified"):
        table.add_column(column, justify="left" if column == "views" else "right")
    base = next((r["wips"] for r in rows if r["views"] == "none"), None)
    for row in rows:
        ratio = f"{row['wips'] / base:.2f}" if base else "-"
        table.add_row(
            row["views"],
            f"{row['wips']:.1f}",
            ratio,
            f"{row['p50_ms']:.1f}" if row["p50_ms"] is not None else "-",
            f"{row['p99_ms']:.1f}" if row["p99_ms"] is not None else "-",
            str(row["verified"]),
        )
    console.print(table)
