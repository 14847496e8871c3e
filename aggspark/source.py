"""``spark.read.format("aggview")``: a table or view of a running cluster as a DataFrame, read at
one held snapshot by key ranges (one Spark partition per range); and
``df.write.format("aggview")``: a bulk load that becomes visible at one timestamp.

Options: ``address`` (the coordinator), ``table`` (a table or materialized view), ``snapshot``
(a timestamp held with ``BulkClient.hold_snapshot``; without it the reader holds one that lapses
two minutes after the last read), ``partitions`` (key ranges, default 4), ``columns`` (a comma
list: column pruning; a user schema naming a subset of the columns prunes too), ``raw`` (views:
the group key and hidden aggregate state instead of the finalized row), ``ca``/``token`` (a
secure cluster). Filters on the first primary-key column narrow the key ranges read.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from aggclient.bulk_client import BulkClient, Described
from aggclient.client import Client
from aggview import errors
from aggview.keycodec import encode_key, prefix_end
from aggview.merge import gather
from aggview.partition_map import is_partials
from aggview.rowcodec import decode_row, encode_row
from aggview.schema import ColumnType, TableSchema, from_storage, to_storage
from cumulus.aggstate import ViewState
from cumulus.plan import ViewPlan

READ_LEASE_MS = 120_000
STAGE_BATCH_ROWS = 5000

SPARK_TYPES = {
    "INT": "BIGINT",
    "FLOAT": "DOUBLE",
    "TEXT": "STRING",
    "DATE": "DATE",
    "BOOL": "BOOLEAN",
}


def spark_type(column_type: ColumnType) -> str:
    if column_type.kind == "DECIMAL":
        return f"DECIMAL({column_type.precision},{column_type.scale})"
    return SPARK_TYPES[column_type.kind]


def connect(options: dict[str, Any]) -> Client:
    """A client from Data Source options (address, and ca/token for a secure cluster)."""
    address = options.get("address")
    if not address:
        raise errors.InvalidArgument("the aggview data source needs option address=HOST:PORT")
    extra = {k: options[k] for k in ("ca", "token") if options.get(k) not in (None, "", "None")}
    return Client(address, **extra)


def view_state(described: Described) -> ViewState:
    schemas = {s["name"]: TableSchema.from_json(s) for s in described.base_schemas}
    assert described.plan is not None
    return ViewState(ViewPlan.from_json(described.plan), schemas.__getitem__)


def struct_of(described: Described, raw: bool = False, columns: str = "") -> str:
    """The DataFrame schema of a table or a view (or of the ``columns`` named, a comma
    list: column pruning), as a DDL string."""
    if described.kind == "table":
        assert described.schema is not None
        schema = TableSchema.from_json(described.schema)
        types = {c.name: spark_type(c.type) for c in schema.columns}
    elif raw:
        return "key BINARY, state STRING"
    else:
        state = view_state(described)
        group_types = dict(
            zip((g.name for g in state.plan.group_by), state.group_types, strict=True)
        )
        aggregate_types = dict(
            zip((a.name for a in state.plan.aggregates), state.result_types, strict=True)
        )
        types = {
            name: spark_type(group_types.get(name) or aggregate_types[name])
            for name in described.columns
        }
    wanted = [c.strip() for c in columns.split(",") if c.strip()] or described.columns
    unknown = [c for c in wanted if c not in types]
    if unknown:
        raise errors.UnknownColumn(
            f"{described.kind} {described.name} has no column {', '.join(map(repr, unknown))}"
        )
    return ", ".join(f"`{name}` {types[name]}" for name in wanted)


@dataclass(frozen=True)
class KeyRange(InputPartition):
    start: bytes
    stop: bytes  # b"": to the end


class AggviewDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "aggview"

    def _described(self) -> Described:
        table = self.options.get("table")
        if not table:
            raise errors.InvalidArgument("the aggview data source needs option table=NAME")
        with connect(self.options) as client:
            return BulkClient(client).describe(table)

    def schema(self) -> str:
        options = self.options
        return struct_of(
            self._described(), _flag(options.get("raw")), str(options.get("columns") or "")
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return AggviewReader(dict(self.options), self._described(), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise errors.InvalidArgument(
                "the aggview data source only appends (a bulk load of new rows); use mode('append')"
            )
        return AggviewWriter(dict(self.options), self._described())


def _flag(value: object) -> bool:
    return str(value).lower() in ("1", "true", "yes")


class AggviewReader(DataSourceReader):
    def __init__(self, options: dict[str, Any], described: Described, schema: StructType):
        self.options = options
        self.described = described
        self.raw = _flag(options.get("raw"))
        wanted = [f.name for f in schema.fields]
        known = ["key", "state"] if self.raw and described.kind == "view" else described.columns
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise errors.UnknownColumn(
                f"{described.kind} {described.name} has no column {', '.join(map(repr, unknown))}"
            )
        self.columns = wanted
        self.start, self.stop = b"", b""
        if options.get("snapshot"):
            self.snapshot = int(options["snapshot"])
        else:
            with connect(options) as client:
                _, self.snapshot = BulkClient(client).hold_snapshot(READ_LEASE_MS)

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Filters on the first key column narrow the key range; Spark still applies every
        filter afterwards (a range is a superset), so all are handed back."""
        if self.described.kind == "table":
            assert self.described.schema is not None
            schema = TableSchema.from_json(self.described.schema)
            first = schema.key_columns[0]
            for f in filters:
                if f.attribute != (first.name,) or not isinstance(
                    f, EqualTo | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual
                ):
                    continue
                try:
                    prefix = encode_key(
                        [first.type], [to_storage(first, f.value, table=schema.name)]
                    )
                except errors.AggviewError:
                    continue
                after = prefix_end(prefix) or b""
                if isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual):
                    low = after if isinstance(f, GreaterThan) else prefix
                    self.start = max(self.start, low)
                if isinstance(f, EqualTo | LessThan | LessThanOrEqual):
                    high = prefix if isinstance(f, LessThan) else after
                    if high and (not self.stop or high < self.stop):
                        self.stop = high
        yield from filters

    def partitions(self) -> list[KeyRange]:
        if self.described.kind == "view":  # a view is small, and a view without GROUP BY
            return [KeyRange(b"", b"")]  # must answer its one row from a single place
        count = int(self.options.get("partitions") or 4)
        with connect(self.options) as client:
            cuts = BulkClient(client).splits(self.described.name, count)
        edges = [self.start] + [
            k for k in cuts if k > self.start and (not self.stop or k < self.stop)
        ]
        ranges = [KeyRange(a, b) for a, b in zip(edges, edges[1:] + [self.stop], strict=True)]
        return [r for r in ranges if not r.stop or r.start < r.stop] or [KeyRange(b"", b"\x00")]

    def read(self, partition: KeyRange) -> Iterator[tuple[Any, ...]]:
        described = self.described
        with connect(self.options) as client:
            pages = BulkClient(client).read_range(
                described.name, partition.start, partition.stop, self.snapshot
            )
            if described.kind == "table":
                yield from _table_rows(described, self.columns, pages)
            elif self.raw:
                for key, state in view_states(described, pages):
                    yield tuple({"key": key, "state": json.dumps(state)}[c] for c in self.columns)
            else:
                yield from _view_rows(described, self.columns, pages)


