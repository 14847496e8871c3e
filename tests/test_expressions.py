"""Run-time evaluation of plan expressions against Python's and SQL's own semantics."""

from __future__ import annotations

import datetime
import decimal
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggview import errors
from cumulus.expressions import (
    compile_expr,
    compile_filters,
    compile_predicate,
    literal_value,
)

ROW: dict[str, object] = {
    "i": 7,
    "j": -2,
    "d": Decimal("0.1"),
    "e": Decimal("0.2"),
    "f": 2.5,
    "z": 0,
    "n": None,
    "t": "toys",
    "day": datetime.date(2024, 2, 29),
    "b": True,
    "big": Decimal("12345678901234567890.123456789"),
}


def get(alias: str, column: str) -> object:
    assert alias == "r"
    return ROW[column]


def c(name: str) -> dict[str, Any]:
    return {"col": ["r", name]}


def lit(value: object, type_: str) -> dict[str, Any]:
    return {"lit": value, "type": type_}


def op(symbol: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"op": symbol, "args": [a, b]}


def cmp(symbol: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"cmp": symbol, "args": [a, b]}


def value(expr: dict[str, Any]) -> object:
    return compile_expr(expr)(get)


def holds(pred: dict[str, Any]) -> bool:
    return compile_predicate(pred)(get)


# === values =====================================================================================


def test_decimal_arithmetic_is_exact() -> None:
    total = value(op("+", c("d"), c("e")))
    assert total == Decimal("0.3") and str(total) == "0.3"
    assert value(op("+", lit("0.1", "DECIMAL(38,1)"), lit("0.2", "DECIMAL(38,1)"))) == Decimal(
        "0.3"
    )
    # 49 significant digits: the default context (28 digits) would round this product.
    product = value(op("*", c("big"), c("big")))
    assert Fraction(product) == Fraction(Decimal("12345678901234567890.123456789")) ** 2
    assert product.as_tuple().exponent == -18
    assert value(op("-", c("big"), lit("0.000000001", "DECIMAL(38,9)"))) == Decimal(
        "12345678901234567890.123456788"
    )
    # (Decimal's own unary minus would round this to 28 digits.)
    negated = value({"neg": op("*", c("big"), lit(10**20, "INT"))})
    assert Fraction(negated) == -Fraction(Decimal("12345678901234567890.123456789")) * 10**20
    assert str(negated) == "-1234567890123456789012345678900000000000.000000000"


def test_scale_follows_the_operands() -> None:
    assert str(value(op("*", lit("1.50", "DECIMAL(38,2)"), lit("1.5", "DECIMAL(38,1)")))) == (
        "2.250"
    )
    assert str(value(op("+", lit("1.50", "DECIMAL(38,2)"), lit(1, "INT")))) == "2.50"


def test_int_arithmetic_stays_int() -> None:
    result = value(op("-", op("*", c("i"), c("j")), lit(1, "INT")))
    assert result == -15 and type(result) is int


def test_float_mixes_become_float() -> None:
    assert value(op("+", c("f"), c("d"))) == pytest.approx(2.6)
    assert type(value(op("*", c("d"), c("f")))) is float
    assert value(op("-", c("i"), c("f"))) == 4.5


def test_division_is_float_and_null_on_zero() -> None:
    assert value(op("/", c("i"), lit(2, "INT"))) == 3.5
    assert value(op("/", c("d"), c("e"))) == 0.5
    assert value(op("/", c("i"), c("z"))) is None
    assert value(op("/", c("i"), lit("0.00", "DECIMAL(38,2)"))) is None


@pytest.mark.parametrize("symbol", ["+", "-", "*", "/"])
def test_null_operands_give_null(symbol: str) -> None:
    assert value(op(symbol, c("n"), c("i"))) is None
    assert value(op(symbol, c("d"), c("n"))) is None
    assert value({"neg": c("n")}) is None


def test_literals_are_converted_once() -> None:
    assert literal_value(lit("2024-01-31", "DATE")) == datetime.date(2024, 1, 31)
    assert literal_value(lit("-1.50", "DECIMAL(38,2)")) == Decimal("-1.50")
    assert literal_value(lit(3, "FLOAT")) == 3.0 and type(literal_value(lit(3, "FLOAT"))) is float
    assert literal_value(lit(False, "BOOL")) is False
    assert value(lit("x", "TEXT")) == "x"
    assert value(c("t")) == "toys"


