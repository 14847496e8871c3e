"""``aggview cumulus replay``: views compiled to one M3 program, an update stream from a CSV
file run through the Cumulus runtime, the views and the run's figures written to a directory.

The stream file has one update per line: ``op,table,v1,v2,...`` with ``op`` ``+`` or ``-`` and
the values in the table's column order (standard CSV quoting; DATE as ISO-8601, BOOL as
true/false, an empty field is NULL). A line that does not fit the schema stops the replay
before it is applied, naming the line and how far the replay got.

Hosts: ``sim`` (the seeded simulator, where one virtual millisecond passes between two updates
and ``--epoch-ms`` is in those milliseconds), ``grpc`` (each DW node a process of its own) and
``spark`` (the DW nodes as the tasks of one barrier stage); the last two run the same nodes over
gRPC and measure wall-clock time. Modes: ``speculative`` and ``conservative``. The run ends by
committing a last epoch, so the views written are committed snapshots holding every update.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.schema import TableSchema
from cumulus.m3.command import TableFromCreate, tables_of
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.printer import print_program
from cumulus.m3.program import Program, Source
from cumulus.m3.readout import read_view
from cumulus.runtime.simulator import Network, Simulator, Update, holding
from cumulus.sqltext import divided_as_views_divide

HOSTS = ("sim", "grpc", "spark")
MODES = ("speculative", "conservative")
_TRUE, _FALSE = {"true", "t", "1"}, {"false", "f", "0"}


@dataclass
class ReplayConfig:
    schema_sql: str
    views: list[tuple[str, str]]  # (name, SELECT)
    stream: Path
    out: Path
    delimiter: str = ","
    host: str = "sim"
    nodes: int = 2
    switches: int = 1
    mode: str = "speculative"
    reorder: int | None = None
    epoch_ms: int = 1000
    check: bool = False
    progress: Callable[[str], None] | None = None  # told how far the replay got, now and then


@dataclass
class ReplayResult:
    updates: int
    differences: list[str]
    stats: dict[str, Any]


def add_cumulus_commands(sub: Any, run: Callable[[argparse.Namespace], None]) -> Any:
    """Adds ``aggview cumulus replay``; returns the ``cumulus`` subcommands for more."""
    cumulus = sub.add_parser("cumulus", help="views as M3 programs on the Cumulus runtime")
    actions = cumulus.add_subparsers(dest="action", required=True)
    parser = actions.add_parser(
        "replay", help="run an update stream (CSV) through the runtime; write views and stats"
    )
    parser.add_argument("--schema", required=True, help="a file of CREATE TABLE statements")
    parser.add_argument(
        "--view", action="append", required=True, metavar='NAME="SELECT ..."', help="repeatable"
    )
    parser.add_argument("--stream", required=True, help="op,table,v1,v2,... lines")
    parser.add_argument("--delimiter", default=",", help="between the fields of a line")
    parser.add_argument(
        "--host", choices=HOSTS, default="sim", help="where the DW nodes run (sim: in this process)"
    )
    parser.add_argument("--nodes", type=int, default=2, help="DW nodes")
    parser.add_argument("--switches", type=int, default=1, help="update streams")
    parser.add_argument(
        "--mode", choices=MODES, default="speculative", help="how the DW nodes order updates"
    )
    parser.add_argument(
        "--reorder",
        type=int,
        default=None,
        metavar="SEED",
        help="delay messages at random, from SEED (default: in order)",
    )
    parser.add_argument("--epoch-ms", type=int, default=1000, help="how often an epoch commits")
    parser.add_argument("--out", required=True, help="where NAME.csv and stats.json go")
    parser.add_argument(
        "--check", action="store_true", help="compare with the interpreter and duckdb (exit 1)"
    )
    parser.set_defaults(run=run)
    return actions


def config_from(args: argparse.Namespace) -> ReplayConfig:
    try:
        schema_sql = Path(args.schema).read_text()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read --schema {args.schema}: {exc}") from None
    views = []
    for item in args.view:
        name, sep, select = item.partition("=")
        if not sep or not name.strip() or not select.strip():
            raise errors.InvalidArgument(f'--view takes NAME="SELECT ...", not {item!r}')
        views.append((name.strip(), select.strip()))
    return ReplayConfig(
        schema_sql,
        views,
        Path(args.stream),
        Path(args.out),
        args.delimiter,
        args.host,
        args.nodes,
        args.switches,
        args.mode,
        args.reorder,
        args.epoch_ms,
        args.check,
    )


def run_replay(
    args: argparse.Namespace,
    table_from_create: TableFromCreate,
    spark_nodes: SparkNodes | None = None,
) -> None:
    from rich.console import Console

    config = config_from(args)
    with Console(stderr=True).status("replaying") as status:
        config.progress = status.update
        result = replay(config, table_from_create, spark_nodes)
    stats = result.stats
    print(
        f"{result.updates} updates through {stats['nodes']} node(s) and {stats['switches']} "
        f"switch(es): {stats['updates_per_s']} updates/s, {stats['corrective_updates']} "
        f"corrective updates; views and stats.json in {args.out}"
    )
    if result.differences:
        for difference in result.differences:
            print(f"DIFFERS: {difference}")
        raise SystemExit(1)
    if stats["checked"]:
        print("checked: every view equals the reference interpreter's and duckdb's")


def compile_views(
    schema_sql: str, views: list[tuple[str, str]], table_from_create: TableFromCreate
) -> tuple[Program, dict[str, TableSchema]]:
    tables = tables_of(schema_sql, table_from_create)

    def table(name: str) -> TableSchema:
        if name not in tables:
            raise errors.UnknownTable(f"unknown table {name!r} (not in the schema file)")
        return tables[name]

    if not views:
        raise errors.InvalidArgument('give at least one --view NAME="SELECT ..."')
    plans = [plan_of(select, name, table) for name, select in views]
    return compile_program(plans, table), tables


def read_stream(path: Path, program: Program, delimiter: str) -> Iterator[tuple[int, Update]]:
    """(line number, update) for every line, each checked against the schema."""
    sources = {s.name: s for s in program.sources}
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read --stream {path}: {exc.strerror}") from None
    with handle:
        for number, fields in enumerate(csv.reader(handle, delimiter=delimiter), 1):
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            yield number, _update(number, fields, sources)


def _update(number: int, fields: list[str], sources: dict[str, Source]) -> Update:
    where = f"stream line {number}"
    op, table, *values = fields
    if op not in ("+", "-"):
        raise errors.InvalidArgument(f"{where}: the operation must be + or -, not {op!r}")
    source = sources.get(table)
    if source is None:
        raise errors.UnknownTable(f"{where}: no view reads a table {table!r}")
    if len(values) != len(source.columns):
        raise errors.InvalidArgument(
            f"{where}: {table} has {len(source.columns)} columns, the line gives {len(values)}"
        )
    row = []
    for column, text in zip(source.columns, values, strict=True):
        row.append(_value(where, f"{table}.{column.name}", column.type.kind, text))
    return (op, table, row)


def _value(where: str, column: str, kind: str, text: str) -> Any:
    if text == "":
        return None
    try:
        if kind == "INT":
            return int(text)
        if kind == "FLOAT":
            return float(text)
        if kind == "DECIMAL":
            return Decimal(text)
        if kind == "DATE":
            return datetime.date.fromisoformat(text)
        if kind == "BOOL":
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError
    except (ValueError, InvalidOperation):
        raise errors.TypeMismatch(f"{where}: {text!r} is not a {kind} for {column}") from None
    return text


# Spark's DW node stage (aggspark.dw_stage.spark_nodes), given by the caller: this layer
# does not import Spark. (program text, nodes, switches, mode) -> a context of node addresses.
SparkNodes = Callable[[str, int, int, str], AbstractContextManager[list[str]]]


def replay(
    config: ReplayConfig, table_from_create: TableFromCreate, spark_nodes: SparkNodes | None = None
) -> ReplayResult:
    if config.host not in HOSTS:
        raise errors.InvalidArgument(f"--host is one of {', '.join(HOSTS)}")
    if config.host != "sim" and config.reorder is not None:
        raise errors.InvalidArgument(
            "--reorder injects delays in the simulator only; over gRPC, two or more --switches "
            "reorder for real"
        )
    if config.mode not in MODES:
        raise errors.InvalidArgument(f"--mode is one of {', '.join(MODES)}")
    if config.epoch_ms <= 0:
        raise errors.InvalidArgument("--epoch-ms must be positive")
    if config.nodes < 1 or config.switches < 1:
        raise errors.InvalidArgument("--nodes and --switches must be at least 1")
    program, tables = compile_views(config.schema_sql, config.views, table_from_create)
    with _runtime(config, program, spark_nodes) as simulator:
        return _replay(config, program, tables, simulator)


@contextlib.contextmanager
def _runtime(
    config: ReplayConfig, program: Program, spark_nodes: SparkNodes | None
) -> Iterator[Any]:
    """The simulator, or DW nodes (processes, or Spark tasks) and their driver, stopped after."""
    if config.host == "sim":
        yield Simulator(
            program,
            nodes=config.nodes,
            switches=config.switches,
            network=Network(config.reorder),
            measure_bytes=True,
            mode=config.mode,
            epoch_every=float(config.epoch_ms),
        )
        return
    from cumulus.runtime.grpc_host import GrpcRuntime

    with _node_addresses(config, program, spark_nodes) as addresses:
        runtime = GrpcRuntime(
            program,
            addresses,
            switches=config.switches,
            mode=config.mode,
            epoch_ms=config.epoch_ms,
        )
        try:
            yield runtime
        finally:
            runtime.close()


@contextlib.contextmanager
def _node_addresses(
    config: ReplayConfig, program: Program, spark_nodes: SparkNodes | None
) -> Iterator[list[str]]:
    """The DW nodes' addresses: Spark tasks, or processes of our own, stopped afterwards."""
    if config.host == "spark":
        if spark_nodes is None:
            raise errors.FailedPrecondition("--host spark needs the Spark layer (aggview[spark])")
        text = print_program(program)
        with spark_nodes(text, config.nodes, config.switches, config.mode) as addresses:
            yield addresses
        return
    from cumulus.runtime.grpc_host import start_node_processes

    with tempfile.TemporaryDirectory(prefix="aggview-cumulus-") as base:
        servers = start_node_processes(
            program, config.nodes, Path(base), switches=config.switches, mode=config.mode
        )
        try:
            yield [s.address for s in servers]
        finally:
            for server in servers:
                server.stop()


