"""cumulus.runtime.wire: every runtime message survives encode -> bytes -> decode exactly, value
types included (True is not 1, Decimal('1.50') is not Decimal('1.5'), a tuple is not a list),
and anything else is refused with a TypeError."""

from __future__ import annotations

import datetime
import typing
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggview.wire import cumulus_pb2 as pb
from cumulus.runtime.messages import (
    Batch,
    Corrective,
    Dispatch,
    EpochCommit,
    EpochEnd,
    EpochEndRequest,
    EpochReady,
    Fetch,
    Message,
    Push,
    Read,
    Settled,
    Slice,
)
from cumulus.runtime.wire import decode, decode_entries, encode, encode_entries

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
decimals = st.one_of(
    st.sampled_from([Decimal("1.50"), Decimal("-0.00"), Decimal("0E+3"), Decimal("1E+2")]),
    st.builds(  # any sign, up to 30 digits, exponents either side of the point
        lambda sign, digits, exponent: Decimal((sign, digits, exponent)),
        st.integers(0, 1),
        st.lists(st.integers(0, 9), min_size=1, max_size=30).map(tuple),
        st.integers(-30, 30),
    ),
)
values = st.one_of(
    int64,
    decimals,
    st.floats(allow_nan=False),
    st.text(),
    st.dates(),
    st.booleans(),
    st.none(),
)
keys = st.lists(values, max_size=4).map(tuple)
timestamps = st.tuples(int64, int32)
ints32 = st.lists(int32, max_size=4).map(tuple)


def tuples(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.lists(strategy, max_size=4).map(tuple)


MESSAGES: dict[type, st.SearchStrategy[Any]] = {
    Dispatch: st.builds(
        Dispatch,
        ts=timestamps,
        trigger=int32,
        args=keys,
        puts=tuples(st.tuples(int32, int32)),
        fetches=tuples(st.builds(Fetch, statement=int32, factors=ints32, writers=ints32)),
        puts_before=int64,
    ),
    Push: st.builds(
        Push,
        ts=timestamps,
        source=int32,
        statements=ints32,
        slices=tuples(
            st.builds(Slice, statement=int32, factor=int32, entries=tuples(st.tuples(keys, values)))
        ),
    ),
    Corrective: st.builds(
        Corrective,
        source=int32,
        write_ts=timestamps,
        map=st.text(),
        key=keys,
        delta=values,
        reads=tuples(st.builds(Read, ts=timestamps, statement=int32, factor=int32)),
        depth=int32,
        seq=int64,
    ),
    Settled: st.builds(Settled, seq=int64),
    EpochEnd: st.builds(EpochEnd, cut=int64, switch=int32),
    EpochReady: st.builds(EpochReady, cut=int64, source=int32),
    EpochCommit: st.builds(EpochCommit, cut=int64),
    EpochEndRequest: st.builds(EpochEndRequest, source=int32),
}
MESSAGES[Batch] = st.builds(Batch, messages=tuples(st.one_of(*MESSAGES.values())))


def assert_same(got: Any, want: Any) -> None:
    """Equal, and alike in every value's type and form: repr tells 1 from True and 1.0,
    Decimal('1.50') from Decimal('1.5'), -0.0 from 0.0 and a tuple from a list; == does not."""
    assert got == want
    assert repr(got) == repr(want)


def test_every_message_type_has_a_strategy() -> None:
    assert set(MESSAGES) == set(typing.get_args(Message))


@pytest.mark.parametrize("kind", list(MESSAGES), ids=lambda t: t.__name__)
@given(data=st.data())
def test_round_trip(kind: type, data: st.DataObject) -> None:
    message = data.draw(MESSAGES[kind])
    assert_same(decode(encode(message)), message)


@given(message=st.one_of(*MESSAGES.values()))
def test_round_trip_through_bytes(message: Message) -> None:
    wire = encode(message).SerializeToString()
    assert_same(decode(pb.Envelope.FromString(wire)), message)


def test_values_keep_their_types() -> None:
    tricky = (True, 1, 1.0, -0.0, Decimal("1.50"), Decimal("-1E+3"), datetime.date(1, 1, 1), "é")
    message = Corrective(
        source=2,
        write_ts=(7, 1),
        map="q",
        key=tricky,
        delta=Decimal("0.10"),
        reads=(Read((8, 0), 1, 0), Read((9, 1), 1, 1)),
        depth=1,
        seq=4,
    )
    got = decode(encode(message))
    assert [type(part) for part in got.key] == [type(part) for part in tricky]
    assert_same(got, message)


@given(entries=st.dictionaries(keys, values, max_size=6))
def test_entries_round_trip(entries: dict[Any, Any]) -> None:
    got = decode_entries(encode_entries(entries))
    assert_same(got, entries)
    assert list(got) == list(entries)


def test_unknown_message_type_is_refused() -> None:
    with pytest.raises(TypeError, match="Fetch"):
        encode(Fetch(0, (), ()))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="object"):
        encode(object())  # type: ignore[arg-type]


def test_envelope_without_a_runtime_message_is_refused() -> None:
    with pytest.raises(TypeError, match="None"):
        decode(pb.Envelope())
    with pytest.raises(TypeError, match="completed"):
        decode(pb.Envelope(completed=pb.Completed(ts=[pb.Ts(counter=1)])))
    with pytest.raises(TypeError, match="hello"):
        decode(pb.Envelope(hello=pb.Hello(switch_id=0)))
    with pytest.raises(TypeError, match="Dispatch"):
        decode(pb.Dispatch())  # type: ignore[arg-type]
