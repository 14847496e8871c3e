"""The Spark jobs behind ``aggview load``, ``aggview views init`` and ``aggview verify``.

Each job holds a snapshot for as long as it reads, and changes the cluster in one step at its
end (one load transaction, one view installation), so a job that fails half-way changes nothing.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggclient.bulk_client import BulkClient
from aggclient.client import Client
from aggspark.compute import State, compute_states, needed_columns
from aggspark.m3_init import initial_maps, initial_relations
from aggspark.source import encode_staged, staging_name, view_states
from aggview import errors
from aggview.merge import normalized
from aggview.rowcodec import encode_row
from aggview.schema import TableSchema
from aggview.values import encode_entry
from cumulus.aggstate import Row, ViewState
from cumulus.m3.compiler import compile_program
from cumulus.m3.interpreter import Interpreter
from cumulus.plan import ViewPlan
from cumulus.runtime.placement import relation_map
from cumulus.view_rows import is_view_rows

Progress = Callable[[str], None]
MAX_REPORTED = 20  # bad rows named in an error message


def _quiet(message: str) -> None:
    pass


@contextlib.contextmanager
def snapshot_tables(
    spark: Any,
    address: str,
    state: ViewState,
    snapshot: int,
    client_options: dict[str, Any],
    columns_of: dict[str, list[str]] | None = None,
) -> Iterator[dict[str, str]]:
    """Registers each base table of a view, read at ``snapshot`` with only the columns the
    view uses (or ``columns_of`` each), as a cached temporary view (the view's queries read
    it once); yields table -> temporary view name, and drops them afterwards."""
    names, frames = {}, []
    for table, columns in (columns_of or needed_columns(state)).items():
        reader = (
            spark.read.format("aggview")
            .option("address", address)
            .option("table", table)
            .option("snapshot", str(snapshot))
            .option("columns", ",".join(columns))
        )
        for key, value in client_options.items():
            if value is not None:  # an insecure cluster: no ca, no token
                reader = reader.option(key, str(value))
        name = f"aggview_{table}_{uuid.uuid4().hex[:8]}"
        frame = reader.load().cache()
        frame.createOrReplaceTempView(name)
        frames.append((name, frame))
        names[table] = f"`{name}`"
    try:
        yield names
    finally:
        for name, frame in frames:
            spark.catalog.dropTempView(name)
            frame.unpersist()


def _view_state(plan_json: str | dict[str, Any], schemas: Iterable[Any]) -> ViewState:
    import json

    plan = ViewPlan.from_json(json.loads(plan_json) if isinstance(plan_json, str) else plan_json)
    by_name = {}
    for schema in schemas:
        data = json.loads(schema) if isinstance(schema, str) else schema
        by_name[data["name"]] = TableSchema.from_json(data)
    inner = [name for name, schema in by_name.items() if is_view_rows(schema)]
    if inner:
        raise errors.InvalidArgument(
            f"materialized view {plan.name} reads materialized view {', '.join(inner)}: Spark "
            "initializes and verifies views over base tables only (the coordinator "
            "initializes views over views and subqueries)"
        )
    return ViewState(plan, by_name.__getitem__)


# ----------------------------------------------------------------------------- views init


@dataclass
class InitResult:
    view: str
    snapshot: int
    timestamp: int
    groups: int  # the view's groups computed (a cumulus view: none, it keeps maps)
    message: str
    entries: int = 0  # a cumulus view's map entries computed


def init_view(
    spark: Any,
    address: str,
    *,
    sql: str = "",
    view: str = "",
    progress: Progress = _quiet,
    client_options: dict[str, Any] | None = None,
) -> InitResult:
    """Creates a view (``sql``) or recomputes an existing one (``view``) with Spark SQL at a
    snapshot while writers go on; the coordinator then applies what was captured after it."""
    options = client_options or {}
    with Client(address, **options) as client:
        bulk = BulkClient(client)
        begun = bulk.begin_view(sql=sql, view=view)
        try:
            progress(f"computing {begun.view} at snapshot {begun.snapshot}")
            state = _view_state(begun.plan_json, begun.base_schemas_json)
            if state.plan.mode == "cumulus":  # its M3 program's maps, from their definitions
                entries = _cumulus_maps(spark, address, state, begun.snapshot, options)
                progress(f"installing {len(entries)} map entries of {begun.view}")
                finished = bulk.finish_view(begun.view, begun.snapshot, entries)
                return InitResult(
                    begun.view,
                    begun.snapshot,
                    finished.timestamp,
                    0,
                    finished.message,
                    entries=len(entries),
                )
            with snapshot_tables(spark, address, state, begun.snapshot, options) as tables:
                groups = compute_states(spark, state, tables)
            progress(f"installing {len(groups)} groups of {begun.view}")
            finished = bulk.finish_view(
                begun.view, begun.snapshot, ((k, encode_row(v)) for k, v in groups.items())
            )
        except BaseException:
            with contextlib.suppress(Exception):
                bulk.abort_view(begun.view)
            raise
        return InitResult(
            begun.view, begun.snapshot, finished.timestamp, len(groups), finished.message
        )


def _cumulus_maps(
    spark: Any, address: str, state: ViewState, snapshot: int, options: dict[str, Any]
) -> list[tuple[bytes, bytes]]:
    """A cumulus view's program, compiled here as the coordinator compiles it, and every
    map's entries over the snapshot (``aggspark.m3_init``), as FinishView sends them.
    The program's relations carry every column of their tables, so all are read."""
    plan = state.plan
    schemas = {t: state.schemas[plan.aliases_of(t)[0]] for t in plan.base_tables()}
    program = compile_program([plan], schemas.__getitem__, plan.program_depth)
    columns = {t: list(s.column_names) for t, s in schemas.items()}
    with snapshot_tables(spark, address, state, snapshot, options, columns) as tables:
        maps = initial_maps(spark, program, tables)
        relations = initial_relations(spark, program, tables)
    checker = Interpreter(program)  # a relation's rows as the runtime keeps them: converted
    for name, rows in relations.items():
        maps[relation_map(name)] = {checker.check("+", name, row): 1 for row in rows}
    return [encode_entry(name, k, v) for name, found in maps.items() for k, v in found.items()]