def _replay(
    config: ReplayConfig, program: Program, tables: dict[str, TableSchema], simulator: Any
) -> ReplayResult:
    reference = Interpreter(program) if config.check else None
    applied: list[Update] = []
    started = time.perf_counter()
    last = 0
    try:
        for number, update in read_stream(config.stream, program, config.delimiter):
            try:
                simulator.check(update)  # the whole row, before anything of it is applied
            except errors.AggviewError as exc:
                raise type(exc)(f"stream line {number}: {exc}") from None
            simulator.feed([update])
            if reference is not None:
                reference.apply(*update)
            applied.append(update)
            last = number
            if config.progress is not None and len(applied) % 1000 == 0:
                rate = len(applied) / max(time.perf_counter() - started, 1e-9)
                config.progress(f"replaying: {len(applied):,} updates, {rate:,.0f}/s")
    except errors.AggviewError as exc:
        raise type(exc)(
            f"{exc}; the replay stopped there, after {len(applied)} updates (through line {last})"
        ) from None
    if config.progress is not None:
        config.progress(f"committing the last epoch after {len(applied):,} updates")
    report = simulator.finish()
    seconds = time.perf_counter() - started
    config.out.mkdir(parents=True, exist_ok=True)
    views = {v.name: v for v in program.views}
    cut, snapshot = simulator.snapshot()
    results = {name: read_view(holding(program, snapshot), views[name]) for name, _ in config.views}
    for name, rows in results.items():
        _write_csv(config.out / f"{name}.csv", views[name], rows)
    differences: list[str] = []
    if reference is not None:
        differences = _check(config, program, tables, applied, results, reference)
    latencies = simulator.latencies()
    stats = {
        "host": config.host,
        "mode": config.mode,
        "nodes": config.nodes,
        "switches": config.switches,
        "reorder": config.reorder,
        "updates": report.updates,
        "seconds": round(seconds, 3),
        "updates_per_s": round(report.updates / seconds, 1) if seconds else None,
        # the simulator's latencies are in virtual ms, the processes' in seconds of wall time
        "latency_unit": "virtual ms" if config.host == "sim" else "s",
        "latency_p50": _percentile(latencies, 50),
        "latency_p99": _percentile(latencies, 99),
        "messages": dict(report.messages),
        "bytes": dict(simulator.bytes),
        "messages_per_1000_updates": {
            k: round(1000 * v / max(report.updates, 1), 1) for k, v in report.messages.items()
        },
        "corrective_updates": report.corrective,
        "corrective_max_depth": report.max_depth,
        "epochs": len(report.epochs),
        "committed_ts": cut,
        "epoch_lag_ts_p50": _percentile([newest - c for c, _, _, newest in report.epochs], 50),
        "epoch_commit_virtual_ms_p50": _percentile([end - b for _, b, end, _ in report.epochs], 50),
        "peak_log_sizes": dict(report.peak_logs),
        "checked": config.check,
        "differences": differences,
    }
    (config.out / "stats.json").write_text(json.dumps(stats, indent=2, default=str) + "\n")
    return ReplayResult(report.updates, differences, stats)


