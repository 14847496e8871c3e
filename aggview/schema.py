"""Column types, table schemas and the conversion of Python values to their storage form.

The storage form is what transaction managers keep, compare and ship: plain JSON-compatible
scalars that order correctly within one column type (DECIMAL as a scaled int, DATE as a day
number). Converting exactly once, at the edge, keeps every later comparison and sum exact.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from aggview.errors import InvalidArgument, TypeMismatch, UnknownColumn

KINDS = frozenset({"INT", "DECIMAL", "FLOAT", "TEXT", "DATE", "BOOL"})

DEFAULT_DECIMAL_PRECISION = 18
MAX_DECIMAL_PRECISION = 38
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1

_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()

# SQL spelling -> kind. A name maps to None when it takes arguments handled separately.
_ALIASES: dict[str, str] = {
    "INT": "INT",
    "INTEGER": "INT",
    "BIGINT": "INT",
    "SMALLINT": "INT",
    "DECIMAL": "DECIMAL",
    "NUMERIC": "DECIMAL",
    "FLOAT": "FLOAT",
    "DOUBLE": "FLOAT",
    "DOUBLE PRECISION": "FLOAT",
    "REAL": "FLOAT",
    "TEXT": "TEXT",
    "VARCHAR": "TEXT",
    "STRING": "TEXT",
    "CHAR": "TEXT",
    "DATE": "DATE",
    "BOOL": "BOOL",
    "BOOLEAN": "BOOL",
}
# Spellings that accept a parenthesised argument list, and how many arguments at most.
_MAX_ARGS = {"DECIMAL": 2, "NUMERIC": 2, "VARCHAR": 1, "CHAR": 1}

_TYPE_RE = re.compile(
    r"\s*([A-Za-z]+(?:\s+[A-Za-z]+)?)\s*(?:\(\s*([0-9]+)\s*(?:,\s*([0-9]+)\s*)?\))?\s*"
)
_DECIMAL_STR_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DATE_STR_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


@dataclass(frozen=True)
class ColumnType:
    """A column type; DECIMAL carries precision and scale, every other kind carries neither."""

    kind: str
    precision: int | None = None
    scale: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgument(f"unsupported column type {self.kind!r}")
        if self.kind != "DECIMAL":
            if self.precision is not None or self.scale is not None:
                raise InvalidArgument(f"column type {self.kind} takes no precision or scale")
            return
        # Plain DECIMAL means DECIMAL(18,0): SQL's usual default precision, scale 0.
        precision = DEFAULT_DECIMAL_PRECISION if self.precision is None else self.precision
        scale = 0 if self.scale is None else self.scale
        if type(precision) is not int or not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise InvalidArgument(
                f"DECIMAL precision must be 1..{MAX_DECIMAL_PRECISION}; got {precision!r}"
            )
        if type(scale) is not int or not 0 <= scale <= precision:
            raise InvalidArgument(f"DECIMAL scale must be 0..{precision}; got {scale!r}")
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "scale", scale)

    @classmethod
    def parse(cls, text: str) -> ColumnType:
        """Accept the common SQL spellings so DDL from other databases works unchanged."""
        match = _TYPE_RE.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidArgument(f"unsupported column type {text!r}")
        name = " ".join(match.group(1).upper().split())
        kind = _ALIASES.get(name)
        args = [int(a) for a in match.group(2, 3) if a is not None]
        if kind is None or len(args) > _MAX_ARGS.get(name, 0):
            raise InvalidArgument(f"unsupported column type {text!r}")
        if kind == "DECIMAL":
            if not args:
                return cls("DECIMAL")
            return cls("DECIMAL", args[0], args[1] if len(args) > 1 else 0)
        # VARCHAR(n)/CHAR(n): the length is accepted for compatibility but not enforced.
        return cls(kind)

    def __str__(self) -> str:
        if self.kind == "DECIMAL":
            return f"DECIMAL({self.precision},{self.scale})"
        return self.kind

    def duckdb(self) -> str:
        """The type as duckdb declares it (ad-hoc queries, replay checks): duckdb's INT is 32
        bits, ours 64, so INT is BIGINT there."""
        spelled = {"INT": "BIGINT", "FLOAT": "DOUBLE", "TEXT": "VARCHAR", "BOOL": "BOOLEAN"}
        return spelled.get(self.kind, str(self))

    def to_json(self) -> str:
        return str(self)

    @classmethod
    def from_json(cls, data: object) -> ColumnType:
        if not isinstance(data, str):
            raise InvalidArgument(f"column type must be a string; got {data!r}")
        return cls.parse(data)


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type.to_json(), "nullable": self.nullable}

    @classmethod
    def from_json(cls, data: object) -> Column:
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"column must be an object; got {data!r}")
        try:
            name, type_ = data["name"], data["type"]
        except KeyError as exc:
            raise InvalidArgument(f"column {dict(data)!r} lacks {exc.args[0]!r}") from None
        nullable = data.get("nullable", True)
        if not isinstance(nullable, bool):
            raise InvalidArgument(f"column {name!r}: nullable must be a boolean")
        return cls(name, ColumnType.from_json(type_), nullable)


@dataclass(frozen=True)
class TableSchema:
    """A base table: ordered columns and a primary key. Always valid once constructed."""

    name: str
    table_id: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    _by_name: dict[str, Column] = field(init=False, repr=False, compare=False)
    # the key's column types, asked at every key encoded
    _key_types: tuple[ColumnType, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument(f"table name must be a non-empty string; got {self.name!r}")
        if not isinstance(self.table_id, str) or not self.table_id:
            raise InvalidArgument(f"table {self.name}: table_id must be a non-empty string")
        if not self.columns:
            raise InvalidArgument(f"table {self.name} must have at least one column")
        by_name: dict[str, Column] = {}
        for col in self.columns:
            if not isinstance(col, Column):
                raise InvalidArgument(f"table {self.name}: {col!r} is not a Column")
            if not isinstance(col.name, str) or not col.name:
                raise InvalidArgument(f"table {self.name}: column names must be non-empty")
            if col.name in by_name:
                raise InvalidArgument(f"table {self.name} has two columns named {col.name!r}")
            by_name[col.name] = col
        if not self.primary_key:
            raise InvalidArgument(f"table {self.name} must have a primary key")
        if len(set(self.primary_key)) != len(self.primary_key):
            raise InvalidArgument(f"table {self.name}: primary key repeats a column")
        for key_col in self.primary_key:
            col = by_name.get(key_col)
            if col is None:
                raise UnknownColumn(
                    f"table {self.name}: primary key column {key_col!r} is not a column"
                )
            if col.nullable:
                raise InvalidArgument(
                    f"table {self.name}: primary key column {key_col!r} must be NOT NULL"
                )
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_key_types", tuple(by_name[n].type for n in self.primary_key))

    @classmethod
    def build(
        cls,
        name: str,
        table_id: str,
        columns: Iterable[Column],
        primary_key: Iterable[str] | str,
    ) -> TableSchema:
        """Construct from loose arguments, making the primary key columns NOT NULL."""
        key = (primary_key,) if isinstance(primary_key, str) else tuple(primary_key)
        cols = tuple(
            Column(c.name, c.type, False) if c.name in key and c.nullable else c for c in columns
        )
        return cls(name, table_id, cols, key)

    def column(self, name: str) -> Column:
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise UnknownColumn(f"table {self.name} has no column {name!r}") from None

    def has_column(self, name: str) -> bool:
        return name in self._by_name

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(self._by_name[n] for n in self.primary_key)

    @property
    def key_types(self) -> tuple[ColumnType, ...]:
        return self._key_types

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "table_id": self.table_id,
            "columns": [c.to_json() for c in self.columns],
            "primary_key": list(self.primary_key),
        }

    @classmethod
    def from_json(cls, data: object) -> TableSchema:
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"table schema must be an object; got {data!r}")
        try:
            name, table_id = data["name"], data["table_id"]
            columns, primary_key = data["columns"], data["primary_key"]
        except KeyError as exc:
            raise InvalidArgument(f"table schema lacks {exc.args[0]!r}") from None
        if not isinstance(columns, list) or not isinstance(primary_key, list):
            raise InvalidArgument("table schema: columns and primary_key must be lists")
        return cls.build(name, table_id, [Column.from_json(c) for c in columns], primary_key)


# --- value conversion ------------------------------------------------------------------------


def _show(value: object) -> str:
    """Describe an offending value briefly: its type and a bounded rendering."""
    text = repr(value) if isinstance(value, str | bytes) else str(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _mismatch(column: Column, table: str, value: object, why: str = "") -> TypeMismatch:
    return TypeMismatch(f"column {table}.{column.name} is {column.type}; got {_show(value)}{why}")


def _decimal_to_scaled(
    column: Column, table: str, original: object, value: Decimal, precision: int, scale: int
) -> int:
    """Exact Decimal -> int scaled by 10**scale, without a decimal context (which would round)."""
    if not value.is_finite():
        raise _mismatch(column, table, original, ", which is not a finite number")
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    magnitude = int("".join(map(str, digits)))
    if magnitude == 0:
        return 0
    if value.adjusted() >= precision - scale:
        raise _mismatch(
            column, table, original, f", which needs more than {precision - scale} integer digits"
        )
    shift = exponent + scale
    if shift >= 0:
        scaled = magnitude * 10**shift
    else:
        # More fractional digits than the scale: fine only if the extra ones are zeros.
        if -shift > len(digits) or magnitude % 10**-shift:
            raise _mismatch(
                column, table, original, f", which has more than {scale} fractional digits"
            )
        scaled = magnitude // 10**-shift
    return -scaled if sign else scaled


def to_storage(column: Column, value: object, *, table: str) -> object:
    """Convert a Python value to the storage form of ``column``, refusing anything inexact."""
    if value is None:
        if not column.nullable:
            raise TypeMismatch(f"column {table}.{column.name} is NOT NULL")
        return None
    kind = column.type.kind
    if kind == "INT":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _mismatch(column, table, value)
        if not INT_MIN <= value <= INT_MAX:
            raise _mismatch(column, table, value, ", which does not fit in 64 bits")
        return int(value)
    if kind == "DECIMAL":
        precision, scale = column.type.precision, column.type.scale
        assert precision is not None and scale is not None
        if isinstance(value, Decimal):
            dec = value
        elif isinstance(value, int) and not isinstance(value, bool):
            dec = Decimal(value)
        elif isinstance(value, str):
            if not _DECIMAL_STR_RE.fullmatch(value.strip()):
                raise _mismatch(column, table, value, ", which is not a decimal number")
            dec = Decimal(value.strip())
        else:
            raise _mismatch(column, table, value)
        return _decimal_to_scaled(column, table, value, dec, precision, scale)
    if kind == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, float | int):
            raise _mismatch(column, table, value)
        try:
            number = float(value)
        except OverflowError:
            raise _mismatch(column, table, value, ", which is too large for a FLOAT") from None
        if number != number:
            raise _mismatch(column, table, value, ", which is not a number")
        return number + 0.0  # normalizes -0.0 to 0.0 so equal values store identically
    if kind == "TEXT":
        if not isinstance(value, str):
            raise _mismatch(column, table, value)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _mismatch(column, table, value, ", which is not valid Unicode") from None
        return str(value)
    if kind == "DATE":
        if isinstance(value, datetime.datetime):
            raise _mismatch(column, table, value)
        if isinstance(value, datetime.date):
            return value.toordinal() - _EPOCH_ORDINAL
        if isinstance(value, str):
            try:
                if not _DATE_STR_RE.fullmatch(value):
                    raise ValueError
                return datetime.date.fromisoformat(value).toordinal() - _EPOCH_ORDINAL
            except ValueError:
                raise _mismatch(
                    column, table, value, ", which is not an ISO-8601 date YYYY-MM-DD"
                ) from None
        raise _mismatch(column, table, value)
    if kind == "BOOL":
        if not isinstance(value, bool):
            raise _mismatch(column, table, value)
        return value
    raise AssertionError(f"unhandled kind {kind}")  # pragma: no cover


def from_storage(column_type: ColumnType, stored: object) -> object:
    """Convert a storage-form value back to the Python value a user sees."""
    if stored is None:
        return None
    kind = column_type.kind
    ok = (
        (kind in ("INT", "DECIMAL", "DATE") and type(stored) is int)
        or (kind == "FLOAT" and type(stored) in (float, int))
        or (kind == "TEXT" and type(stored) is str)
        or (kind == "BOOL" and type(stored) is bool)
    )
    if not ok:
        raise TypeMismatch(f"stored value {_show(stored)} is not a valid {column_type}")
    if kind == "DECIMAL":
        assert isinstance(stored, int) and column_type.scale is not None
        # exact (a string is read without the context's rounding), the unscaled integer as
        # the coefficient: the same digits and exponent as Decimal((sign, digits, -scale))
        return Decimal(f"{stored}E-{column_type.scale}")
    if kind == "DATE":
        assert isinstance(stored, int)
        try:
            return datetime.date.fromordinal(stored + _EPOCH_ORDINAL)
        except (ValueError, OverflowError):
            raise TypeMismatch(f"stored value {stored} is not a valid DATE") from None
    if kind == "FLOAT":
        assert isinstance(stored, float | int)
        return float(stored)
    return stored


def row_to_storage(schema: TableSchema, row: Mapping[str, object]) -> dict[str, object]:
    """Convert a whole row; absent non-key columns become NULL (if the column allows it)."""
    by_name = schema._by_name
    for name in row:
        if name not in by_name:
            schema.column(name)  # raises UnknownColumn
    for name in schema.primary_key:
        if name not in row:
            raise InvalidArgument(f"row of table {schema.name} lacks primary key column {name!r}")
    out = {}
    for col in schema.columns:
        value = row.get(col.name)
        if type(value) is int and col.type.kind == "INT" and INT_MIN <= value <= INT_MAX:
            out[col.name] = value  # as ``to_storage`` has it, without its dispatch
        else:
            out[col.name] = to_storage(col, value, table=schema.name)
    return out


def key_to_storage(schema: TableSchema, key: Mapping[str, object]) -> tuple[object, ...]:
    """Convert a full primary key, given as column -> value, to a tuple in key order."""
    primary_key = schema.primary_key
    if len(key) != len(primary_key) or not all(c in key for c in primary_key):
        missing = [c for c in primary_key if c not in key]
        extra = [c for c in key if c not in primary_key]
        problems = []
        if missing:
            problems.append(f"missing {', '.join(missing)}")
        if extra:
            problems.append(f"extra {', '.join(map(str, extra))}")
        raise InvalidArgument(
            f"key of table {schema.name} must give exactly the primary key columns "
            f"({', '.join(schema.primary_key)}); {'; '.join(problems)}"
        )
    return tuple(to_storage(schema.column(c), key[c], table=schema.name) for c in primary_key)


def prefix_to_storage(schema: TableSchema, prefix: Mapping[str, object]) -> tuple[object, ...]:
    """Convert a leading part of the primary key, the only shape a prefix scan can serve."""
    for name in prefix:
        schema.column(name)  # raises UnknownColumn
    leading = schema.primary_key[: len(prefix)]
    if set(prefix) != set(leading):
        raise InvalidArgument(
            f"prefix must be a leading part of the primary key ({', '.join(schema.primary_key)}); "
            f"got ({', '.join(prefix)})"
        )
    return tuple(to_storage(schema.column(c), prefix[c], table=schema.name) for c in leading)