# ----------------------------------------------------------------------------- verify


@dataclass
class Difference:
    group: dict[str, Any]
    expected: dict[str, Any] | None  # the row as recomputed (None: no such group)
    actual: dict[str, Any] | None  # the row as maintained
    expected_state: Row | None
    actual_state: Row | None


@dataclass
class VerifyResult:
    view: str
    timestamp: int
    groups: int
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


def verify_views(
    spark: Any,
    address: str,
    views: list[str] | None = None,
    *,
    progress: Progress = _quiet,
    client_options: dict[str, Any] | None = None,
) -> list[VerifyResult]:
    """Recomputes each view at a timestamp its rows are exact at (a held snapshot for a sync
    view; a refresh forced inside the held snapshot for an async one; an epoch forced inside
    it for a cumulus one) and compares every group's state with the maintained one (a cumulus
    view keeps no states: every group's row)."""
    options = client_options or {}
    results = []
    with Client(address, **options) as client:
        bulk = BulkClient(client)
        names = views if views else bulk.list()[1]
        for name in names:
            described = bulk.describe(name)
            if described.kind != "view":
                raise errors.InvalidArgument(f"{name} is a table, not a materialized view")
            if described.state != "live":
                raise errors.FailedPrecondition(f"materialized view {name} is still initializing")
            lease, ts = bulk.hold_snapshot()
            try:
                assert described.plan is not None
                state = _view_state(described.plan, described.base_schemas)
                if described.plan["mode"] == "cumulus":
                    ts, rows = _cumulus_epoch(client, name)
                elif described.plan["mode"] == "async":
                    ts = client.refresh(name)  # exact at ts, which the lease (older) protects
                progress(f"verifying {name} at {ts}")
                with snapshot_tables(spark, address, state, ts, options) as tables:
                    expected = compute_states(spark, state, tables)
                if described.plan["mode"] == "cumulus":
                    results.append(compare_rows(name, ts, state, expected, rows))
                    continue
                actual = dict(view_states(described, bulk.read_range(name, b"", b"", ts)))
            finally:
                bulk.release_snapshot(lease)
            result = VerifyResult(name, ts, len(expected))
            for key in sorted(set(expected) | set(actual)):
                want = normalized(expected.get(key, {}))
                have = normalized(actual.get(key, {}))
                if not _same_state(want, have):
                    result.differences.append(
                        Difference(
                            group=state.decode_group(key),
                            expected=state.finalize(key, want) if want else None,
                            actual=state.finalize(key, have) if have else None,
                            expected_state=want or None,
                            actual_state=have or None,
                        )
                    )
            results.append(result)
    return results


