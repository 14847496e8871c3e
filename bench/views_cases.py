"""The cases ``python -m bench.views`` measures (no view, sync, async, pg_ivm's view; in other
layouts, stores and code) and what it records of them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any

from bench.clusters import hbase_store
from bench.measurements import (
    Result,
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
NO_METRICS = " @no metrics"


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
    if args.without_metrics:
        chosen += [(replace(case, name=f"{case.name}{NO_METRICS}"), "") for case in cases(args)]
    for processes in layouts(args):
        suffix = in_processes(processes)
        chosen += [(replace(case, name=f"{case.name}{suffix}"), "") for case in cases(args)]
    if args.hbase:
        chosen += [
            (replace(case, name=f"{case.name}{ON_HBASE}"), hbase_store(args.hbase))
            for case in cases(args)
        ]
    return chosen
