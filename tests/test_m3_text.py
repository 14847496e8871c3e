"""M3 text: the printer's output parses back to the same program and prints the same again;
hand-written programs (the seeds') load; every malformed text is refused with its line and
column."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest

from aggview import errors
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.parser import parse_program
from cumulus.m3.printer import print_program

FIXTURES = Path(__file__).parent / "m3_fixtures"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.m3")), ids=lambda p: p.name)
def test_seed_fixtures_parse_and_round_trip(path: Path) -> None:
    program = parse_program(path.read_text())
    assert program.triggers and program.maps
    text = print_program(program)
    assert parse_program(text) == program
    assert print_program(parse_program(text)) == text


# Every literal type, every operator, names that are keywords, a lift, a view with HAVING.
RICH = """
CREATE STREAM "in"(a int NOT NULL, b decimal(8,2), c float, d text, e date, f bool);
DECLARE MAP m(decimal(38,2))[][a:int] :=
    AggSum([a], "in"(a, b, c, d, e, f) * {d IN ('x', 'it''s')} * b);
DECLARE MAP n(float)[][a:int, w:float] :=
    AggSum([a, w], "in"(a, b, c, d, e, f) * (w ^= {c * 2.5e0}) * {c IS NOT NULL});
DECLARE MAP "on"(int)[][] := AggSum([], "in"(a, b, c, d, e, f));
DECLARE VIEW v[a:int] :=
    ROWS m(decimal(38,2))[][a],
    a,
    s := SUM(m(decimal(38,2))[][a] + m(decimal(38,2))[][a], m(decimal(38,2))[][a]) : decimal(38,2),
    HIDDEN top := MAX(n(float)[][a, w]) : float
    HAVING {top > 1.5e0 AND NOT s = 0.00};
ON + "in"(a, b, c, d, e, f) {
    m[][a] += -1 * b * {a BETWEEN -3 AND 99999999999999999999.} * {e < DATE('2024-02-29')};
    n[][a, w] += {(b - -2.50) * (c + 1) / 3} * (w ^= {c * 2.5e0}) * {NOT (f = TRUE AND a <> 2)};
    "on"[][] += {-(a + 1) - (a - 1)} * {d IS NOT NULL} * 7.;
}
"""


def test_every_construct_round_trips_with_its_literal_types() -> None:
    program = parse_program(RICH)
    text = print_program(program)
    again = parse_program(text)
    assert again == program
    assert print_program(again) == text
    body = program.triggers[0].statements[0].body
    literals = re.findall(r"\{.*?\}", text.split("ON + ")[1])
    assert any("99999999999999999999." in lit for lit in literals)  # DECIMAL(38,0), not INT
    guard = body[2].pred  # type: ignore[union-attr]
    assert guard["high"]["type"] == "DECIMAL(38,0)" and guard["low"] == {"lit": -3, "type": "INT"}
    assert '"in"' in text and '"on"' in text  # keywords stay quoted
    # the program runs: the guards, lifts and values evaluate
    interp = Interpreter(program)
    interp.insert("in", (2, "1.25", 0.5, "x", "2024-01-01", False))
    assert interp.maps["m"].data == {(2,): -1 * Decimal("1.25")}
    assert interp.maps["n"].data == {(2, 1.25): (1.25 + 2.5) * 1.5 / 3}


# The scalar functions in every place a term goes, and variables named like them (quoted).
FUNCTIONS = """
CREATE STREAM r(a int NOT NULL, b decimal(8,2), d text, e date, "abs" int, "least" float);
DECLARE MAP m(decimal(38,2))[][y:int, p:text] :=
    AggSum([y, p], r(a, b, d, e, "abs", "least") * (y ^= {EXTRACT(YEAR FROM e)})
    * (p ^= {SUBSTRING(d, 2, 3)}) * {ABS(b) + CAST(GREATEST(a, b, NULL) AS decimal(38,2))});
DECLARE MAP n(float)[][] :=
    AggSum([], r(a, b, d, e, "abs", "least") * {CAST(LEAST("least", -ABS("abs")) AS float)}
    * {EXTRACT(MONTH FROM e) + EXTRACT(DAY FROM e) > 3 AND SUBSTRING(d, 1) LIKE 'a%'});
