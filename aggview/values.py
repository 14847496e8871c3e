"""Python values <-> wire ``Value`` messages. Used by the client to send what the user gave and
by the coordinator to return typed rows; checking against column types is the schema's job.
Also a cumulus view's map entries as ``FinishView`` carries them (``encode_entry``: the Spark
layer sends them; ``decode_entries``: the coordinator reads them)."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Mapping
from typing import Any

from aggview import errors
from aggview.wire import client_pb2 as pb

EPOCH = datetime.date(1970, 1, 1)


def to_value(value: Any) -> pb.Value:
    out = pb.Value()
    _fill(out, value)
    return out


def _fill(out: pb.Value, value: Any) -> None:
    """Sets ``out`` (a fresh ``Value``, or a row's entry) to ``value``'s wire form: a row's
    values are set where the row holds them, not built and copied in."""
    if value is None:
        out.null = True
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise errors.TypeMismatch(
                f"integer {value} does not fit in 64 bits (a DECIMAL takes it as a Decimal)"
            )
        out.int_value = value
    elif isinstance(value, decimal.Decimal):
        out.decimal_value = str(value)
    elif isinstance(value, float):
        out.float_value = value
    elif isinstance(value, str):
        out.text_value = value
    elif isinstance(value, datetime.datetime):
        raise errors.TypeMismatch(
            f"{value!r} is a datetime: a DATE takes a datetime.date (its .date()), no time"
        )
    elif isinstance(value, datetime.date):
        out.date_value = (value - EPOCH).days
    else:
        raise errors.TypeMismatch(
            f"unsupported value {value!r} of type {type(value).__name__}: use int, Decimal, "
            "float, str, datetime.date, bool or None"
        )


def from_value(value: pb.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "decimal_value":
        try:
            return decimal.Decimal(value.decimal_value)
        except decimal.InvalidOperation:
            raise errors.TypeMismatch(f"malformed decimal {value.decimal_value!r}") from None
    if kind == "date_value":
        try:
            return EPOCH + datetime.timedelta(days=value.date_value)
        except OverflowError:
            raise errors.TypeMismatch(
                f"date {value.date_value} days from 1970-01-01 is outside years 1..9999"
            ) from None
    return getattr(value, kind)


def to_row(row: Mapping[str, Any], table: str = "") -> pb.Row:
    """A row on the wire; a value that has no wire form is a type error naming its column
    (``table.column`` when given the table)."""
    out = pb.Row()
    fill_row(out, row, table)
    return out


def fill_row(out: pb.Row, row: Mapping[str, Any], table: str = "") -> None:
    """:func:`to_row` into ``out`` (a message's row field: set where it is held rather than
    built and copied in)."""
    if not isinstance(row, Mapping):
        raise errors.InvalidArgument(f"expected a dict of column values, got {type(row).__name__}")
    columns = out.columns
    for column, value in row.items():
        if not isinstance(column, str):
            raise errors.InvalidArgument(f"column names are strings, got {column!r}")
        try:
            _fill(columns[column], value)
        except errors.TypeMismatch as exc:
            named = f"{table}.{column}" if table else column
            raise errors.TypeMismatch(f"column {named}: {exc}") from None


def from_row(row: pb.Row) -> dict[str, Any]:
    columns = row.columns  # a wire map's items() is the Mapping mixin's, in Python: slower
    return {column: from_value(columns[column]) for column in columns}


# ---------------------------------------------------------------- map entries on the wire


def encode_entry(name: str, key: tuple[Any, ...], value: Any) -> tuple[bytes, bytes]:
    """A map entry as ``FinishView`` carries it for a cumulus view: the map's name, and a
    wire ``Row`` of its key columns (``k0``, ``k1``, …) and ``value``."""
    row = pb.Row()
    for i, part in enumerate(key):
        row.columns[f"k{i}"].CopyFrom(to_value(part))
    row.columns["value"].CopyFrom(to_value(value))
    return name.encode(), row.SerializeToString()


def decode_entries(raws: Iterable[tuple[bytes, bytes]]) -> dict[str, dict[tuple[Any, ...], Any]]:
    """The maps ``encode_entry`` sent; a malformed entry is refused, saying so."""
    maps: dict[str, dict[tuple[Any, ...], Any]] = {}
    for name, data in raws:
        row = pb.Row()
        try:
            row.ParseFromString(data)
            values = from_row(row)
            width = len(values) - 1
            key = tuple(values[f"k{i}"] for i in range(width))
            value = values["value"]
        except Exception:  # not a Row, or not k0..kn and value
            raise errors.InvalidArgument(
                f"a map entry of {name.decode(errors='replace')!r} is not a Row of k0, k1, … "
                "and value"
            ) from None
        maps.setdefault(name.decode(errors="replace"), {})[key] = value
    return maps