EPOCH_ATTEMPTS = 20


def _cumulus_epoch(client: Client, name: str) -> tuple[int, list[dict[str, Any]]]:
    """A cumulus view's rows at an epoch committed now (inside the held snapshot, which
    protects the base tables' rows at it): the epoch's timestamp is what its read says,
    unless a scheduled epoch came between (then once more)."""
    for _ in range(EPOCH_ATTEMPTS):
        ts = client.refresh(name)
        rows = client.view(name)
        if rows.timestamp == ts:
            return ts, list(rows)
    raise errors.Unavailable(
        f"materialized view {name}: every one of {EPOCH_ATTEMPTS} epochs asked for was "
        "followed by another before it could be read"
    )


def compare_rows(
    name: str, ts: int, state: ViewState, expected: State, rows: list[dict[str, Any]]
) -> VerifyResult:
    """A view's rows (a cumulus view keeps no states) against the groups' rows recomputed:
    exact, except AVG and FLOAT aggregates, which may differ in their last digits."""
    groups = [g.name for g in state.plan.group_by]
    want = {}
    for key, values in expected.items():
        row = state.finalize(key, normalized(values))
        if row is not None:
            want[tuple(row[g] for g in groups)] = row
    have = {tuple(row[g] for g in groups): dict(row) for row in rows}
    approx = {
        a.name
        for a, rule, arg_type in zip(
            state.plan.aggregates, state.rules, state.arg_types, strict=True
        )
        if rule.rounds(arg_type)
    }
    result = VerifyResult(name, ts, len(want))
    for group in sorted(want.keys() | have.keys(), key=repr):
        expected_row, actual_row = want.get(group), have.get(group)
        if not _same_row(expected_row, actual_row, approx):
            result.differences.append(
                Difference(
                    group=dict(zip(groups, group, strict=True)),
                    expected=expected_row,
                    actual=actual_row,
                    expected_state=None,
                    actual_state=None,
                )
            )
    return result


def _same_row(want: dict[str, Any] | None, have: dict[str, Any] | None, approx: set[str]) -> bool:
    if want is None or have is None or want.keys() != have.keys():
        return want == have
    for column, value in want.items():
        other = have[column]
        if column in approx and value is not None and other is not None:
            if not math.isclose(float(value), float(other), rel_tol=1e-9, abs_tol=1e-6):
                return False
        elif value != other:
            return False
    return True


def _same_state(want: Row, have: Row) -> bool:
    """Exact, except FLOAT sums, which depend on the order they were added in."""
    if want.keys() != have.keys():
        return False
    for name, value in want.items():
        other = have[name]
        if isinstance(value, float) or isinstance(other, float):
            if not math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-9):
                return False
        elif value != other:
            return False
    return True


# ----------------------------------------------------------------------------- load


@dataclass
class LoadResult:
    table: str
    rows: int
    timestamp: int


_TRUE = {"true", "t", "1", "yes", "y"}
_FALSE = {"false", "f", "0", "no", "n"}


