"""The type rules every back end follows: the view compiler types plans with them, view
maintenance and the M3 read-out finish values in them, and Spark takes its sums in them.

- ``+ - *``: INT with INT is INT; DECIMAL(p1,s1) +/- DECIMAL(p2,s2) is DECIMAL(38, max(s1,s2));
  ``*`` is DECIMAL(38, s1+s2), refused above scale 38; INT with DECIMAL acts as DECIMAL(38,0);
  anything with FLOAT is FLOAT. ``/`` is always FLOAT (float division, NULL on zero).
- SUM(INT) is INT; SUM(DECIMAL(p,s)) is DECIMAL(38,s); SUM(FLOAT) is FLOAT.
- AVG(INT) is DECIMAL(38,6); AVG(DECIMAL(p,s)) is DECIMAL(38, max(s,6)) (sum/count rounded
  half-even to that scale); AVG(FLOAT) is FLOAT.
- A sum is *accumulated* exactly: DECIMAL(38, s) for INT and DECIMAL arguments (INT as scale
  0), DOUBLE for FLOAT; a bulk computation (Spark) casts to that, so it is exact or fails loudly
  where Python's unbounded numbers would not.

- CASE, COALESCE, GREATEST and LEAST: their results' (arguments') common type (NULLs aside):
  numbers widen as ``+`` does (INT with DECIMAL is DECIMAL(38, s), anything with FLOAT is
  FLOAT); other kinds must be the same (DECIMAL of any scale is one kind, widened to the
  largest). ABS keeps its argument's type; EXTRACT is INT; SUBSTRING is TEXT.

COUNT, MIN and MAX (and the rest of each kind's rules) are in ``cumulus.aggregates``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggview import errors
from aggview.schema import MAX_DECIMAL_PRECISION, ColumnType

if TYPE_CHECKING:
    from sqlglot import exp

INT = ColumnType("INT")
FLOAT = ColumnType("FLOAT")
TEXT = ColumnType("TEXT")
DATE = ColumnType("DATE")
BOOL = ColumnType("BOOL")
NUMERIC = frozenset({"INT", "DECIMAL", "FLOAT"})
MAX_SCALE = 38
AVG_MIN_SCALE = 6  # AVG keeps at least this many decimal places


def decimal_type(scale: int) -> ColumnType:
    return ColumnType("DECIMAL", MAX_DECIMAL_PRECISION, scale)


def arithmetic_type(
    op: str, left: ColumnType, right: ColumnType, node: exp.Expression
) -> ColumnType:
    """The result type of ``left op right``; ``node`` names the expression in errors."""
    if left.kind not in NUMERIC or right.kind not in NUMERIC:
        raise errors.TypeMismatch(f"arithmetic {op} on {left} and {right}: {node.sql()}")
    if op == "/" or FLOAT in (left, right):
        return FLOAT
    if left == INT and right == INT:
        return INT
    s1, s2 = left.scale or 0, right.scale or 0
    scale = s1 + s2 if op == "*" else max(s1, s2)
    if scale > MAX_SCALE:
        raise errors.TypeMismatch(
            f"{node.sql()} would need DECIMAL scale {scale}, more than {MAX_SCALE}"
        )
    return decimal_type(scale)


def common_type(types: list[ColumnType], node: exp.Expression) -> ColumnType:
    """The type of a CASE's or COALESCE's results, or GREATEST's or LEAST's arguments."""
    result = types[0]
    for other in types[1:]:
        if result.kind in NUMERIC and other.kind in NUMERIC:
            if result != other:
                result = arithmetic_type("+", result, other, node)
        elif result != other:
            raise errors.TypeMismatch(f"{node.sql()} mixes {result} with {other}")
    if result.kind == "DECIMAL":
        result = decimal_type(result.scale or 0)
    return result


def sum_type(arg: ColumnType) -> ColumnType:
    """SUM's result type."""
    if arg in (INT, FLOAT):
        return arg
    return decimal_type(arg.scale or 0)


def avg_type(arg: ColumnType) -> ColumnType:
    """AVG's result type."""
    if arg == FLOAT:
        return arg
    return decimal_type(max(arg.scale or 0, AVG_MIN_SCALE))


def accumulator_type(value: ColumnType) -> ColumnType:
    """The type a sum of ``value``s is taken in exactly (FLOAT stays FLOAT)."""
    if value == FLOAT:
        return FLOAT
    return decimal_type(value.scale or 0)
