"""How an ad-hoc query's rows reach duckdb (``coordinator.adhoc._execute``, a pure function):
every value of every column type, NULLs and whole NULL columns included, comes back from
``SELECT *`` exactly as loaded, whether the rows went through Arrow or, where Arrow cannot
hold a value, one at a time."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import examples

from aggview.schema import ColumnType
from coordinator.adhoc import _execute

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def column_and_values(draw: st.DrawFn) -> tuple[str, st.SearchStrategy[Any]]:
    kind = draw(st.sampled_from(["INT", "DECIMAL", "FLOAT", "TEXT", "DATE", "BOOL"]))
    if kind == "DECIMAL":
        precision = draw(st.integers(1, 38))
        scale = draw(st.integers(0, precision))
        digits = st.integers(-(10**precision) + 1, 10**precision - 1)
        values: st.SearchStrategy[Any] = digits.map(lambda n: Decimal(f"{n}e-{scale}"))
        return ColumnType("DECIMAL", precision, scale).duckdb(), values
    values = {
        "INT": INT64,
        "FLOAT": st.floats(allow_nan=False),
        "TEXT": st.text(),
        "DATE": st.dates(min_value=datetime.date(1, 1, 1), max_value=datetime.date(9999, 12, 31)),
        "BOOL": st.booleans(),
    }[kind]
    return ColumnType(kind).duckdb(), values


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
    kinds = draw(st.lists(column_and_values(), min_size=1, max_size=5))
    columns = [(f"c{i}", declared) for i, (declared, _) in enumerate(kinds)]
    null_column = draw(st.sampled_from([None, *range(len(kinds))]))
    rows = draw(
        st.lists(
            st.tuples(
                *(
                    st.none() if i == null_column else st.none() | values
                    for i, (_, values) in enumerate(kinds)
                )
            ),
            min_size=1,
            max_size=30,
        )
    )
    return columns, rows


def same(got: Any, loaded: Any) -> bool:
    return bool(got == loaded) and type(got) is type(loaded)


@settings(max_examples=examples(50, 300), deadline=None)  # a duckdb connection each
@given(tables())
def test_every_value_comes_back_as_loaded(table: tuple[list[Any], list[tuple[Any, ...]]]) -> None:
    columns, rows = table
    select = sqlglot.parse_one("SELECT * FROM t", dialect="duckdb")
    names, got = _execute(select, {"t": (columns, rows)})
    assert names == [c for c, _ in columns]
    assert len(got) == len(rows)
    for got_row, row in zip(sorted(got, key=repr), sorted(rows, key=repr), strict=True):
        assert all(same(g, v) for g, v in zip(got_row, row, strict=True)), (got_row, row)


def test_a_value_arrow_cannot_hold_is_loaded_a_row_at_a_time() -> None:
    """An integer past 64 bits in a DOUBLE column (a value duckdb casts, Arrow cannot infer):
    the rows go one at a time, and every value is duckdb's as declared."""
    columns = [("a", "DOUBLE"), ("b", "VARCHAR")]
    rows = [(2**70, "big"), (1.5, "small")]  # an int past 64 bits: not an Arrow int64
    select = sqlglot.parse_one("SELECT a, b FROM t ORDER BY b", dialect="duckdb")
    names, got = _execute(select, {"t": (columns, rows)})
    assert names == ["a", "b"]
    assert got == [(float(2**70), "big"), (1.5, "small")]
