"""Order-preserving encoding of composite primary keys into store row keys.

Stores only order bytes, so range and prefix scans over typed keys work only if the byte order
of encodings equals the order of the values. Every component is fixed-width or self-delimiting,
which makes the encoding of a key prefix an exact byte prefix: a prefix scan returns exactly the
keys whose leading components equal the prefix, never a key that merely shares bytes with it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence

from aggview.errors import InvalidArgument, LimitExceeded
from aggview.schema import INT_MAX, INT_MIN, ColumnType, TableSchema, key_to_storage

MAX_KEY_BYTES = 4096  # the default limit on one encoded primary key (``max_key_bytes``)

_INT_BIAS = 1 << 63
_DECIMAL_BIAS = 1 << 127
_DATE_BIAS = 1 << 31
_FLOAT_SIGN = 1 << 63
TEXT_END = b"\x00\x01"  # a TEXT value ends here; a zero byte inside it is \x00\xff
_TEXT_ZERO = b"\x00\xff"


def _bad(value: object, column_type: ColumnType, index: int, why: str = "") -> InvalidArgument:
    return InvalidArgument(
        f"key component {index} ({column_type}) cannot be encoded: {type(value).__name__} "
        f"{value!r}{why}"
    )


def _encode_one(column_type: ColumnType, value: object, index: int, out: bytearray) -> None:
    if value is None:
        raise InvalidArgument(f"key component {index} ({column_type}) is NULL; keys cannot be")
    kind = column_type.kind
    if kind == "BOOL":
        if not isinstance(value, bool):
            raise _bad(value, column_type, index)
        out.append(1 if value else 0)
        return
    if kind == "TEXT":
        if not isinstance(value, str):
            raise _bad(value, column_type, index)
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(value, column_type, index, " (not valid Unicode)") from None
        out += raw.replace(b"\x00", _TEXT_ZERO)
        out += TEXT_END
        return
    if kind == "FLOAT":
        if isinstance(value, bool) or not isinstance(value, float | int):
            raise _bad(value, column_type, index)
        number = float(value) + 0.0  # -0.0 + 0.0 == 0.0: equal values, equal bytes
        if math.isnan(number):
            raise _bad(value, column_type, index, " (NaN has no order)")
        (bits,) = struct.unpack(">Q", struct.pack(">d", number))
        # Negative floats: invert all bits (larger magnitude sorts first); others: set sign bit.
        bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits & _FLOAT_SIGN else bits | _FLOAT_SIGN
        out += bits.to_bytes(8, "big")
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(value, column_type, index)
    if kind == "INT":
        if not INT_MIN <= value <= INT_MAX:
            raise _bad(value, column_type, index, " (out of 64-bit range)")
        out += (value + _INT_BIAS).to_bytes(8, "big")
    elif kind == "DECIMAL":
        assert column_type.precision is not None
        if abs(value) >= 10**column_type.precision:
            raise _bad(value, column_type, index, " (exceeds the precision)")
        out += (value + _DECIMAL_BIAS).to_bytes(16, "big")
    elif kind == "DATE":
        if not -_DATE_BIAS <= value < _DATE_BIAS:
            raise _bad(value, column_type, index, " (out of range)")
        out += (value + _DATE_BIAS).to_bytes(4, "big")
    else:  # pragma: no cover - ColumnType refuses other kinds
        raise AssertionError(kind)


_WIDTHS = {"BOOL": 1, "INT": 8, "FLOAT": 8, "DECIMAL": 16, "DATE": 4}


def encoded_width(column_type: ColumnType) -> int | None:
    """Bytes of one encoded value of this type; None for TEXT (it ends at ``TEXT_END``)."""
    return _WIDTHS.get(column_type.kind)


def encode_key(types: Sequence[ColumnType], values: Sequence[object]) -> bytes:
    """Encode storage-form values; pass the first k types and values to encode a scan prefix."""
    if len(values) == 1 == len(types):  # the common key, one INT: as below, without the loop
        value = values[0]
        if type(value) is int and types[0].kind == "INT" and INT_MIN <= value <= INT_MAX:
            return (value + _INT_BIAS).to_bytes(8, "big")
    if len(types) != len(values):
        raise InvalidArgument(f"key has {len(values)} components; expected {len(types)}")
    out = bytearray()
    for index, (column_type, value) in enumerate(zip(types, values, strict=True)):
        _encode_one(column_type, value, index, out)
    return bytes(out)


def encode_stored_key(
    schema: TableSchema, stored: Sequence[object], max_bytes: int = MAX_KEY_BYTES
) -> bytes:
    """A table's primary key already in storage form, encoded and checked against the key
    size limit."""
    data = encode_key(schema.key_types, stored)
    if len(data) > max_bytes:
        raise LimitExceeded(
            f"table {schema.name}: key of {len(data)} bytes is over the "
            f"{max_bytes} byte limit (max_key_bytes)"
        )
    return data


def table_key(
    schema: TableSchema, key: Mapping[str, object], max_bytes: int = MAX_KEY_BYTES
) -> bytes:
    """A table's full primary key, given as column -> value, encoded as its row key."""
    return encode_stored_key(schema, key_to_storage(schema, key), max_bytes)