@pytest.mark.parametrize(
    "tree",
    [
        lit(None, "NULL"),
        lit("1.5", "INT"),
        lit(True, "INT"),
        lit("NaN", "DECIMAL(38,2)"),
        lit("2024-02-30", "DATE"),
        lit(1, "BOOL"),
        {"op": "%", "args": [c("i"), c("i")]},
        {"op": "+", "args": [c("i")]},
        {"col": "i"},
        {"what": 1},
        [],
    ],
)
def test_malformed_expressions_are_refused(tree: Any) -> None:
    with pytest.raises(errors.InvalidArgument):
        compile_expr(tree)


# === predicates =================================================================================


@pytest.mark.parametrize(
    ("pred", "expected"),
    [
        (cmp("=", c("i"), lit(7, "INT")), True),
        (cmp("=", c("i"), lit("7.00", "DECIMAL(38,2)")), True),
        (cmp("=", c("i"), lit(7.0, "FLOAT")), True),
        (cmp("<", c("d"), lit(0.2, "FLOAT")), True),
        (cmp(">=", c("e"), lit("0.20", "DECIMAL(38,2)")), True),
        (cmp("<>", c("j"), lit(-2, "INT")), False),
        (cmp(">", c("day"), lit("2024-02-28", "DATE")), True),
        (cmp("<=", c("t"), lit("toy", "TEXT")), False),
        (cmp("=", c("b"), lit(True, "BOOL")), True),
        (cmp("=", c("n"), c("n")), False),
        (cmp("<>", c("n"), lit(1, "INT")), False),
        ({"not": cmp("=", c("n"), lit(1, "INT"))}, False),
        ({"not": cmp("=", c("i"), lit(1, "INT"))}, True),
        ({"in": c("i"), "values": [lit(1, "INT"), lit("7.0", "DECIMAL(38,1)")]}, True),
        ({"in": c("day"), "values": [lit("2024-02-29", "DATE")]}, True),
        ({"in": c("t"), "values": [lit("games", "TEXT")]}, False),
        ({"in": c("n"), "values": [lit(1, "INT")]}, False),
        ({"in": c("i"), "values": [c("j"), c("i")]}, True),
        ({"in": c("i"), "values": [c("n"), c("i")]}, True),
        ({"in": c("i"), "values": [c("n"), c("j")]}, False),
        ({"not": {"in": c("i"), "values": [c("n"), c("j")]}}, False),  # NOT IN with NULL
        ({"not": {"in": c("i"), "values": [c("j")]}}, True),
        ({"between": c("i"), "low": lit(7, "INT"), "high": lit(7, "INT")}, True),
        ({"between": c("d"), "low": c("z"), "high": c("e")}, True),
        ({"between": c("i"), "low": c("n"), "high": lit(3, "INT")}, False),
        ({"not": {"between": c("i"), "low": c("n"), "high": lit(3, "INT")}}, True),
        ({"not": {"between": c("i"), "low": c("n"), "high": lit(10, "INT")}}, False),
        ({"between": c("n"), "low": lit(1, "INT"), "high": lit(3, "INT")}, False),
        (
            {
                "between": c("day"),
                "low": lit("2024-01-01", "DATE"),
                "high": lit("2024-12-31", "DATE"),
            },
            True,
        ),
        ({"and": [cmp("=", c("i"), lit(7, "INT")), cmp(">", c("f"), lit(2, "INT"))]}, True),
        ({"and": [cmp("=", c("i"), lit(7, "INT")), cmp(">", c("n"), lit(2, "INT"))]}, False),
        ({"not": {"and": [cmp("=", c("i"), lit(1, "INT")), cmp(">", c("n"), c("n"))]}}, True),
        ({"not": {"and": [cmp("=", c("i"), lit(7, "INT")), cmp(">", c("n"), c("n"))]}}, False),
        (cmp(">", op("/", c("i"), c("z")), lit(0, "INT")), False),
        (cmp(">", op("*", c("d"), lit(3, "INT")), lit(0.3, "FLOAT")), True),
    ],
)
def test_predicates(pred: dict[str, Any], expected: bool) -> None:
    assert holds(pred) is expected