ON + r(a, b, d, e, "abs", "least") {
    m[][y, p] += (y ^= {EXTRACT(YEAR FROM e)}) * (p ^= {SUBSTRING(d, 2, 3)})
        * {ABS(b) + CAST(GREATEST(a, b, NULL) AS decimal(38,2))};
    n[][] += {CAST(LEAST("least", -ABS("abs")) AS float)}
        * {EXTRACT(MONTH FROM e) + EXTRACT(DAY FROM e) > 3 AND SUBSTRING(d, 1) LIKE 'a%'};
}
"""


def test_functions_round_trip_and_evaluate() -> None:
    program = parse_program(FUNCTIONS)
    text = print_program(program)
    assert parse_program(text) == program
    assert print_program(parse_program(text)) == text
    assert '-ABS("abs")' in text  # a variable named like a function stays quoted
    interp = Interpreter(program)
    interp.insert("r", (2, "-1.25", "abcdef", "2024-02-29", 7, 0.5))
    interp.insert("r", (3, None, "xy", "2023-01-01", None, None))
    # GREATEST(2, -1.25, NULL) is 2.00; the second row's ABS(NULL) makes its value NULL: skipped
    assert interp.maps["m"].data == {(2024, "bcd"): Decimal("3.25")}
    assert interp.maps["n"].data == {(): -7.0}  # LEAST(0.5, -7); the second row's is NULL


BAD = [
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) {\n  m[][a] += 1 ?\n}",
        4,
        15,
        "unexpected character '?'",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) {\n  m[][a] += 1\n}",
        5,
        1,
        "expected ';'",
    ),
    ("CREATE STREAM r(a int);\nON + r(a) {\n  m[][a] += 1;\n}", 3, 3, "map m is not declared"),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) { m[][a, a] += 1; }",
        3,
        13,
        "map m has 1 keys, not 2",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) { m(float)[][a] += 1; }",
        3,
        13,
        "map m holds int, not float",
    ),
    ("DECLARE MAP m(int)[][a:int];\nON + r(a) { m[][a] += 1; }", 2, 6, "undeclared relation r"),
    (
        "CREATE STREAM r(a int, b int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) { m[][a] += 1; }",
        3,
        6,
        "relation r has 2 columns, the trigger names 1",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) {\n  m[][z] += 1;\n}",
        4,
        3,
        "variable z is bound by no trigger argument",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) { m[][a] += {z + 1}; }",
        3,
        23,
        "variable z is bound by no",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) { m[][a] := 1; }",
        3,
        20,
        "(M3 statements only add)",
    ),
    ("CREATE STREAM r(a int);\nON SYSTEM READY { }", 2, 4, "ON SYSTEM READY is not supported"),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int] := AggSum([b], r(b));",
        2,
        32,
        "sums over [b], not over its keys [a]",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP n(int)[][];\nDECLARE MAP m(int)[][] :=\n"
        "  AggSum([], r(a) * n[][]);",
        4,
        21,
        "reads base relations, not maps",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][];\nDECLARE MAP m(int)[][];",
        3,
        13,
        "m is declared twice",
    ),
    ("CREATE STREAM r(a intt);", 1, 19, "unknown type 'intt'"),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\nON + r(a) { m[][a] += {a < }; }",
        3,
        28,
        "expected a value, found '}'",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][a:int];\n"
        "ON + r(a) { m[][a] += {DATE('x')}; }",
        3,
        29,
        "'x' is not an ISO-8601 date",
    ),
    (
        "DECLARE MAP m(int)[][a:int];\nDECLARE VIEW v[g:int] := ROWS m[][a], g;",
        2,
        31,
        "a view reads maps by the group keys only",
    ),
    ("SELECT 1;", 1, 1, "expected CREATE STREAM, DECLARE MAP"),
    (
        "CREATE STREAM r(a text);\nDECLARE MAP m(int)[][];\n"
        "ON + r(a) { m[][] += {SUBSTRING(a, 0)}; }",
        3,
        23,
        "SUBSTRING needs a constant start >= 1",
    ),
    (
        "CREATE STREAM r(a date);\nDECLARE MAP m(int)[][];\n"
        "ON + r(a) { m[][] += {EXTRACT(EPOCH FROM a)}; }",
        3,
        31,
        "EXTRACT takes YEAR, MONTH, DAY",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][];\n"
        "ON + r(a) { m[][] += {GREATEST(a, 1)}; }",
        3,
        23,
        "GREATEST is written in a CAST to its type",
    ),
    (
        "CREATE STREAM r(a int);\nDECLARE MAP m(int)[][];\nON + r(a) { m[][] += {ABS(a, 1)}; }",
        3,
        23,
        "ABS takes one argument",
    ),
]


@pytest.mark.parametrize(("text", "line", "column", "message"), BAD)
def test_malformed_text_names_line_and_column(
    text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as raised:
        parse_program(text)
    assert f"line {line}, column {column}:" in str(raised.value)
    assert message in str(raised.value)
