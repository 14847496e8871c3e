"""Python values <-> the wire's ``Value`` (``aggview.values``): every supported value comes
back as it went, set in place in a row or built alone; what has no wire form is refused with
the column named."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggview import errors
from aggview.values import from_row, from_value, to_row, to_value

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.decimals(allow_nan=False, allow_infinity=False, places=4),
    st.floats(allow_nan=False),
    st.text(),
    st.dates(),
)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type (True is not 1 here)."""
    return type(a) is type(b) and a == b


@given(st.dictionaries(st.text(min_size=1), VALUES, max_size=6))
def test_a_row_comes_back_as_it_went(row: dict[str, Any]) -> None:
    back = from_row(to_row(row))
    assert back.keys() == row.keys()
    assert all(same(back[k], v) for k, v in row.items()), (row, back)
    assert all(same(from_value(to_value(v)), v) for v in row.values())


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (2**63, "does not fit in 64 bits"),
        (-(2**63) - 1, "does not fit in 64 bits"),
        (datetime.datetime(2026, 1, 1), "is a datetime"),
        (object(), "unsupported value"),
        (b"bytes", "unsupported value"),
    ],
)
def test_a_value_without_a_wire_form_is_refused_naming_its_column(value: Any, why: str) -> None:
    with pytest.raises(errors.TypeMismatch, match=f"column shop.amount: .*{why}"):
        to_row({"id": 1, "amount": value}, "shop")
    with pytest.raises(errors.TypeMismatch, match=why):
        to_value(value)


def test_a_decimal_keeps_its_digits() -> None:
    assert same(from_value(to_value(decimal.Decimal("12.3400"))), decimal.Decimal("12.3400"))
