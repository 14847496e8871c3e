"""Client operations (typed wire values) -> participant row operations (storage form), and
stored rows back to typed wire rows. Every check against the schema happens here, before any
LTM sees the transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from aggview import errors
from aggview.keycodec import MAX_KEY_BYTES, decode_key, encode_stored_key, table_key
from aggview.rowcodec import decode_json, decode_row, encode_json, encode_row
from aggview.schema import TableSchema, from_storage, row_to_storage, to_storage
from aggview.values import from_row, to_value
from aggview.wire import client_pb2 as cpb
from aggview.wire import ltm_pb2 as lpb

# Clients put up to 32 KiB of transactions in one Transact message (aggclient.client).
MIN_REQUEST_BYTES = 64 * 1024


@dataclass(frozen=True)
class Limits:
    """What one client may ask of the coordinator; each refusal names its limit (``--limit``)."""

    max_operations: int = 10_000  # rows (operations) per transaction
    max_row_bytes: int = 1024 * 1024  # one stored row: the key-value store's value
    max_key_bytes: int = MAX_KEY_BYTES  # one encoded primary key
    max_request_bytes: int = 16 * 1024 * 1024  # one request message (gRPC refuses bigger)
    max_sql_bytes: int = 64 * 1024  # one SQL statement (parsing is the costly part)
    max_views: int = 100  # materialized views in the catalog
    max_client_transactions: int = 1024  # calls in flight per client (token, or connection)
    max_adhoc_rows: int = 100_000  # rows an ad-hoc SELECT (join, aggregate) may read
    watch_stall_seconds: int = 30  # a subscriber taking no message this long is dropped

    @classmethod
    def parse(cls, items: Sequence[str]) -> Limits:
        """``NAME=VALUE`` pairs (``max_views=10``) over the defaults."""
        known = {f.name for f in fields(cls)}
        values: dict[str, int] = {}
        for item in items:
            name, _, text = item.partition("=")
            name = name.strip()
            if name not in known:
                raise errors.InvalidArgument(
                    f"unknown limit {name!r}; limits are {', '.join(sorted(known))}"
                )
            try:
                value = int(text)
            except ValueError:
                raise errors.InvalidArgument(
                    f"limit {name} needs an integer, got {text!r}"
                ) from None
            least = MIN_REQUEST_BYTES if name == "max_request_bytes" else 1
            if value < least:
                raise errors.InvalidArgument(f"limit {name} must be at least {least}, got {value}")
            values[name] = value
        return replace(cls(), **values)


_OPS = {cpb.EQ: "==", cpb.NE: "!=", cpb.LT: "<", cpb.LE: "<=", cpb.GT: ">", cpb.GE: ">="}
_KINDS = {
    cpb.Operation.INSERT: lpb.RowOp.INSERT,
    cpb.Operation.UPDATE: lpb.RowOp.UPDATE,
    cpb.Operation.ADD: lpb.RowOp.ADD,
    cpb.Operation.DELETE: lpb.RowOp.DELETE,
}
_NUMERIC = {"INT", "DECIMAL", "FLOAT"}


def key_bytes(schema: TableSchema, key: dict[str, Any], limits: Limits) -> bytes:
    return table_key(schema, key, limits.max_key_bytes)


def row_op(
    operation: cpb.Operation, table: Callable[[str], TableSchema], limits: Limits
) -> lpb.RowOp:
    """One client operation checked against its table and turned into storage form."""
    schema = table(operation.table)
    kind = _KINDS.get(operation.kind)
    if kind is None:
        raise errors.InvalidArgument(f"unknown operation kind {operation.kind}")
    values = from_row(operation.values)
    op = lpb.RowOp(kind=kind, table=schema.table_id)
    if kind == lpb.RowOp.INSERT:
        if operation.key.columns:
            raise errors.InvalidArgument("insert takes the whole row in values, not a key")
        row = row_to_storage(schema, values)  # its key columns are converted there once
        op.key = encode_stored_key(
            schema, tuple(row[c] for c in schema.primary_key), limits.max_key_bytes
        )
        op.values = _checked_row(schema, row, limits)
    else:
        op.key = key_bytes(schema, from_row(operation.key), limits)
        if kind == lpb.RowOp.DELETE and values:
            raise errors.InvalidArgument("delete takes only a key")
        if kind in (lpb.RowOp.UPDATE, lpb.RowOp.ADD):
            if not values:
                raise errors.InvalidArgument(f"{_name(kind)} of {schema.name} changes no column")
            op.values = _checked_row(schema, _changes(schema, kind, values), limits)
            if kind == lpb.RowOp.ADD:
                op.limits = _add_limits(schema, tuple(values))
    if operation.require:
        op.require = _storable(
            schema, encode_json, [_condition(schema, c) for c in operation.require]
        )
    return op


def _storable(schema: TableSchema, encode: Callable[[Any], bytes], value: Any) -> bytes:
    """JSON, the storage form, has no infinity (FLOAT columns accept one as a value)."""
    try:
        return encode(value)
    except ValueError:
        raise errors.InvalidArgument(
            f"table {schema.name}: a FLOAT value is infinite; stored values must be finite"
        ) from None


def _changes(schema: TableSchema, kind: int, values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        column = schema.column(name)
        if name in schema.primary_key:
            raise errors.InvalidArgument(
                f"cannot {_name(kind)} primary-key column {schema.name}.{name}: "
                "delete the row and insert it with the new key"
            )
        if kind == lpb.RowOp.ADD:
            if column.type.kind not in _NUMERIC:
                raise errors.TypeMismatch(
                    f"cannot add to column {schema.name}.{name} of type {column.type}"
                )
            if value is None:
                raise errors.TypeMismatch(f"cannot add NULL to column {schema.name}.{name}")
        out[name] = to_storage(column, value, table=schema.name)
    return out


# (table id, columns added to) -> (the schema they were made for, their limits as stored)
_LIMITS: dict[tuple[str, tuple[str, ...]], tuple[TableSchema, bytes]] = {}


def _add_limits(schema: TableSchema, names: tuple[str, ...]) -> bytes:
    """The bound each added column must stay under (its type's), as the LTM reads them:
    the same for every ADD to the same columns of a table, so made once per schema."""
    cached = _LIMITS.get((schema.table_id, names))
    if cached is not None and cached[0] is schema:
        return cached[1]
    limits = {}
    for name in names:
        column_type = schema.column(name).type
        if column_type.kind == "INT":
            limits[name] = 2**63
        elif column_type.kind == "DECIMAL":
            limits[name] = 10 ** (column_type.precision or 18)
    if len(_LIMITS) >= 4096:  # tables and column sets come and go with DDL
        _LIMITS.clear()
    data = encode_json(limits)
    _LIMITS[(schema.table_id, names)] = (schema, data)
    return data


def _condition(schema: TableSchema, condition: cpb.Condition) -> list[Any]:
    column = schema.column(condition.column)
    op = _OPS.get(condition.op)
    if op is None:
        raise errors.InvalidArgument(f"unknown comparison {condition.op}")
    value = from_row(cpb.Row(columns={"v": condition.value}))["v"]
    if value is None:
        raise errors.InvalidArgument(f"condition on {schema.name}.{column.name} compares with NULL")
    return [column.name, op, to_storage(column, value, table=schema.name)]


def _checked_row(schema: TableSchema, row: dict[str, Any], limits: Limits) -> bytes:
    data = _storable(schema, encode_row, row)
    if len(data) > limits.max_row_bytes:
        raise errors.LimitExceeded(
            f"table {schema.name}: row of {len(data)} bytes is over the "
            f"{limits.max_row_bytes} byte limit (max_row_bytes)"
        )
    return data


def _name(kind: int) -> str:
    return lpb.RowOp.Kind.Name(kind).lower()


def wire_row(schema: TableSchema, data: bytes) -> cpb.Row:
    """A stored row (storage form JSON) as a typed wire row with every column of the table."""
    stored = decode_row(data) or {}
    out = cpb.Row()
    for column in schema.columns:
        value = stored.get(column.name)
        out.columns[column.name].CopyFrom(
            to_value(None if value is None else from_storage(column.type, value))
        )
    return out


def describe_key(schema: TableSchema, key: bytes) -> str:
    """A key as the user wrote it, for error messages."""
    try:
        values: Sequence[Any] = decode_key(schema.key_types, key)
    except errors.AggviewError:
        return key.hex()
    shown = ", ".join(
        f"{c.name}={from_storage(c.type, v)!r}"
        for c, v in zip(schema.key_columns, values, strict=True)
    )
    return "{" + shown + "}"


def describe_condition(schema: TableSchema, detail: str) -> str:
    """A failed condition as the user wrote it: 'balance >= 300.00 is false (it is 70.00)'."""
    try:
        column, op, expected, actual = decode_json(detail.encode())
        column_type = schema.column(column).type
        shown = [None if v is None else from_storage(column_type, v) for v in (expected, actual)]
    except (ValueError, TypeError, errors.AggviewError):
        return detail
    if actual is None and not schema.has_column(column):
        return detail
    return f"{column} {op} {shown[0]} is false (it is {'NULL' if actual is None else shown[1]})"


def check_operation_count(count: int, limits: Limits) -> None:
    if count == 0:
        raise errors.InvalidArgument("a transaction needs at least one operation")
    if count > limits.max_operations:
        raise errors.LimitExceeded(
            f"transaction has {count} operations; the limit is {limits.max_operations} "
            "(max_operations)"
        )


def check_sql_size(sql: str, limits: Limits) -> None:
    size = len(sql.encode())
    if size > limits.max_sql_bytes:
        raise errors.LimitExceeded(
            f"SQL statement of {size} bytes is over the {limits.max_sql_bytes} byte limit "
            "(max_sql_bytes)"
        )
