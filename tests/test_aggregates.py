"""The registry of aggregate kinds (``cumulus.aggregates``) on its own: every kind's merge and
unmerge are inverses, and its finished value is duckdb's aggregate over the same values (NULLs
and empty input included); the kinds that roll up from values do."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggview.schema import ColumnType
from cumulus.aggregates import RULES, Kind, Rule
from cumulus.typerules import accumulator_type, avg_type, sum_type

SQL = {
    Kind.COUNT_STAR: "COUNT(*)",
    Kind.COUNT: "COUNT(x)",
    Kind.SUM: "SUM(x)",
    Kind.AVG: "AVG(x)",
    Kind.MIN: "MIN(x)",
    Kind.MAX: "MAX(x)",
    Kind.COUNT_DISTINCT: "COUNT(DISTINCT x)",
}
NUMBERS = [Kind.SUM, Kind.AVG]
EVERY = list(Kind)

INT = ColumnType.parse("INT")
DEC = ColumnType.parse("DECIMAL(10,2)")
FLOAT = ColumnType.parse("FLOAT")
TEXT = ColumnType.parse("TEXT")

# values exact in every representation (FLOATs are quarters), so sums cancel exactly
VALUES: dict[ColumnType, st.SearchStrategy[Any]] = {
    INT: st.integers(-1000, 1000),
    DEC: st.integers(-100_000, 100_000).map(lambda n: Decimal(n).scaleb(-2)),
    FLOAT: st.integers(-400, 400).map(lambda n: n / 4),
    TEXT: st.text("abcé", max_size=3),
}


def _cases() -> list[tuple[Kind, ColumnType]]:
    return [
        (kind, arg) for kind in EVERY for arg in VALUES if not (RULES[kind].numeric and arg == TEXT)
    ]


@st.composite
def _case(draw: st.DrawFn) -> tuple[Kind, ColumnType, list[Any]]:
    kind, arg = draw(st.sampled_from(_cases()))
    values = draw(st.lists(st.none() | VALUES[arg], max_size=6))
    return kind, arg, values


def _merged(rule: Rule, values: list[Any]) -> dict[str, Any]:
    state = rule.initial()
    for value in values:
        state = rule.merge(state, value)
    return state


@pytest.fixture(scope="module")
def duck() -> Any:
    con = duckdb.connect()
    yield con
    con.close()


@settings(max_examples=150, deadline=None)
@given(_case(), st.randoms(use_true_random=False))
def test_unmerge_undoes_merge(case: tuple[Kind, ColumnType, list[Any]], rng: Any) -> None:
    kind, _, values = case
    rule = RULES[kind]
    state = _merged(rule, values)
    retracted = list(values)
    rng.shuffle(retracted)
    for value in retracted:
        state = rule.unmerge(state, value)
    assert state == rule.initial()


@settings(max_examples=100, deadline=None)
@given(_case())
def test_finish_is_duckdbs_aggregate(duck: Any, case: tuple[Kind, ColumnType, list[Any]]) -> None:
    kind, arg, values = case
    rule = RULES[kind]
    result = rule.result_type(arg)
    got = rule.finish(_merged(rule, values), result)
    duck.execute(f"CREATE OR REPLACE TABLE t (x {arg.duckdb()})")
    if values:
        duck.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    want = duck.execute(f"SELECT {SQL[kind]} FROM t").fetchone()[0]
    if want is None or got is None:
        assert got is None and want is None
    elif rule.rounds(arg) or kind is Kind.AVG:  # duckdb's AVG is a DOUBLE
        assert math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-6)
    else:
        assert got == want and type(got) is type(want)


@settings(max_examples=100, deadline=None)
@given(_case(), st.integers(0, 6))
def test_values_roll_up(case: tuple[Kind, ColumnType, list[Any]], cut: int) -> None:
    """A rollup kind's value over a coarser group is its combined finer groups' values."""
    kind, arg, values = case
    rule = RULES[kind]
    if rule.rollup is None:
        return
    result = rule.result_type(arg)
    parts = [rule.finish(_merged(rule, v), result) for v in (values[:cut], values[cut:])]
    whole = rule.finish(_merged(rule, values), result)
    assert rule.combine_values(*parts) == whole


def test_result_and_accumulator_types() -> None:
    dec = ColumnType.parse
    assert [RULES[k].result_type(dec("DECIMAL(10,2)")) for k in EVERY[1:]] == [
        dec("INT"),
        dec("DECIMAL(38,2)"),
        dec("DECIMAL(38,6)"),
        dec("DECIMAL(10,2)"),
        dec("DECIMAL(10,2)"),
        dec("INT"),
    ]
    assert RULES[Kind.COUNT_STAR].result_type(None) == dec("INT")
    assert (sum_type(INT), sum_type(FLOAT)) == (INT, FLOAT)
    assert (avg_type(INT), avg_type(dec("DECIMAL(9,8)"))) == (
        dec("DECIMAL(38,6)"),
        dec("DECIMAL(38,8)"),
    )
    assert [accumulator_type(t) for t in (INT, DEC, FLOAT)] == [
        dec("DECIMAL(38,0)"),
        dec("DECIMAL(38,2)"),
        FLOAT,
    ]


def test_one_spelling() -> None:
    """Plans persist a kind's value, M3 text its name; both find the same rule."""
    assert [k.value for k in Kind] == [
        "count_star",
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "count_distinct",
    ]
    assert Kind["COUNT_DISTINCT"] is Kind("count_distinct")
    assert set(RULES) == set(Kind)
    assert {k for k in Kind if RULES[k].rollup is None} == {Kind.AVG, Kind.COUNT_DISTINCT}