def _take(data: bytes, pos: int, width: int, column_type: ColumnType, index: int) -> bytes:
    if pos + width > len(data):
        raise InvalidArgument(f"malformed key: component {index} ({column_type}) is truncated")
    return data[pos : pos + width]


def decode_key(types: Sequence[ColumnType], data: bytes) -> tuple[object, ...]:
    """Invert :func:`encode_key`; refuse any byte string it could not have produced."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidArgument(f"key must be bytes; got {type(data).__name__}")
    data = bytes(data)
    values: list[object] = []
    pos = 0
    for index, column_type in enumerate(types):
        kind = column_type.kind
        if kind == "TEXT":
            raw = bytearray()
            while True:
                zero = data.find(b"\x00", pos)
                if zero < 0 or zero + 1 >= len(data):
                    raise InvalidArgument(
                        f"malformed key: TEXT component {index} lacks its terminator"
                    )
                raw += data[pos:zero]
                marker = data[zero + 1]
                pos = zero + 2
                if marker == 0x01:
                    break
                if marker != 0xFF:
                    raise InvalidArgument(
                        f"malformed key: bad escape 0x00 0x{marker:02x} in TEXT component {index}"
                    )
                raw.append(0)
            try:
                values.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidArgument(
                    f"malformed key: TEXT component {index} is not UTF-8"
                ) from None
            continue
        width = {"BOOL": 1, "INT": 8, "FLOAT": 8, "DECIMAL": 16, "DATE": 4}[kind]
        chunk = _take(data, pos, width, column_type, index)
        pos += width
        number = int.from_bytes(chunk, "big")
        if kind == "BOOL":
            if number > 1:
                raise InvalidArgument(f"malformed key: BOOL component {index} is {number}")
            values.append(number == 1)
        elif kind == "INT":
            values.append(number - _INT_BIAS)
        elif kind == "DATE":
            values.append(number - _DATE_BIAS)
        elif kind == "DECIMAL":
            value = number - _DECIMAL_BIAS
            assert column_type.precision is not None
            if abs(value) >= 10**column_type.precision:
                raise InvalidArgument(
                    f"malformed key: DECIMAL component {index} exceeds {column_type}"
                )
            values.append(value)
        else:  # FLOAT
            bits = number ^ _FLOAT_SIGN if number & _FLOAT_SIGN else number ^ 0xFFFF_FFFF_FFFF_FFFF
            (result,) = struct.unpack(">d", bits.to_bytes(8, "big"))
            if math.isnan(result):
                raise InvalidArgument(f"malformed key: FLOAT component {index} is NaN")
            values.append(result)
    if pos != len(data):
        raise InvalidArgument(f"malformed key: {len(data) - pos} bytes left after the last column")
    return tuple(values)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string starting with ``prefix``; None if unbounded.

    Turns a prefix scan into the range scan [prefix, prefix_end(prefix)) that stores support.
    """
    stripped = bytes(prefix).rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
