"""The report of ``python -m bench.views``: each case's ratio to its baseline, and the tables
printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from rich.table import Table

from bench.measurements import (
    MEASURE_COLUMNS,
    cpu_cell,
    ms_cell,
    out,
)
from bench.views_cases import (
    CATEGORY_VIEW,
    NO_METRICS,
    OLD,
    ON_HBASE,
    PGIVM_REFERENCE,
    POINT_READ,
    Report,
    cases,
    in_processes,
    layouts,
)


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
    if args.without_metrics:
        for clients in args.clients:
            for case in cases(args):
                on, off = (case.name, "spread"), (f"{case.name}{NO_METRICS}", "spread")
                add(f"{case.name}: metrics/none", clients, on, off)
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
    """The points, the ratios and the point reads as tables, then the other processes' CPU
    and the verdict of the checks."""
    _print_points(report, fsync)
    if found:
        _print_ratios(found)
    if report.reads:
        _print_reads(report)
    _print_verdict(report)


def _print_points(report: Report, fsync: bool) -> None:
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


def _print_ratios(found: list[dict[str, Any]]) -> None:
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


def _print_reads(report: Report) -> None:
    base = report.base
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
                f"preload: {base['preload_s']:.1f}s ({base['preload_events_per_s']:,}/s, no view)"
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
            "/".join(f"{r.cpu.get(k, 0):.0f}" for k in ("coordinator", "ltms", "client", "other")),
        )
    out.print(table)


def _print_verdict(report: Report) -> None:
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
