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

Row = dict[str, Any]


# an index entry's whole row: written and read at every indexed insert
EMPTY_ROW = b"{}"


def encode_row(row: Row | None) -> bytes:
    """An absent row encodes as empty bytes."""
    if row is None:
        return b""
    return _encoder.encode(row).encode() if row else EMPTY_ROW


class MalformedData(errors.InvalidArgument, ValueError):
    """Bytes that are not the JSON they should be: a peer's bug or a fuzzer, never a crash."""


def decode_row(data: bytes) -> Row | None:
    if not data:
        return None
    if data == EMPTY_ROW:
        return {}
    try:
        row = _decoder.decode(data.decode())
    except ValueError as exc:  # bad UTF-8 or bad JSON
        raise MalformedData(f"malformed row data: {exc}") from None
    if not isinstance(row, dict):
        raise MalformedData(f"malformed row data: a JSON object expected, got {row!r:.40}")
    return row


def encode_json(value: Any) -> bytes:
    return _encoder.encode(value).encode()


def decode_json(data: bytes) -> Any:
    if not data:
        return None
    try:
        return _decoder.decode(data.decode())
    except ValueError as exc:
        raise MalformedData(f"malformed JSON: {exc}") from None


def encode_stored(ts: int, row: Row, lsn: int = 0) -> bytes:
    """A row as the store keeps it: with the commit timestamp of the version and the log
    sequence number of the last change in it, so that log replay after a crash applies
    exactly the changes the stored copy lacks (and merges never twice)."""
    return _encoder.encode([ts, row, lsn]).encode()


def decode_stored(data: bytes) -> tuple[int, Row, int]:
    ts, row, *rest = _decoder.decode(data.decode())
    return ts, row, rest[0] if rest else 0