def _check(
    config: ReplayConfig,
    program: Program,
    tables: dict[str, TableSchema],
    applied: list[Update],
    results: dict[str, list[dict[str, Any]]],
    reference: Interpreter,
) -> list[str]:
    """Every view against the reference interpreter and against duckdb over the final tables."""
    import duckdb

    found = []
    views = {v.name: v for v in program.views}
    for name, _ in config.views:
        if _rows(results[name]) != _rows(read_view(reference, views[name])):
            found.append(f"{name}: the runtime's rows differ from the reference interpreter's")
    con = duckdb.connect()
    live: dict[str, Counter[tuple[Any, ...]]] = {s.name: Counter() for s in program.sources}
    for sign, table, row in applied:
        live[table][tuple(row)] += 1 if sign == "+" else -1
    for source in program.sources:
        schema = tables[source.name]
        columns = ", ".join(f'"{c.name}" {c.type.duckdb()}' for c in schema.columns)
        con.execute(f'CREATE TABLE "{source.name}" ({columns})')
        marks = ", ".join("?" for _ in schema.columns)
        for row, count in live[source.name].items():
            for _ in range(count):
                con.execute(f'INSERT INTO "{source.name}" VALUES ({marks})', list(row))
    for name, select in config.views:
        try:
            expected = con.execute(divided_as_views_divide(select)).fetchall()
        except duckdb.Error as exc:  # a difference to report, not a crash before stats.json
            found.append(f"{name}: duckdb cannot recompute it: {exc}")
            continue
        if not _close(_rows(results[name]), _rows([dict(enumerate(r)) for r in expected])):
            found.append(f"{name}: the runtime's rows differ from duckdb's recomputation")
    return found


