"""Rows as compact JSON: the direct C calls give what the json module's documented path gives,
errors included."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggview.rowcodec import (
    MalformedData,
    decode_json,
    decode_row,
    decode_stored,
    encode_json,
    encode_row,
    encode_stored,
)

_REFERENCE_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
rows = st.dictionaries(st.text(min_size=1), values, min_size=1, max_size=6)


@given(values)
def test_values_encode_as_the_json_module_encodes_them_and_come_back(value: object) -> None:
    data = encode_json(value)
    assert data == _REFERENCE_ENCODER.encode(value).encode()
    assert decode_json(data) == json.loads(data)


@given(rows, st.integers(min_value=0, max_value=2**63), st.integers(min_value=0, max_value=2**40))
def test_rows_and_stored_rows_round_trip(row: dict, ts: int, lsn: int) -> None:
    assert decode_row(encode_row(row)) == row
    assert decode_stored(encode_stored(ts, row, lsn)) == (ts, row, lsn)


@given(values, st.sampled_from([" ", "\n", "\t ", "\r\n"]))
def test_text_with_whitespace_reads_as_the_json_module_reads_it(value: object, space: str) -> None:
    text = space + _REFERENCE_ENCODER.encode(value) + space
    assert decode_json(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    "data",
    [b"{", b'{"a":1}x', b'{"a":1} {}', b"[1,]", b'{"a":NaN}', b'{"a":Infinity}', b"\xff", b"nul"],
)
def test_malformed_text_is_refused_with_the_json_module_s_reason(data: bytes) -> None:
    with pytest.raises(MalformedData, match="malformed"):
        decode_json(data)
    with pytest.raises(MalformedData, match="malformed row data"):
        decode_row(data)


def test_a_row_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(MalformedData, match="a JSON object expected"):
        decode_row(b"[1,2]")


def test_an_infinite_float_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        encode_row({"x": float("inf")})