def view_states(
    described: Described, pages: Iterable[list[tuple[bytes, bytes]]]
) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(group key, state) of a view's groups from its stored rows, in key order for a view
    kept as one row per group; a view kept as partial rows is added up first (all of it)."""
    rows = ((key, decode_row(data) or {}) for page in pages for key, data in page)
    if is_partials(described.store_table):
        yield from sorted(gather(rows, partials=True).items())
    else:
        yield from rows


def _table_rows(
    described: Described, columns: list[str], pages: Iterator[list[tuple[bytes, bytes]]]
) -> Iterator[tuple[Any, ...]]:
    assert described.schema is not None
    schema = TableSchema.from_json(described.schema)
    types = [(c, schema.column(c).type) for c in columns]
    for page in pages:
        for _, data in page:
            row = decode_row(data) or {}
            yield tuple(from_storage(t, row.get(c)) for c, t in types)


def _view_rows(
    described: Described, columns: list[str], pages: Iterator[list[tuple[bytes, bytes]]]
) -> Iterator[tuple[Any, ...]]:
    state = view_state(described)
    seen = False
    for key, group in view_states(described, pages):
        seen = True
        row = state.finalize(key, group)
        if row is not None:
            yield tuple(row[c] for c in columns)
    if not seen and not state.plan.group_by:  # SQL: an aggregate without GROUP BY has one row
        row = state.finalize(b"\x00", {})
        if row is not None:
            yield tuple(row[c] for c in columns)


# ----------------------------------------------------------------------------- bulk load


def staging_name() -> str:
    return f"load_{uuid.uuid4().hex[:16]}"


def stage_rows(
    store: Any, staging: str, schema: TableSchema, rows: Iterator[dict[str, Any]]
) -> int:
    """Writes rows (column -> Python value) to a staging table in storage form; raises on the
    first row that does not fit the schema."""
    batch: list[tuple[str, bytes, bytes | None]] = []
    count = 0
    for values in rows:
        key, data = encode_staged(schema, values)
        batch.append((staging, key, data))
        count += 1
        if len(batch) >= STAGE_BATCH_ROWS:
            store.write(batch)
            batch = []
    if batch:
        store.write(batch)
    return count


def encode_staged(schema: TableSchema, values: dict[str, Any]) -> tuple[bytes, bytes]:
    """(key, row) of a row in storage form, exactly as a transaction would store it."""
    for name in values:
        schema.column(name)  # raises UnknownColumn
    stored = {c.name: to_storage(c, values.get(c.name), table=schema.name) for c in schema.columns}
    key = encode_key(schema.key_types, [stored[c] for c in schema.primary_key])
    return key, encode_row(stored)


@dataclass
class Staged(WriterCommitMessage):
    rows: int


class AggviewWriter(DataSourceWriter):
    def __init__(self, options: dict[str, Any], described: Described) -> None:
        if described.kind != "table":
            raise errors.InvalidArgument(f"{described.name} is a view: bulk loads go to tables")
        from ltm.store import open_store

        self.options = options
        self.described = described
        self.staging = staging_name()
        store = open_store(described.store_url)
        try:
            store.create_table(self.staging)
        finally:
            store.close()

    def write(self, iterator: Iterator[Any]) -> Staged:
        from ltm.store import open_store

        assert self.described.schema is not None
        schema = TableSchema.from_json(self.described.schema)
        store = open_store(self.described.store_url)
        try:
            rows = (row.asDict() for row in iterator)
            return Staged(stage_rows(store, self.staging, schema, rows))
        finally:
            store.close()

    def commit(self, messages: list[Staged | None]) -> None:
        with connect(self.options) as client:
            BulkClient(client).load(self.described.name, self.staging)

    def abort(self, messages: list[Staged | None]) -> None:
        from ltm.store import open_store

        store = open_store(self.described.store_url)
        try:
            store.drop_table(self.staging)
        finally:
            store.close()
