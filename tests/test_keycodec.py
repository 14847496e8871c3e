"""Properties of the key encoding: byte order is value order, prefixes are exact, it inverts."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggview.errors import InvalidArgument
from aggview.keycodec import decode_key, encode_key, encoded_width, prefix_end
from aggview.partition_map import index_table, partition_of
from aggview.schema import ColumnType

PROPERTY = settings(max_examples=200, deadline=None)

INT = ColumnType("INT")
FLOAT = ColumnType("FLOAT")
TEXT = ColumnType("TEXT")
DATE = ColumnType("DATE")
BOOL = ColumnType("BOOL")

column_types = st.one_of(
    st.sampled_from([INT, FLOAT, TEXT, DATE, BOOL]),
    st.integers(1, 38).flatmap(
        lambda p: st.integers(0, p).map(lambda s: ColumnType("DECIMAL", p, s))
    ),
)


def values_of(column_type: ColumnType) -> st.SearchStrategy[object]:
    kind = column_type.kind
    if kind == "INT":
        return st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, -1, 1, 2**63 - 1])
    if kind == "DECIMAL":
        assert column_type.precision is not None
        bound = 10**column_type.precision - 1
        return st.integers(-bound, bound) | st.sampled_from([-bound, bound, 0])
    if kind == "FLOAT":
        return st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, math.inf, -math.inf])
    if kind == "TEXT":
        return st.text(alphabet=st.sampled_from("\x00\x01ab\xff\u0100\U0001f600")) | st.text()
    if kind == "DATE":
        return st.integers(-719_162, 2_932_896)
    return st.booleans()


key_types = st.lists(column_types, min_size=1, max_size=3)


def keys_of(types: list[ColumnType]) -> st.SearchStrategy[tuple[object, ...]]:
    return st.tuples(*(values_of(t) for t in types))


def sign(a: object, b: object) -> int:
    return (a > b) - (a < b)  # type: ignore[operator]


@PROPERTY
@given(st.data())
def test_byte_order_is_value_order(data: st.DataObject) -> None:
    types = data.draw(key_types)
    keys = data.draw(st.lists(keys_of(types), min_size=2, max_size=8))
    encoded = {i: encode_key(types, k) for i, k in enumerate(keys)}
    for i, a in enumerate(keys):
        for j, b in enumerate(keys):
            assert sign(encoded[i], encoded[j]) == sign(a, b), (types, a, b)


@PROPERTY
@given(st.data())
def test_decode_inverts_encode(data: st.DataObject) -> None:
    types = data.draw(key_types)
    key = data.draw(keys_of(types))
    decoded = decode_key(types, encode_key(types, key))
    assert decoded == key
    assert [type(v) for v in decoded] == [type(v) for v in key]


@PROPERTY
@given(st.data())
def test_prefix_encoding_is_exact(data: st.DataObject) -> None:
    types = data.draw(key_types)
    key = data.draw(keys_of(types))
    # Another key sharing each component with `key` at random, so shared prefixes are common.
    fresh = data.draw(keys_of(types))
    mix = data.draw(st.lists(st.booleans(), min_size=len(types), max_size=len(types)))
    other = tuple(k if same else f for k, f, same in zip(key, fresh, mix, strict=True))
    full, other_full = encode_key(types, key), encode_key(types, other)
    for j in range(len(types) + 1):
        prefix = encode_key(types[:j], key[:j])
        assert full.startswith(prefix)
        assert other_full.startswith(prefix) == (other[:j] == key[:j])
        assert decode_key(types[:j], prefix) == key[:j]


def test_text_prefix_is_a_whole_component() -> None:
    types = [TEXT, INT]
    prefix = encode_key([TEXT], ["ab"])
    assert encode_key(types, ["ab", 5]).startswith(prefix)
    assert not encode_key(types, ["abc", 5]).startswith(prefix)
    assert not encode_key(types, ["ab\x00", 5]).startswith(prefix)


def test_negative_zero_encodes_as_zero() -> None:
    assert encode_key([FLOAT], [-0.0]) == encode_key([FLOAT], [0.0]) == encode_key([FLOAT], [0])
    assert math.copysign(1.0, decode_key([FLOAT], encode_key([FLOAT], [-0.0]))[0]) == 1.0


def test_fixed_widths() -> None:
    dec = ColumnType("DECIMAL", 38, 2)
    assert (
        len(encode_key([INT, dec, FLOAT, DATE, BOOL], [1, 2, 3.0, 4, True])) == 8 + 16 + 8 + 4 + 1
    )
    assert encode_key([TEXT], ["a\x00b"]) == b"a\x00\xffb\x00\x01"


@pytest.mark.parametrize(
    ("types", "values"),
    [
        ([INT], [None]),
        ([INT], [True]),
        ([INT], [1.0]),
        ([INT], [2**63]),
        ([ColumnType("DECIMAL", 3, 1)], [1000]),
        ([FLOAT], [math.nan]),
        ([FLOAT], ["1.0"]),
        ([TEXT], [b"bytes"]),
        ([TEXT], ["\ud800"]),
        ([DATE], [2**31]),
        ([BOOL], [1]),
        ([INT, INT], [1]),
    ],
)
def test_encode_refuses(types: list[ColumnType], values: list[object]) -> None:
    with pytest.raises(InvalidArgument):
        encode_key(types, values)


@pytest.mark.parametrize(
    ("types", "data"),
    [
        ([INT], b"\x80\x00"),  # truncated
        ([INT], b"\x80" + b"\x00" * 8),  # trailing byte
        ([BOOL], b"\x02"),
        ([TEXT], b"abc"),  # no terminator
        ([TEXT], b"abc\x00"),  # half a terminator
        ([TEXT], b"a\x00\x02\x00\x01"),  # bad escape
        ([TEXT], b"\xff\xfe\x00\x01"),  # not UTF-8
        ([ColumnType("DECIMAL", 2, 0)], (100 + 2**127).to_bytes(16, "big")),
        ([FLOAT], b"\xff\xf8" + b"\x00" * 6),  # NaN
        ([], b"x"),
    ],
)
def test_decode_refuses_malformed(types: list[ColumnType], data: bytes) -> None:
    with pytest.raises(InvalidArgument, match="malformed key"):
        decode_key(types, data)


@PROPERTY
@given(st.binary(max_size=6), st.lists(st.binary(max_size=8), max_size=20))
def test_prefix_end_bounds_exactly_the_prefixed_strings(prefix: bytes, others: list[bytes]) -> None:
    end = prefix_end(prefix)
    for other in [*others, prefix, prefix + b"\x00", prefix + b"\xff\xff"]:
        inside = prefix <= other and (end is None or other < end)
        assert inside == other.startswith(prefix), (prefix, other, end)


@PROPERTY
@given(st.binary(max_size=6))
def test_prefix_end_is_the_smallest_upper_bound(prefix: bytes) -> None:
    end = prefix_end(prefix)
    if end is None:
        assert set(prefix) <= {0xFF}
        return
    assert end > prefix and not end.startswith(prefix)
    # Nothing lies strictly between the prefixed strings and `end`: end minus its last byte's
    # increment is a prefix of `prefix` followed only by 0xFF bytes.
    head = end[:-1] + bytes([end[-1] - 1])
    assert prefix.startswith(head)
    assert set(prefix[len(head) :]) <= {0xFF}


def test_prefix_end_examples() -> None:
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\x00") == b"\x01"
    assert prefix_end(b"\xff\xff") is None
    assert prefix_end(b"") is None


@PROPERTY
@given(st.data(), column_types, st.binary(max_size=24), st.integers(1, 7))
def test_an_index_entry_lives_with_its_base_row(
    data: st.DataObject, column_type: ColumnType, base_key: bytes, partitions: int
) -> None:
    value = data.draw(values_of(column_type))
    prefix = encode_key([column_type], [value])
    width = encoded_width(column_type)
    assert width is None or len(prefix) == width
    index_id = index_table(7, width, "t3_events")
    assert partition_of(index_id, prefix + base_key, partitions) == partition_of(
        "t3_events", base_key, partitions
    )