def test_having_reads_view_columns_by_name() -> None:
    row = {"revenue": Decimal("12.50"), "_having0": 3, "category": "toys"}
    calls: list[tuple[str, str]] = []

    def lookup(alias: str, name: str) -> object:
        calls.append((alias, name))
        return row[name]

    having = compile_predicate(
        {
            "and": [
                cmp(">", {"out": "revenue"}, lit(5, "INT")),
                cmp(">=", {"out": "_having0"}, lit(2, "INT")),
                {"in": {"out": "category"}, "values": [lit("toys", "TEXT")]},
                cmp(">", op("/", {"out": "revenue"}, {"out": "_having0"}), lit(4, "INT")),
            ]
        }
    )
    assert having(lookup) is True
    assert set(calls) == {("", "revenue"), ("", "_having0"), ("", "category")}
    row["_having0"] = 1
    assert having(lookup) is False


def test_compile_filters_is_the_conjunction() -> None:
    assert compile_filters(())(get) is True
    assert compile_filters([cmp("=", c("i"), lit(7, "INT"))])(get) is True
    assert (
        compile_filters([cmp("=", c("i"), lit(7, "INT")), cmp("=", c("n"), c("n"))])(get) is False
    )


@pytest.mark.parametrize(
    "pred",
    [
        {"cmp": "==", "args": [c("i"), c("i")]},
        {"cmp": "=", "args": [c("i")]},
        {"in": c("i"), "values": []},
        {"between": c("i"), "low": c("i")},
        {"and": []},
        {"or": []},
        {"like": c("s")},
        cmp("=", {"case": [], "type": "INT"}, c("i")),
        cmp("=", {"coalesce": [c("i")]}, c("i")),  # no type
        cmp("=", {"coalesce": [], "type": "INT"}, c("i")),
        "x",
    ],
)
def test_malformed_predicates_are_refused(pred: Any) -> None:
    with pytest.raises(errors.InvalidArgument):
        compile_predicate(pred)


# === arithmetic against Python's exact arithmetic (Fraction) ==================================

_DECIMALS = st.decimals(
    min_value=Decimal("-1e20"), max_value=Decimal("1e20"), places=6, allow_nan=False
)
_LEAF_VALUES = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    _DECIMALS,
    st.none(),
)


def _leaf(draw: st.DrawFn, columns: dict[str, object]) -> tuple[dict[str, Any], object]:
    leaf_value = draw(_LEAF_VALUES)
    if leaf_value is not None and draw(st.booleans()):
        if isinstance(leaf_value, int):
            return lit(leaf_value, "INT"), leaf_value
        return lit(str(leaf_value), "DECIMAL(38,6)"), leaf_value
    name = f"c{len(columns)}"
    columns[name] = leaf_value
    return c(name), leaf_value


@st.composite
def _trees(draw: st.DrawFn, depth: int = 0) -> tuple[dict[str, Any], dict[str, object]]:
    columns: dict[str, object] = {}

    def build(level: int) -> tuple[dict[str, Any], object]:
        choice = draw(
            st.sampled_from(["leaf", "+", "-", "*", "neg"]) if level < 4 else st.just("leaf")
        )
        if choice == "leaf":
            return _leaf(draw, columns)
        if choice == "neg":
            inner, expected = build(level + 1)
            return {"neg": inner}, None if expected is None else -Fraction(expected)
        left, a = build(level + 1)
        right, b = build(level + 1)
        if a is None or b is None:
            return op(choice, left, right), None
        fa, fb = Fraction(a), Fraction(b)
        return op(choice, left, right), {"+": fa + fb, "-": fa - fb, "*": fa * fb}[choice]

    tree, expected = build(depth)
    columns["__expected__"] = expected
    return tree, columns


@settings(max_examples=300, deadline=None)
@given(_trees())
def test_arithmetic_matches_exact_python_arithmetic(case: tuple[dict[str, Any], dict]) -> None:
    tree, columns = case
    expected = columns.pop("__expected__")
    # A tight thread context must not matter: evaluation uses its own exact context.
    with decimal.localcontext(decimal.Context(prec=5)):
        result = compile_expr(tree)(lambda alias, name: columns[name])
    if expected is None:
        assert result is None
        return
    assert isinstance(result, int | Decimal) and not isinstance(result, bool)
    assert Fraction(result) == expected
    if not any(isinstance(v, Decimal) for v in columns.values()) and "DECIMAL" not in str(tree):
        assert type(result) is int