def _parse_text(schema: TableSchema, header: list[str], fields: list[str]) -> dict[str, Any]:
    """A CSV record as column -> Python value; an empty field is NULL."""
    if len(fields) != len(header):
        raise errors.InvalidArgument(f"expected {len(header)} fields, got {len(fields)}")
    values: dict[str, Any] = {}
    for name, text in zip(header, fields, strict=True):
        kind = schema.column(name).type.kind
        if text == "":
            values[name] = None
        elif kind == "INT":
            try:
                values[name] = int(text)
            except ValueError:
                raise errors.TypeMismatch(f"column {name}: {text!r} is not an integer") from None
        elif kind == "FLOAT":
            try:
                values[name] = float(text)
            except ValueError:
                raise errors.TypeMismatch(f"column {name}: {text!r} is not a number") from None
        elif kind == "BOOL":
            if text.lower() not in _TRUE | _FALSE:
                raise errors.TypeMismatch(f"column {name}: {text!r} is not true or false")
            values[name] = text.lower() in _TRUE
        else:  # TEXT as is; DECIMAL and DATE parse from text in to_storage
            values[name] = text
    return values


def _csv_records(
    schema: TableSchema, path: str, header: list[str], lines: Iterator[tuple[str, int]]
) -> Iterator[tuple[str, Any, Any]]:
    """("ok", key, (where, data)) or ("bad", where, message) per line."""
    for text, index in lines:
        where = f"{path}:{index + 1}"
        try:
            fields = next(csv.reader([text]))
            key, data = encode_staged(schema, _parse_text(schema, header, fields))
        except (errors.AggviewError, csv.Error, StopIteration) as exc:
            yield ("bad", where, str(exc) or "empty line")
            continue
        yield ("ok", key, (where, data))


def _typed_records(
    schema: TableSchema, path: str, rows: Iterator[tuple[Any, int]]
) -> Iterator[tuple[str, Any, Any]]:
    for row, index in rows:
        where = f"{path}: row {index + 1}"
        try:
            key, data = encode_staged(schema, row.asDict())
        except errors.AggviewError as exc:
            yield ("bad", where, str(exc))
            continue
        yield ("ok", key, (where, data))


def load_files(
    spark: Any,
    address: str,
    table: str,
    files: list[str],
    *,
    file_format: str | None = None,
    header: bool = True,
    progress: Progress = _quiet,
    client_options: dict[str, Any] | None = None,
) -> LoadResult:
    """Loads CSV or Parquet files into a table as one transaction: every row is checked
    against the schema first (bad rows named by file and line), nothing is visible until
    all of it is, at one timestamp."""
    options = client_options or {}
    with Client(address, **options) as client:
        bulk = BulkClient(client)
        described = bulk.describe(table)
        if described.kind != "table":
            raise errors.InvalidArgument(f"{table} is a materialized view: load into tables")
        assert described.schema is not None
        schema = TableSchema.from_json(described.schema)
        records = _records(spark, schema, files, file_format, header)
        staging = staging_name()
        store_url = described.store_url
        _with_store(store_url, lambda store: store.create_table(staging))
        try:
            # One pass checks every row and stages the good ones; a bad row anywhere means
            # the staged rows are dropped unused.
            progress(f"checking and staging {', '.join(files)} for table {table}")
            passes = records.mapPartitions(
                lambda part: [_stage_checked(store_url, staging, part)]
            ).collect()
            staged = sum(p[0] for p in passes)
            total_bad = sum(p[2] for p in passes)
            if total_bad:
                bad = sorted((b for p in passes for b in p[1]), key=_line_order)[:MAX_REPORTED]
                listed = "\n".join(f"  {where}: {message}" for where, message in bad)
                more = f"\n  ... and {total_bad - len(bad)} more" if total_bad > len(bad) else ""
                raise errors.InvalidArgument(
                    f"{total_bad} bad row(s); nothing was loaded:\n{listed}{more}"
                )
            if _with_store(store_url, lambda store: store.count(staging)) != staged:
                raise errors.InvalidArgument(
                    f"rows with the same primary key ({', '.join(schema.primary_key)}); "
                    f"nothing was loaded:\n{_duplicates(records)}"
                )
            progress(f"committing {staged} rows into {table}")
            ts, rows = bulk.load(table, staging)
        except BaseException:
            with contextlib.suppress(Exception):
                _with_store(store_url, lambda store: store.drop_table(staging))
            raise
        return LoadResult(table, rows, ts)