def _rows(rows: list[dict[Any, Any]]) -> list[tuple[Any, ...]]:
    """Rows as sorted tuples, numbers compared by value (FLOAT to 9 significant digits)."""

    def norm(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.9g}")
        if isinstance(value, Decimal):
            return float(value) if value != value.to_integral_value() else int(value)
        return value

    return sorted((tuple(norm(v) for v in row.values()) for row in rows), key=repr)


def _close(ours: list[tuple[Any, ...]], theirs: list[tuple[Any, ...]]) -> bool:
    """Equal rows, fractional numbers within 1e-6 (duckdb's AVG is a double; ours is rounded
    to the view's scale, at least 6 digits)."""

    def key(row: tuple[Any, ...]) -> str:
        return repr(tuple(round(v, 3) if isinstance(v, float) else v for v in row))

    if len(ours) != len(theirs):
        return False
    for a, b in zip(sorted(ours, key=key), sorted(theirs, key=key), strict=True):
        for x, y in zip(a, b, strict=True):
            if isinstance(x, float) or isinstance(y, float):
                if x is None or y is None or abs(float(x) - float(y)) > 1e-6 * max(1, abs(y)):
                    return False
            elif x != y:
                return False
    return True


def _write_csv(path: Path, view: Any, rows: list[dict[str, Any]]) -> None:
    names = [c.name for c in view.columns if not c.hidden]
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(names)
        for row in sorted(rows, key=lambda r: repr(tuple(r.values()))):
            out.writerow(["" if row[n] is None else _text(row[n]) for n in names])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def _percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3)
