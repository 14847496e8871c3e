"""Rows in storage form as compact JSON: what travels between coordinator and LTMs and sits in
the store. JSON keeps an LTM schema-agnostic and is decoded in C."""

from __future__ import annotations

import json
from typing import Any

from aggview import errors

_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


_decoder = json.JSONDecoder(parse_constant=_no_constant)  # NaN, Infinity: refused as on encode

# The json module's C encoder and scanner called directly, as ``JSONEncoder.encode`` and
# ``JSONDecoder.decode`` call them after a few Python steps (half of the cost of a small row:
# rows are encoded and decoded a dozen times a transaction). Anything the direct call does not
# take as it comes (whitespace, a malformed text) goes the documented way, for its error.
_c_encode = (
    json.encoder.c_make_encoder(
        {}, _encoder.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if json.encoder.c_make_encoder is not None
    else None
)
_scan = _decoder.scan_once


def _dumps(value: Any) -> str:
    return _encoder.encode(value) if _c_encode is None else "".join(_c_encode(value, 0))


def _loads(text: str) -> Any:
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        return _decoder.decode(text)  # raises what is wrong, or reads what has whitespace
    return value


Row = dict[str, Any]


# an index entry's whole row: written and read at every indexed insert
EMPTY_ROW = b"{}"


def encode_row(row: Row | None) -> bytes:
    """An absent row encodes as empty bytes."""
    if row is None:
        return b""
    return _dumps(row).encode() if row else EMPTY_ROW


class MalformedData(errors.InvalidArgument, ValueError):
    """Bytes that are not the JSON they should be: a peer's bug or a fuzzer, never a crash."""


def decode_row(data: bytes) -> Row | None:
    if not data:
        return None
    if data == EMPTY_ROW:
        return {}
    try:
        row = _loads(data.decode())
    except ValueError as exc:  # bad UTF-8 or bad JSON
        raise MalformedData(f"malformed row data: {exc}") from None
    if not isinstance(row, dict):
        raise MalformedData(f"malformed row data: a JSON object expected, got {row!r:.40}")
    return row


def encode_json(value: Any) -> bytes:
    return _dumps(value).encode()


def decode_json(data: bytes) -> Any:
    if not data:
        return None
    try:
        return _loads(data.decode())
    except ValueError as exc:
        raise MalformedData(f"malformed JSON: {exc}") from None


def encode_stored(ts: int, row: Row, lsn: int = 0) -> bytes:
    """A row as the store keeps it: with the commit timestamp of the version and the log
    sequence number of the last change in it, so that log replay after a crash applies
    exactly the changes the stored copy lacks (and merges never twice)."""
    return _dumps([ts, row, lsn]).encode()


def decode_stored(data: bytes) -> tuple[int, Row, int]:
    ts, row, *rest = _loads(data.decode())
    return ts, row, rest[0] if rest else 0