def _records(
    spark: Any, schema: TableSchema, files: list[str], file_format: str | None, header: bool
) -> Any:
    """One RDD of checked records over every file, each file numbered from its first line."""
    parts = []
    for path in files:
        if not Path(path).is_file():
            raise errors.InvalidArgument(f"no such file: {path}")
        kind = file_format or Path(path).suffix.lstrip(".").lower()
        if kind not in ("csv", "parquet"):
            raise errors.InvalidArgument(
                f"{path}: unknown format {kind!r}; use .csv or .parquet files (or --format)"
            )
        absolute = str(Path(path).resolve())
        if kind == "csv":
            lines = spark.sparkContext.textFile(absolute, minPartitions=4).zipWithIndex()
            columns = list(schema.column_names)
            if header:
                first = lines.filter(lambda li: li[1] == 0).map(lambda li: li[0]).take(1)
                columns = next(csv.reader(first)) if first else []
                columns = [c.strip() for c in columns]
                _check_columns(schema, columns, path)
                lines = lines.filter(lambda li: li[1] > 0)
            parts.append(
                lines.mapPartitions(lambda it, p=path, c=columns: _csv_records(schema, p, c, it))
            )
        else:
            frame = spark.read.parquet(absolute)
            _check_columns(schema, list(frame.columns), path)
            parts.append(
                frame.rdd.zipWithIndex().mapPartitions(
                    lambda it, p=path: _typed_records(schema, p, it)
                )
            )
    if not parts:
        raise errors.InvalidArgument("no files to load")
    return parts[0] if len(parts) == 1 else spark.sparkContext.union(parts)


def _check_columns(schema: TableSchema, columns: list[str], path: str) -> None:
    unknown = [c for c in columns if not schema.has_column(c)]
    if unknown:
        raise errors.UnknownColumn(
            f"{path}: table {schema.name} has no column {', '.join(map(repr, unknown))}"
        )
    missing = [c for c in schema.primary_key if c not in columns]
    if missing:
        raise errors.InvalidArgument(
            f"{path}: the primary-key column(s) {', '.join(missing)} of {schema.name} are missing"
        )
    twice = [c for c, n in itertools.groupby(sorted(columns)) if len(list(n)) > 1]
    if twice:
        raise errors.InvalidArgument(f"{path}: column(s) {', '.join(twice)} appear twice")


def _with_store(url: str, action: Callable[[Any], Any]) -> Any:
    from ltm.store import open_store

    store = open_store(url)
    try:
        return action(store)
    finally:
        store.close()


def _stage_checked(
    url: str, staging: str, records: Iterable[tuple[str, Any, Any]]
) -> tuple[int, list[tuple[str, str]], int]:
    """Stages a partition's good rows; returns (rows staged, some bad rows, bad rows). Once a
    bad row is seen nothing more is written: the load will not happen."""

    def write(store: Any) -> tuple[int, list[tuple[str, str]], int]:
        count = bad_count = 0
        bad: list[tuple[str, str]] = []
        batch = []
        for kind, first, second in records:
            if kind == "bad":
                bad_count += 1
                if len(bad) < MAX_REPORTED:
                    bad.append((first, second))
                batch = []
                continue
            if bad_count:
                continue
            batch.append((staging, first, second[1]))
            count += 1
            if len(batch) >= 5000:
                store.write(batch)
                batch = []
        if batch:
            store.write(batch)
        return count, bad, bad_count

    return _with_store(url, write)


def _line_order(bad: tuple[str, str]) -> tuple[str, int]:
    """file:line and "file: row n" places in file, then line order."""
    where = bad[0]
    path, _, number = where.rpartition(":") if " row " not in where else where.rpartition(" ")
    digits = number.strip()
    return (path, int(digits) if digits.isdigit() else 0)


def _duplicates(records: Any) -> str:
    """The places of rows sharing a primary key (the rare case: found only when it happens)."""
    places = records.filter(lambda r: r[0] == "ok").map(lambda r: (r[1], r[2][0]))
    twice = (
        places.groupByKey()
        .filter(lambda kv: len(kv[1]) > 1)
        .map(lambda kv: sorted(kv[1], key=lambda w: _line_order((w, ""))))
        .take(MAX_REPORTED)
    )
    return "\n".join(f"  {', '.join(p)}" for p in twice)
